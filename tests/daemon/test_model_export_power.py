"""``gpugov model export`` of a model whose power fit never had a reading."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from synthetic import make_plant, poisson_requests

from gpugov.cli import main
from gpugov.controllers.online.controller import OnlineMPCController
from gpugov.daemon.model_store import PersistentOnlineModel
from gpugov.daemon.stored_model import model_path, read_stored
from gpugov.plant import chunked_prefill_scheduler, simulate
from gpugov.plant.types import ServingObservation


def test_a_model_with_no_power_learned_is_not_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node whose GPUs gave no power reading learns latencies but no power: the export
    wrote the power prior's placeholder curves as an identified profile's (exit 0)."""
    wrapper = PersistentOnlineModel(OnlineMPCController(), tmp_path, "llm", ("GPU-aaaa",))

    def no_power(observation: ServingObservation) -> float:
        return wrapper(replace(observation, power_w=None, energy_j=None, model_name="llama"))

    simulate(poisson_requests(40.0), make_plant(), chunked_prefill_scheduler, no_power, 0)
    wrapper.close()
    stored = read_stored(model_path(tmp_path, "llm"))["model"]
    assert stored["time"]["samples"] > 0 and stored["power"]["samples"] == 0
    out = tmp_path / "export"
    argv = ["model", "export", "--state-dir", str(tmp_path), "--out", str(out)]
    assert main([*argv, "--ttft-slo", "1", "--tpot-slo", "0.1"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "domain llm: the model has learned no power yet" in err[0]
    assert not out.exists()
    assert main(["model", "show", "--state-dir", str(tmp_path)]) == 0
    assert "no power learned yet" in capsys.readouterr().out
