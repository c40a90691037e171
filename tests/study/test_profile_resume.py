"""``gpugov profile --resume`` continues only the sweep it interrupted: the same GPUs
and the same served model, as well as the same settings and engine URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import make_profile

from gpugov.daemon.cli_support import UsageError
from gpugov.daemon.emulated import EmulatedBackend
from gpugov.plant import ServingPlant
from gpugov.study.emulate.node import EmulatedNode
from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.profiler.sweep import Sweep, SweepSettings


def test_a_resume_on_other_gpus_or_another_model_is_refused(tmp_path: Path) -> None:
    """``--resume`` compared the settings and the engine's URL only: a sweep resumed on
    another GPU (a mistyped ``--gpus``) or after the engine changed model fitted both into
    one profile."""
    server = EmulatorServer(
        EmulatedNode(ServingPlant.from_profile(make_profile()), gpus=2), "127.0.0.1", 0
    )
    server.start()
    backends = [EmulatedBackend(index, emulator=server.url) for index in (0, 1)]
    settings = SweepSettings(clocks_mhz=(1980, 1290), dwell_s=0.3)
    state = tmp_path / "sweep-state.jsonl"
    header = {"kind": "header", "settings": settings.header(), "url": server.url}
    try:
        for gpus, model, refused in (
            (["1"], "gpugov-emulated", "--resume with --gpus 0, the interrupted sweep's was 1"),
            (["0"], "other", "--resume with served model 'gpugov-emulated', the interrupted"),
        ):
            state.write_text(json.dumps({**header, "gpus": gpus, "model": model}) + "\n")
            sweep = Sweep([backends[0]], server.url, "gpugov-emulated", settings, tmp_path)
            with pytest.raises(UsageError, match=refused):
                sweep.run(resume=True)
            assert server.node.gpu_state[0].locked is None
    finally:
        for backend in backends:
            backend.close()
        server.close()


def _clock_record(clock_mhz: object) -> dict[str, object]:
    return {
        "kind": "clock",
        "clock_mhz": clock_mhz,
        "realized_clock_mhz": 1980,
        "idle_power_w": 100.0,
        "prefill": {"tokens_per_s": 10_000.0, "power_w": 600.0, "r_squared": 0.999},
        "decode": [
            {"batch": 1, "iteration_s": 0.01, "context_tokens": 100, "power_w": 300.0},
            {"batch": 2, "iteration_s": 0.01, "context_tokens": 100, "power_w": None},
        ],
        "thermal": [[0.0, 300.0, 40.0], [0.25, 310.0, 40.5]],
    }


def _damaged(path: str, value: object) -> dict[str, object]:
    """A clock record with the field at ``path`` (dotted, a list index as a number) set to
    ``value``, or removed where ``value`` is :data:`REMOVED`."""
    record = json.loads(json.dumps(_clock_record(1980)))
    *parents, last = path.split(".")
    target: object = record
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]  # type: ignore[index]
    assert isinstance(target, dict)
    if value is REMOVED:
        del target[last]
    else:
        target[last] = value
    return record


REMOVED = object()


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        ("prefill.power_w", "x", ":2: prefill.power_w is 'x', not a positive number"),
        ("prefill.power_w", REMOVED, ":2: prefill.power_w is None, not a positive number"),
        ("prefill.r_squared", REMOVED, ":2: prefill.r_squared is None, not a number"),
        ("decode.0.power_w", REMOVED, ":2: decode[0].power_w is missing"),
        ("decode.0.power_w", "x", ":2: decode[0].power_w is 'x', not a power in W or null"),
        ("thermal", None, ":2: thermal is None, not a list of [time_s, power_w, temperature_c]"),
        ("thermal", [[0.0, 300.0]], ":2: thermal[0] is [0.0, 300.0], not [time_s, power_w, "),
        ("thermal", REMOVED, ":2: thermal is None, not a list of [time_s, power_w, "),
    ],
)
def test_a_state_record_with_a_field_the_profile_needs_damaged_is_refused_by_line(
    tmp_path: Path, path: str, value: object, said: str
) -> None:
    """A record whose prefill power, prefill fit, a decode point's power or thermal
    readings were damaged passed the check, and ``--resume`` measured the clocks left
    and then wrote the profile in a traceback (KeyError, ValueError, TypeError)."""
    from gpugov.study.profiler.sweep import read_state

    state = tmp_path / "sweep-state.jsonl"
    rows = [{"kind": "header"}, _damaged(path, value)]
    state.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(UsageError) as refused:
        read_state(state)
    assert str(refused.value).startswith(f"{state}{said}"), refused.value
    assert "; remove the line" in str(refused.value)


def test_a_state_record_as_the_sweep_writes_it_is_read() -> None:
    """The damaged-record cases start from a record the check passes."""
    from gpugov.study.profiler.sweep import _record_problem

    assert _record_problem(_clock_record(1980)) is None


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ([_clock_record(None)], ":2: clock_mhz is None, not a clock in MHz"),
        ([_clock_record(1980), _clock_record(1980)], ":3: 1980 MHz is recorded again (line 2)"),
    ],
    ids=["no-clock", "twice"],
)
def test_a_state_record_without_a_clock_or_repeated_is_refused_by_line(
    tmp_path: Path, rows: list[dict[str, object]], said: str
) -> None:
    """A clock record without a clock failed the profile's write with a TypeError after
    the sweep; one recorded twice was fitted twice (a one-clock range, polyfit's
    RankWarning on the terminal)."""
    from gpugov.study.profiler.sweep import read_state

    state = tmp_path / "sweep-state.jsonl"
    state.write_text("".join(json.dumps(row) + "\n" for row in [{"kind": "header"}, *rows]))
    with pytest.raises(UsageError) as refused:
        read_state(state)
    assert str(refused.value).startswith(f"{state}{said}; remove the line"), refused.value
