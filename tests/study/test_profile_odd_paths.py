"""The lines ``gpugov profile`` ends with work pasted when ``--out`` holds a space or a
quote: the shell command split the path at its space, the TOML line ended at its quote."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest

from gpugov.cli import main
from gpugov.plant import load_profile
from gpugov.study.emulate.server import EmulatorServer


def test_the_use_it_lines_quote_an_odd_path_and_the_manifest_holds_no_key(
    emulator: EmulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One sweep for both: the closing lines split an ``--out`` at its space and ended the
    TOML line at its quote; and the manifest's command was ``sys.argv`` after its second
    word, so ``profile`` went missing and ``--api-key KEY`` was written into the profile."""
    import sys

    key = "sk-test-0123456789abcdef"
    out = tmp_path / "my profiles \"x\" 'y'"
    argv = ["profile", "--engine-url", emulator.url, "--gpus", "0", "--backend", "emulated"]
    argv += ["--out", str(out), "--quiet", "--clock-list", "1980,1290", "--dwell", "0.3"]
    argv += ["--reference-batch", "16", "--reference-context", "256", "--name", "p"]
    monkeypatch.setattr(sys, "argv", ["gpugov", *argv, "--api-key", key])  # as on a shell
    assert main([*argv, "--api-key", key]) == 0
    manifest = str(out / "p.json")
    lines = capsys.readouterr().out.splitlines()
    use_it = lines[-2].removeprefix("  use it: ")
    assert shlex.split(use_it) == [
        "gpugov",
        "simulate",
        "--profile",
        manifest,
        "--controller",
        f"mpc:{manifest}",
    ]
    # The line's two keys, one per line, as a config file holds them.
    table = lines[-1].removeprefix("  or in a config: ").replace("] ", "]\n", 1)
    config = tomllib.loads(table.replace('"mpc", profile', '"mpc"\nprofile', 1))
    assert config["domains"]["controller"] == {"kind": "mpc", "profile": manifest}
    assert load_profile(manifest).profile_status == "emulated"
    assert key not in Path(manifest).read_text()
    command = load_profile(manifest).manifest["derivation"]["command"]
    words = ["gpugov", "profile", "--engine-url", emulator.url, "--gpus", "0", "--backend"]
    words += ["emulated", "--out", str(out), "--clock-list", "1980,1290", "--dwell", "0.3"]
    words += ["--name", "p", "--reference-batch", "16", "--reference-context", "256"]
    words += ["--ttft-slo", "1", "--tpot-slo", "0.05"]
    assert command == f"{shlex.join(words)} (with an API key)"


@pytest.mark.parametrize("existing", ["p.json", "p.csv"])
def test_a_profile_already_in_out_is_not_replaced_by_a_new_sweep(
    emulator: EmulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], existing: str
) -> None:
    """A new sweep overwrote a profile of its name already in ``--out`` at its end."""
    kept = tmp_path / existing
    kept.write_text("an earlier profile\n")
    argv = ["profile", "--engine-url", emulator.url, "--gpus", "0", "--backend", "emulated"]
    argv += ["--out", str(tmp_path), "--quiet", "--clock-list", "1980,1290", "--name", "p"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"gpugov: error: --out {tmp_path}: already holds {existing}, which this sweep's "
        "profile would replace; give another --name or --out, or --resume to rewrite the "
        "sweep's own profile (nothing was changed)"
    ]
    assert kept.read_text() == "an earlier profile\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == [existing]
    assert emulator.node.gpu_state[0].locked is None


@pytest.mark.parametrize("name", ["dry-run", "Dry-Run"])
def test_the_dry_runs_file_name_is_no_profile_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A profile named ``dry-run`` had its manifest replaced by the next ``--dry-run``'s
    ``dry-run.json``, which left its CSV under a record the loader refuses."""
    argv = ["profile", "--engine-url", "http://127.0.0.1:9", "--gpus", "0", "--name", name]
    assert main([*argv, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpugov: error: --name {name}: "), err
