"""The emulated ``/metrics`` page against a real vLLM V1 page: the same names, types and
label sets, so ``gpugov run`` against the emulator reads what a real engine serves."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from synthetic import make_plant

from gpugov.study.emulate.metrics import render_metrics
from gpugov.study.emulate.node import EmulatedNode

REAL_PAGE = Path(__file__).parents[1] / "daemon" / "fixtures" / "vllm_v1_real.txt"


def _label_sets(page: str) -> dict[str, set[frozenset[str]]]:
    """Each sample name's label-name sets (the ``le`` of a bucket left out)."""
    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            keys = frozenset(k for k in sample.labels if k != "le")
            out.setdefault(sample.name, set()).add(keys)
    return out


def _types(page: str) -> dict[str, str]:
    lines = [line.split() for line in page.splitlines() if line.startswith("# TYPE ")]
    return {parts[2]: parts[3] for parts in lines}


def test_every_series_a_real_vllm_serves_has_its_labels_and_type_on_the_emulated_page() -> None:
    """``vllm:cache_config_info`` carried a ``model_name`` label that vLLM's never has
    (its labels are the cache config's and ``engine``); every label set now matches."""
    real_text = REAL_PAGE.read_text()
    emulated_text = render_metrics(EmulatedNode(make_plant()), "m")
    real, emulated = _label_sets(real_text), _label_sets(emulated_text)
    shared = sorted(set(real) & set(emulated))
    assert "vllm:cache_config_info" in shared and "vllm:request_success_total" in shared
    for name in shared:
        if name == "vllm:cache_config_info":  # a subset of the cache config's fields
            assert all(e <= r for e in emulated[name] for r in real[name]), name
        else:
            assert emulated[name] == real[name], name
    emulated_types = _types(emulated_text)
    for name, kind in _types(real_text).items():
        assert emulated_types.get(name) == kind, name
