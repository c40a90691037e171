"""Loader edge cases: exact line numbers, strict types, optional sections checked early."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import gpugov.plant.profile as profile_module
import gpugov.plant.profile_files as profile_files_module
from gpugov.daemon import limits
from gpugov.plant.profile import ProfileError
from gpugov.plant.profile_files import bundled_profile_dir, load_profile

NAME = "h100-sxm-llama3-8b"


def copy_profile(tmp_path: Path) -> tuple[Path, Path]:
    """Copy the bundled H100 profile into ``tmp_path``; return (manifest, csv)."""
    source = bundled_profile_dir()
    manifest = tmp_path / f"{NAME}.json"
    shutil.copy(source / f"{NAME}.json", manifest)
    csv_name = json.loads(manifest.read_text())["csv"]
    shutil.copy(source / csv_name, tmp_path / csv_name)
    return manifest, tmp_path / csv_name


def edit_manifest(manifest: Path, **changes: object) -> None:
    data = json.loads(manifest.read_text())
    for dotted, value in changes.items():
        target = data
        *parents, leaf = dotted.split("__")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    manifest.write_text(json.dumps(data))


def test_csv_error_reports_real_line_after_blank_line(tmp_path: Path) -> None:
    manifest, csv_path = copy_profile(tmp_path)
    lines = csv_path.read_text().splitlines()
    lines.insert(2, "")  # a blank line after the first data row
    lines[5] = lines[5].replace(lines[5].split(",")[1], "oops", 1)
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError, match=rf"{csv_path.name}:6: column 'prefill_tokens_per_s'"):
        load_profile(manifest)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tpot_slo_s": True}, "tpot_slo_s must be a positive number"),
        ({"status": "measured-ish"}, "status must be one of"),
        (
            {"thermal__thermal_resistance_c_per_w": -0.1},
            "thermal_resistance_c_per_w must be positive",
        ),
        # A KeyError's repr ("decode_latency_model is invalid: KeyError('batch_fraction')").
        (
            {"decode_latency_model": {"weight_fraction": 1.0}},
            r"decode_latency_model\.batch_fraction is missing$",
        ),
        (
            {
                "decode_latency_model": {
                    "weight_fraction": -0.5,
                    "batch_fraction": 1.0,
                    "kv_fraction": 0.5,
                }
            },
            r"decode_latency_model is invalid: decode latency fractions must be >= 0",
        ),
        # Each loaded: a step of none or below, an idle clock past the table's top.
        ({"clock_step_mhz": 0}, r"clock_step_mhz must be a number above 0 .*got 0$"),
        ({"clock_step_mhz": -15}, r"clock_step_mhz must be a number above 0 .*got -15$"),
        ({"clock_step_mhz": "15"}, r"clock_step_mhz must be a number above 0"),
        (
            {"idle_clock_mhz": 99999},
            r"idle_clock_mhz must be a number above 0 and at most the highest clock .*"
            r"\(1980 MHz\), got 99999$",
        ),
        ({"decode_power_batch_model": {"k": "x", "x0": 1}}, "decode_power_batch_model is invalid"),
        # A section of the wrong type was refused in Python's words ("list indices must
        # be integers or slices, not str"), and a boolean fraction read as 1.0.
        (
            {"decode_latency_model": [0.6, 0.1, 0.3]},
            r"decode_latency_model must be an object with weight_fraction, batch_fraction, "
            r"kv_fraction, got \[0\.6, 0\.1, 0\.3\]$",
        ),
        (
            {"decode_power_batch_model": "0.5,1.2"},
            r"decode_power_batch_model must be an object with k, x0, got '0\.5,1\.2'$",
        ),
        (
            {
                "decode_latency_model": {
                    "weight_fraction": True,
                    "batch_fraction": 0.0,
                    "kv_fraction": 0.0,
                }
            },
            r"decode_latency_model is invalid: weight_fraction must be a number, got True$",
        ),
        (
            {"decode_power_batch_model": {"k": 0.5}},
            r"decode_power_batch_model\.x0 is missing$",
        ),
        (
            {"thermal__thermal_limit_c": 20.0},
            r"thermal_limit_c \(20.0\) must exceed thermal.ambient_temperature_c",
        ),
        (
            {"thermal__ambient_temperature_c": -1e300},
            r"thermal\.ambient_temperature_c must be above absolute zero \(-273\.15 C\), "
            r"got -1e\+300$",
        ),
        ({"engine": [1]}, "'engine' must be an object"),
        (
            {"engine__max_batch_size": 0},
            r"engine.max_batch_size must be an integer in \[1, 1e\+12\], got 0",
        ),
        ({"engine__kv_capacity_tokens": 1.5}, "engine.kv_capacity_tokens must be an integer"),
        ({"engine__reference_batch_size": "64"}, "engine.reference_batch_size must be"),
        # A null count passed as "not given" and ended a run in int(None)'s TypeError
        # (max_batch_size, kv_capacity_tokens) or was blamed on decode_latency_model.
        *(
            (
                {f"engine__{key}": None},
                rf"engine\.{key} must be an integer in \[1, 1e\+12\], got None$",
            )
            for key in (
                "max_batch_size",
                "kv_capacity_tokens",
                "reference_batch_size",
                "reference_context_tokens",
            )
        ),
        # A reference batch of 1e12 was taken, and every run then missed every SLO.
        (
            {"engine__reference_batch_size": 10**12},
            r"engine\.reference_batch_size \(1000000000000\) is above "
            r"engine\.max_batch_size \(256\): the CSV's decode is measured at a batch the "
            r"engine runs$",
        ),
        (
            {"engine__max_batch_size": 32},
            r"engine\.reference_batch_size \(64\) is above engine\.max_batch_size \(32\)",
        ),
        (
            {"clock_range_mhz": [1000, 1200]},
            r"clock_range_mhz \[1000, 1200\] disagrees with the clocks of .*\(345-1980 MHz\)",
        ),
    ],
)
def test_manifest_values_checked_at_load(tmp_path: Path, change: dict, message: str) -> None:
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, **change)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(manifest)
    assert manifest.name in str(info.value)


def test_a_batch_bound_below_the_default_reference_batch_needs_the_reference_stated(
    tmp_path: Path,
) -> None:
    """A manifest with ``max_batch_size`` 1 and no ``reference_batch_size`` was read at the
    default reference batch of 64, a batch the engine never runs: every clock then missed
    every SLO, the maximum clock's run included."""
    manifest, _ = copy_profile(tmp_path)
    data = json.loads(manifest.read_text())
    data["engine"].pop("reference_batch_size", None)
    data["engine"]["max_batch_size"] = 1
    manifest.write_text(json.dumps(data))
    with pytest.raises(
        ProfileError,
        match=r"engine\.reference_batch_size is not given, and its default \(64\) is above "
        r"engine\.max_batch_size \(1\): state the batch the CSV's decode is measured at$",
    ) as info:
        load_profile(manifest)
    assert manifest.name in str(info.value)
    data["engine"]["reference_batch_size"] = 1
    manifest.write_text(json.dumps(data))
    assert load_profile(manifest).decode_latency_model.reference_batch_size == 1


def test_a_reference_batch_above_the_default_batch_bound_is_refused(tmp_path: Path) -> None:
    manifest, _ = copy_profile(tmp_path)
    data = json.loads(manifest.read_text())
    del data["engine"]["max_batch_size"]
    data["engine"]["reference_batch_size"] = 257
    manifest.write_text(json.dumps(data))
    with pytest.raises(
        ProfileError,
        match=r"engine\.reference_batch_size \(257\) is above engine\.max_batch_size "
        r"\(its default\) \(256\)",
    ):
        load_profile(manifest)
    data["engine"]["reference_batch_size"] = 256
    manifest.write_text(json.dumps(data))
    assert load_profile(manifest).decode_latency_model.reference_batch_size == 256


def test_an_integral_float_count_is_a_count(tmp_path: Path) -> None:
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, engine__kv_capacity_tokens=411525.0)
    assert load_profile(manifest).manifest["engine"]["kv_capacity_tokens"] == 411525


def test_missing_profile_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ProfileError, match=r"nope\.json: profile file not found"):
        load_profile(missing)
    with pytest.raises(ProfileError, match="unknown profile 'nope'; bundled profiles: "):
        load_profile("nope")
    with pytest.raises(
        ProfileError,
        match=r"^unknown profile 'h100-sxm-llama3-8c' \(did you mean 'h100-sxm-llama3-8b'\?\); "
        "bundled profiles: ",
    ):
        load_profile("h100-sxm-llama3-8c")


def test_a_profile_file_here_loads_by_any_suffix_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``X.JSON`` (or a manifest without a suffix) in the working directory was looked up
    as a bundled name and refused as an unknown profile; ``X.CSV`` as no profile file."""
    manifest, csv_path = copy_profile(tmp_path)
    monkeypatch.chdir(tmp_path)
    upper = tmp_path / "LOUD.JSON"
    shutil.copy(manifest, upper)
    bare = tmp_path / "bare"
    shutil.copy(manifest, bare)
    assert load_profile("LOUD.JSON").name == "LOUD"
    assert load_profile("bare").name == "bare"
    shutil.copy(csv_path, tmp_path / "LOUD.CSV")
    edit_manifest(upper, csv="LOUD.CSV")
    assert load_profile("LOUD.CSV").name == "LOUD"
    (tmp_path / "folder").mkdir()  # a folder is no file: still an unknown profile
    with pytest.raises(ProfileError, match=r"^unknown profile 'folder'; bundled profiles: "):
        load_profile("folder")
    assert load_profile(NAME).name == NAME  # a bundled name still loads


def test_a_path_with_a_folder_and_no_suffix_is_a_file_or_its_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile written as a path with a folder but no suffix was looked up as a bundled
    name: ``/abs/x`` replaced the bundled folder and loaded ``/abs/x.json`` (as a config's
    relative ``dir/x``, made absolute, did), while ``dir/x`` on the command line was
    refused as an unknown profile beside the list of bundled names. Each now reads
    ``PATH.json`` where no file ``PATH`` is, and a missing one is named as a missing file."""
    manifest, _ = copy_profile(tmp_path)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    stem = manifest.with_suffix("")
    for given in (str(stem), f"../{stem.name}"):
        assert load_profile(given).name == NAME
    for given in (f"{tmp_path}/nope", "../nope", "no-such-folder/x"):
        with pytest.raises(ProfileError) as caught:
            load_profile(given)
        assert str(caught.value) == f"{given}: profile file not found"
    assert load_profile(manifest).name == NAME  # the manifest named as it is still loads
    assert load_profile(NAME).name == NAME  # and a bundled name


def test_a_linked_manifest_reads_the_csv_beside_the_file_it_leads_to(tmp_path: Path) -> None:
    """A manifest linked from another folder (``current.json`` -> a versioned profile) was
    refused as "csv ... not found beside it": the CSV was looked for beside the link only.
    A CSV beside the link is still the one read."""
    manifest, csv_path = copy_profile(tmp_path)
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    link = elsewhere / "current.json"
    link.symlink_to(manifest)
    profile = load_profile(link)
    assert profile.name == "current"
    assert profile_files_module.profile_files(link) == (link, csv_path)
    beside = elsewhere / csv_path.name
    shutil.copy(csv_path, beside)
    beside.write_text(beside.read_text().replace("345,", "345.0,", 1))  # same numbers
    assert profile_files_module.profile_files(link) == (link, beside)
    assert load_profile(link).profile_csv_sha256 != profile.profile_csv_sha256


@pytest.mark.parametrize(("suffix", "message"), [("", "unknown profile 'yyy"), (".json", "yyy")])
def test_a_name_too_long_for_a_file_is_one_short_line(suffix: str, message: str) -> None:
    """Looking up a 60,000-character name raised "OSError: File name too long" past the
    loader, and the line quoted the whole name."""
    with pytest.raises(ProfileError) as caught:
        load_profile("y" * 60_000 + suffix)
    assert str(caught.value).startswith(message) and len(str(caught.value)) < 600


def test_profiles_compare_by_identity() -> None:
    first = load_profile(NAME)
    second = load_profile(NAME)
    assert first == first
    assert first != second  # no elementwise array comparison, no exception
    assert len({first, second}) == 2  # hashable, so usable as a cache key


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"ttft_slo_s": 10**400}, "ttft_slo_s"),
        ({"thermal__thermal_limit_c": 10**400}, "thermal"),
        ({"tensor_parallel": 10**30}, "tensor_parallel size must be an integer in"),
        # An object without "size" was read as TP 1.
        ({"tensor_parallel": {"sizes": 4}}, r"tensor_parallel size .* got \{'sizes': 4\}"),
        ({"decode_latency_model__weight_fraction": float("nan")}, "decode_latency_model"),
        ({"engine__reference_batch_size": 1e300}, r"engine\.reference_batch_size must be an"),
        ({"decode_power_batch_model": {"k": float("nan"), "x0": 1.0}}, "decode_power_batch"),
        (
            {
                "clock_profile_selection": {
                    "realized_clock_median_mhz_by_requested": {"345": 10**400}
                }
            },
            "realized_clock_median_mhz_by_requested",
        ),
        # Each of these was taken and failed the run later: a numpy TypeError traceback at
        # load (the batch), an OverflowError in the controller mid-run (the SLO), numpy
        # RuntimeWarnings on stderr (the power limit).
        ({"engine__max_batch_size": 10**30}, r"engine\.max_batch_size must be an integer in"),
        ({"engine__kv_capacity_tokens": 10**13}, r"engine\.kv_capacity_tokens must be an"),
        ({"ttft_slo_s": 1e308}, r"ttft_slo_s must be at most 3\.1536e\+08 s, got 1e\+308$"),
        ({"tpot_slo_s": 1e300}, r"tpot_slo_s must be at most 3\.1536e\+08 s"),
        ({"ttft_slo_per_prompt_token_s": 1e300}, r"ttft_slo_per_prompt_token_s must be"),
        ({"power_limit_w": 1e200}, r"power_limit_w must be at most 1e\+06 W, got 1e\+200$"),
    ],
    ids=[
        "huge-slo",
        "huge-thermal",
        "huge-tp",
        "tp-without-size",
        "nan-fraction",
        "huge-batch",
        "nan-k",
        "huge-clock",
        "huge-max-batch",
        "huge-kv-capacity",
        "huge-ttft-slo",
        "huge-tpot-slo",
        "huge-slo-allowance",
        "huge-power-limit",
    ],
)
def test_numbers_no_board_has_are_refused_in_one_line(
    tmp_path: Path, changes: dict[str, object], named: str
) -> None:
    # Each passed the loader (or raised a TypeError or OverflowError from it) and
    # crashed a command later, mid-run.
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, **changes)
    with pytest.raises(ProfileError, match=named) as caught:
        load_profile(manifest)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("medians", "named"),
    [
        ({"1980": 99999}, r"\['1980'\]: its realised clock must be positive and at most"),
        ({"345": -1}, r"\['345'\]: its realised clock must be"),
        ({"1980": 0}, r"top clock \(1980 MHz\), got 0.0"),
        ({"1980": float("nan")}, r"its realised clock must be .* got nan"),
        ({"5000": 1500}, r"\['5000'\]: the requested clock must be within .*\(345-1980 MHz\)"),
        ({"nan": 1500}, "the requested clock must be"),
        ({"1980": "1500"}, r"\['1980'\] is not numeric: '1500'"),
        ({"1980": True}, "is not numeric: True"),
    ],
    ids=["huge", "negative", "zero", "nan", "key-outside", "key-nan", "text", "bool"],
)
def test_a_realised_clock_outside_the_profiles_clocks_is_refused(
    tmp_path: Path, medians: dict[str, object], named: str
) -> None:
    """99999 ran and was reported as the realised clock; -1 and NaN were dropped silently."""
    manifest, _ = copy_profile(tmp_path)
    field = {"realized_clock_median_mhz_by_requested": medians}
    edit_manifest(manifest, clock_profile_selection=field)
    with pytest.raises(ProfileError, match=named) as caught:
        load_profile(manifest)
    message = str(caught.value)
    assert message.startswith(f"{manifest}: ") and "\n" not in message
    assert "clock_profile_selection.realized_clock_median_mhz_by_requested" in message


@pytest.mark.parametrize(
    ("selection", "named"),
    [
        ([1], r"clock_profile_selection must be an object, got \[1\]"),
        ("fast", "clock_profile_selection must be an object, got 'fast'"),
        (
            {"realized_clock_median_mhz_by_requested": [1980, 1500]},
            "realized_clock_median_mhz_by_requested must be an object of requested clock",
        ),
    ],
    ids=["list", "text", "medians-list"],
)
def test_a_clock_selection_of_the_wrong_type_is_refused(
    tmp_path: Path, selection: object, named: str
) -> None:
    """A list or a string there was ignored without a word: a profile's realised clocks
    silently became its requested ones."""
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, clock_profile_selection=selection)
    with pytest.raises(ProfileError, match=named) as caught:
        load_profile(manifest)
    message = str(caught.value)
    assert message.startswith(f"{manifest}: ") and "\n" not in message


def test_realised_clocks_up_to_the_top_and_below_the_lowest_are_kept(tmp_path: Path) -> None:
    """A GPU locked at the lowest profiled clock may run below it (its range goes lower)."""
    manifest, _ = copy_profile(tmp_path)
    field = {"realized_clock_median_mhz_by_requested": {"1980": 1980, "345": 300.0}}
    edit_manifest(manifest, clock_profile_selection=field)
    profile = load_profile(manifest)
    assert profile.realized_clock(1980.0) == 1980.0 and profile.realized_clock(345.0) == 300.0


def test_a_number_past_the_digit_limit_is_a_decode_error(tmp_path: Path) -> None:
    manifest, _ = copy_profile(tmp_path)
    text = manifest.read_text().replace('"ttft_slo_s": 1.0', '"ttft_slo_s": 1' + "0" * 5000, 1)
    manifest.write_text(text)
    with pytest.raises(ProfileError, match="more digits than can be read"):
        load_profile(manifest)


def _edit_row(csv_path: Path, row: int, edit: object) -> None:
    """Replace data row ``row`` (0 is the first after the header) by ``edit(cells)``."""
    lines = csv_path.read_text().splitlines()
    lines[row + 1] = ",".join(edit(lines[row + 1].split(",")))  # type: ignore[operator]
    csv_path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        # "5,000" written with a thousands separator: every later value moved one column
        # right, and the row loaded with the numbers in the wrong columns.
        (lambda cells: [cells[0], "5", "000", *cells[2:]], r":3: the row has more cells .* 6"),
        (lambda cells: [*cells, "1.0"], r":3: the row has more cells than the header's 6"),
        (lambda cells: cells[:4], r":3: the row has fewer cells than the header's 6$"),
    ],
    ids=["thousands-separator", "extra-cell", "short-row"],
)
def test_a_row_whose_cells_do_not_match_the_header_is_refused(
    tmp_path: Path, edit: object, named: str
) -> None:
    manifest, csv_path = copy_profile(tmp_path)
    _edit_row(csv_path, 1, edit)
    with pytest.raises(ProfileError, match=named) as caught:
        load_profile(manifest)
    assert str(caught.value).startswith(f"{csv_path}:3: ") and "\n" not in str(caught.value)


def test_a_trailing_empty_cell_is_read(tmp_path: Path) -> None:
    """A spreadsheet's trailing comma adds nothing to read: the row loads as it is."""
    manifest, csv_path = copy_profile(tmp_path)
    before = load_profile(manifest)
    _edit_row(csv_path, 1, lambda cells: [*cells, ""])
    assert load_profile(manifest).prefill_tokens_per_s[1] == before.prefill_tokens_per_s[1]


@pytest.mark.parametrize("blank", [",,,,,", "   ", ", , ,", ",,,,,,,"])
def test_rows_of_blank_cells_are_no_rows(tmp_path: Path, blank: str) -> None:
    """A spreadsheet saves trailing blank rows as ",,,,,": they were refused as a row
    with a non-number (or too few cells), where an empty line is skipped. A line number
    after one still names the line in the file."""
    manifest, csv_path = copy_profile(tmp_path)
    before = load_profile(manifest)
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join([*lines[:3], blank, *lines[3:], blank, blank]) + "\n")
    after = load_profile(manifest)
    for column in profile_module.CSV_COLUMNS:
        assert list(getattr(after, column)) == list(getattr(before, column))
    lines.insert(3, blank)
    lines[5] = lines[5].replace(lines[5].split(",")[1], "oops", 1)
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError, match=rf"{csv_path.name}:6: column 'prefill_tokens_per_s'"):
        load_profile(manifest)
    header = lines[0]
    csv_path.write_text("\n".join([header, blank, blank]) + "\n")
    with pytest.raises(ProfileError, match="at least two clocks, has no clock rows"):
        load_profile(manifest)


def test_a_csv_named_whose_manifest_reads_another_csv_is_refused(tmp_path: Path) -> None:
    """``--profile a.csv`` beside an ``a.json`` whose ``csv`` is another file ran on the
    other file's table, and said nothing of it."""
    manifest, csv_path = copy_profile(tmp_path)
    other = tmp_path / "other.csv"
    shutil.copy(csv_path, other)
    edit_manifest(manifest, csv="other.csv")
    named = tmp_path / f"{NAME}.csv"
    with pytest.raises(ProfileError) as caught:
        load_profile(named)
    message = str(caught.value)
    assert message.startswith(f"{named}: its manifest {NAME}.json reads csv 'other.csv'")
    assert "\n" not in message
    assert load_profile(manifest).name == NAME  # the manifest itself still loads
    edit_manifest(manifest, csv=f"./{NAME}.csv")  # another spelling of the same file
    assert load_profile(named).name == NAME


@pytest.mark.parametrize("content", ["", "\n", "\ufeff\r\n  \r\n"])
@pytest.mark.parametrize("which", ["manifest", "csv"])
def test_an_empty_file_is_named_empty(tmp_path: Path, which: str, content: str) -> None:
    """An empty CSV was refused as missing all six columns with a header of '', an empty
    manifest as JSON "Expecting value": neither said the file was empty."""
    manifest, csv_path = copy_profile(tmp_path)
    path = manifest if which == "manifest" else csv_path
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    message = str(caught.value)
    assert message.startswith(f"{path}: the ") and " is empty; " in message
    assert "\n" not in message


def test_decode_fractions_rounded_to_a_few_decimals_load(tmp_path: Path) -> None:
    """Fractions written to four decimals (summing to 0.9999) were refused as not summing
    to 1; within 1e-3 they are rescaled, and further off still refused."""
    manifest, _ = copy_profile(tmp_path)
    shares = {"weight_fraction": 0.6247, "batch_fraction": 0.0468, "kv_fraction": 0.3284}
    edit_manifest(manifest, decode_latency_model=shares)
    model = load_profile(manifest).decode_latency_model
    fractions = (model.weight_fraction, model.batch_fraction, model.kv_fraction)
    assert sum(fractions) == pytest.approx(1.0, abs=1e-12)
    assert model.weight_fraction == pytest.approx(0.6247 / 0.9999)
    edit_manifest(manifest, decode_latency_model={**shares, "kv_fraction": 0.3184})
    with pytest.raises(ProfileError, match=r"decode_latency_model is invalid: .* sum to 1"):
        load_profile(manifest)


@pytest.mark.parametrize("separator", [";", "\t"])
def test_a_csv_separated_otherwise_says_so(tmp_path: Path, separator: str) -> None:
    """A table saved with ';' (a spreadsheet's list separator in many locales) or tabs was
    refused as missing every column, with no word of the separator."""
    manifest, csv_path = copy_profile(tmp_path)
    csv_path.write_text(csv_path.read_text().replace(",", separator))
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    message = str(caught.value)
    assert message.startswith(f"{csv_path}: missing column(s)")
    assert message.endswith(f"(cells separated by {separator!r}? a profile CSV uses commas)")


def test_a_header_spaced_like_its_cells_loads(tmp_path: Path) -> None:
    """``clock_mhz, prefill_tokens_per_s, ...`` (a space after each comma, as in its cells)
    was refused as missing every column but the first, while the spaced cells were read."""
    manifest, csv_path = copy_profile(tmp_path)
    before = load_profile(manifest)
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join(", ".join(line.split(",")) for line in lines) + "\n")
    after = load_profile(manifest)
    for column in profile_module.CSV_COLUMNS:
        assert list(getattr(after, column)) == list(getattr(before, column))
    # Stripped, a name given twice is still one name given twice.
    csv_path.write_text(
        "\n".join([lines[0] + ", clock_mhz ", *(line + ",1" for line in lines[1:])]) + "\n"
    )
    with pytest.raises(ProfileError, match=r"column\(s\) \['clock_mhz'\] appear more than once"):
        load_profile(manifest)


@pytest.mark.parametrize(
    ("csv", "message"),
    [
        (None, "csv must be the file name of the profile's CSV, got None"),
        ("", "csv must be the file name of the profile's CSV, got ''"),
        (["a.csv"], "csv must be the file name of the profile's CSV, got ['a.csv']"),
        (".", "csv '.' is a directory, not the profile's CSV"),
    ],
    ids=["null", "empty", "list", "folder"],
)
def test_a_csv_key_that_names_no_file_is_refused_naming_the_key(
    tmp_path: Path, csv: object, message: str
) -> None:
    """null was looked for as a file named "None"; "" and "." read the manifest's folder,
    refused as "DIR: is a directory, not a profile file" with no word of the key."""
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, csv=csv)
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    assert str(caught.value) == f"{manifest}: {message}"


def test_a_csv_that_is_no_profile_table_is_refused_in_a_short_line(tmp_path: Path) -> None:
    """The header was quoted whole: a manifest named as its own CSV (or a 16 MiB first
    line) made an error line as long as that line."""
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, csv=manifest.name)
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    message = str(caught.value)
    assert message.startswith(f"{manifest}: missing column(s) ['clock_mhz', ")
    assert message.endswith("...'")  # the header, cut at 80 characters
    assert len(message) < len(str(manifest)) + 300 and "\n" not in message


@pytest.mark.parametrize(
    "key",
    [
        "status",
        "ttft_slo_s",
        "power_limit_w",
        "clock_range_mhz",
        "ttft_slo_per_prompt_token_s",
        "tensor_parallel",
        "thermal__thermal_limit_c",
        "clock_profile_selection__realized_clock_median_mhz_by_requested",
    ],
)
def test_a_long_bad_value_is_quoted_cut_short(tmp_path: Path, key: str) -> None:
    """Each refusal quoted the bad value whole: a 100 KB string made a 100 KB line."""
    manifest, _ = copy_profile(tmp_path)
    long_text = "x" * 100_000
    value: object = long_text
    if key.endswith("by_requested"):
        value = {long_text: 1000}  # a key that is no clock
        edit_manifest(manifest, clock_profile_selection={})
    edit_manifest(manifest, **{key: value})
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    message = str(caught.value)
    assert key.split("__")[-1] in message and "xxxx" in message
    assert len(message) < len(str(manifest)) + 300 and "\n" not in message


def test_a_column_named_twice_in_the_header_is_refused(tmp_path: Path) -> None:
    """The second clock column's values were read as the clocks, and the refusal blamed
    their order ("1.0 after 1.0") rather than the header."""
    manifest, csv_path = copy_profile(tmp_path)
    lines = csv_path.read_text().splitlines()
    lines = [lines[0] + ",clock_mhz", *(line + ",1.0" for line in lines[1:])]
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError, match=r"column\(s\) \['clock_mhz'\] appear more than once"):
        load_profile(manifest)


@pytest.mark.parametrize("clock", ["345.5", "345.25", "1e-06"])
def test_a_clock_that_is_not_whole_mhz_is_refused(tmp_path: Path, clock: str) -> None:
    """GPUs lock whole MHz: the simulated and emulated GPUs rounded a fractional clock, so
    a profile whose top clock was 1980.5 MHz was never locked at its top (the lock at
    1980 realised the row below), and clocks 0.25 MHz apart became duplicates."""
    manifest, csv_path = copy_profile(tmp_path)
    _edit_row(csv_path, 0, lambda cells: [clock, *cells[1:]])
    edit_manifest(manifest, clock_range_mhz=None)
    with pytest.raises(ProfileError, match=r":2: column 'clock_mhz' must be a whole number"):
        load_profile(manifest)


@pytest.mark.parametrize(
    ("model", "named"),
    [
        # sigmoid(k (log2 B - x0)) underflows to 0 at every batch: 0/0 made each decode
        # power NaN, and `gpugov simulate --out` crashed writing its JSON.
        ({"k": 100.0, "x0": 1e300}, r"gives no finite power factor at batches 1-256"),
        ({"k": 1.0, "x0": 2000.0}, r"gives no finite power factor"),
        # Decode power falling with the batch: at batch 1 about 20,000x the reference
        # power; a 30 s run of a generated 700 W board used 2.9 MJ.
        ({"k": -2.0, "x0": 1.0}, r"k must be in \[0, 100\]"),
    ],
    ids=["x0-huge", "x0-large", "k-negative"],
)
def test_a_batch_power_model_without_a_finite_positive_factor_is_refused(
    tmp_path: Path, model: dict[str, float], named: str
) -> None:
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, decode_power_batch_model=model)
    with pytest.raises(ProfileError, match=named) as caught:
        load_profile(manifest)
    assert manifest.name in str(caught.value) and "\n" not in str(caught.value)


def test_a_flat_batch_power_model_is_kept(tmp_path: Path) -> None:
    """k = 0: decode power independent of the batch, a valid (if crude) model."""
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, decode_power_batch_model={"k": 0.0, "x0": 1.0})
    model = load_profile(manifest).decode_power_batch_model
    assert model is not None and model.factor(1, 64) == 1.0


def test_a_decode_power_the_batch_model_takes_below_zero_is_refused(tmp_path: Path) -> None:
    """A decode power below the idle power at a clock: the batch model's
    ``idle + (decode - idle) * factor`` went negative at the largest batch, and a loaded
    run crashed mid-way on a negative power reading (a traceback)."""
    manifest, csv_path = copy_profile(tmp_path)
    lines = csv_path.read_text().splitlines()
    cells = lines[1].split(",")  # 345 MHz: idle 108.01 W
    cells[4] = "1"
    lines[1] = ",".join(cells)
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    assert str(caught.value) == (
        f"{manifest}: decode_power_batch_model takes the decode power of {csv_path.name} at "
        "345 MHz to -4.769 W at batch 256: its decode_power_w (1 W) is below its "
        "idle_power_w (108.01 W)"
    )
    edit_manifest(manifest, decode_power_batch_model=None)  # no batch model: the table's
    assert load_profile(manifest).decode_power_w[0] == 1.0


def test_a_power_limit_at_or_below_the_idle_power_is_refused(tmp_path: Path) -> None:
    """A limit no clock's idle power is under ran: a generated board idling at 60 W under a
    50 W limit was simulated over the cap for the whole run."""
    manifest, _ = copy_profile(tmp_path)
    idle = float(load_profile(manifest).idle_power_w.min())
    edit_manifest(manifest, power_limit_w=idle)
    with pytest.raises(ProfileError, match=r"power_limit_w \(.* W\) is not above the idle"):
        load_profile(manifest)
    edit_manifest(manifest, power_limit_w=idle + 1.0)
    assert load_profile(manifest).idle_power_w.min() == idle


def test_an_idle_clock_below_the_tables_lowest_loads(tmp_path: Path) -> None:
    """A GPU idles below the lowest clock a profile tabulates (the A100 profiles: 210 MHz
    against a table from 510): that is no error."""
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, idle_clock_mhz=210)
    assert load_profile(manifest).manifest["idle_clock_mhz"] == 210


@pytest.mark.parametrize(
    ("power", "refused"), [("1e300", True), ("7001", True), ("7000", False), ("735", False)]
)
def test_a_csv_power_far_above_the_power_limit_is_refused(
    tmp_path: Path, power: str, refused: bool
) -> None:
    """A decode power of 1e300 W against a 700 W limit loaded. A row a little over the
    limit is a measured board before its power brake (kept); ten times it is none."""
    manifest, csv_path = copy_profile(tmp_path)
    _edit_row(csv_path, 5, lambda cells: [*cells[:4], power, cells[5]])
    if not refused:
        assert float(load_profile(manifest).decode_power_w[5]) == float(power)
        return
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    assert str(caught.value) == (
        f"{csv_path}:7: column 'decode_power_w' is '{power}' W, over 10 times the "
        "manifest's power_limit_w (700 W); no board draws that"
    )


def test_a_csv_whose_powers_are_in_kilowatts_is_refused(tmp_path: Path) -> None:
    """A table written in kW (0.6 for 600 W) against a 700 W limit loaded: every energy
    figure came out a thousandth of the board's, and no power budget ever bound. A board
    serving at under 1 % of its power limit is none; a table at 10 % of it still loads."""
    manifest, csv_path = copy_profile(tmp_path)
    lines = csv_path.read_text().splitlines()
    scaled = [lines[0]]
    for line in lines[1:]:
        cells = line.split(",")
        scaled.append(",".join([*cells[:3], *(f"{float(c) / 1000:.6g}" for c in cells[3:])]))
    csv_path.write_text("\n".join(scaled) + "\n")
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    peak = max(float(c) for line in scaled[1:] for c in line.split(",")[3:5])
    assert str(caught.value) == (
        f"{csv_path}: its highest prefill or decode power is {peak:g} W, under 1% of the "
        "manifest's power_limit_w (700 W); no board serves at that (a table in kW? the power "
        "columns are in W)"
    )
    tenth = [lines[0]]
    for line in lines[1:]:
        cells = line.split(",")
        tenth.append(",".join([*cells[:3], *(f"{float(c) / 10:.6g}" for c in cells[3:])]))
    csv_path.write_text("\n".join(tenth) + "\n")
    assert load_profile(manifest).decode_power_w.max() < 70.0


def test_a_clock_above_what_a_node_can_lock_is_refused(tmp_path: Path) -> None:
    """The daemon's flags and config take clocks up to ``MAX_CLOCK_MHZ``; a profile
    listed 1e9 MHz and loaded."""
    manifest, csv_path = copy_profile(tmp_path)
    lines = csv_path.read_text().splitlines()
    last = lines[-1].split(",")
    lines.append(",".join(["1000000000", *last[1:]]))
    csv_path.write_text("\n".join(lines) + "\n")
    edit_manifest(manifest, clock_range_mhz=None)
    with pytest.raises(ProfileError, match=r"'clock_mhz' must be at most 100000 MHz"):
        load_profile(manifest)
    assert profile_files_module.MAX_CLOCK_MHZ == limits.MAX_CLOCK_MHZ  # one limit everywhere


def test_the_profiles_slo_and_power_bounds_are_the_flags() -> None:
    """A profile's SLOs and power limit take what the flags and the config take."""
    assert profile_files_module.MAX_SLO_S == limits.MAX_SECONDS
    assert profile_files_module.MAX_POWER_LIMIT_W == limits.MAX_POWER_W


@pytest.mark.parametrize("column", ["prefill_tokens_per_s", "decode_tokens_per_s"])
@pytest.mark.parametrize("value", ["1e-300", "5e-324", "0.5"])
def test_a_rate_no_board_serves_at_is_refused_naming_the_line(
    tmp_path: Path, column: str, value: str
) -> None:
    # A decode rate of 1e-300 overflowed the simulator mid-run (a traceback); a prefill
    # rate of 5e-324 made every power NaN and the run failed writing its JSON.
    manifest, csv_path = copy_profile(tmp_path)
    lines = csv_path.read_text().splitlines()
    index = lines[0].split(",").index(column)
    cells = lines[3].split(",")
    cells[index] = value
    lines[3] = ",".join(cells)
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    assert str(caught.value) == (
        f"{csv_path}:4: column {column!r} must be at least 1 token/s, got {value!r}; "
        "no board serves a model slower (a unit slip or a corrupt cell?)"
    )


def test_an_idle_power_at_or_over_the_thermal_limit_is_refused(tmp_path: Path) -> None:
    """A TP8 domain whose manifest kept one GPU's thermal resistance (0.078 C/W) against
    its summed powers idled at a steady 97 C under an 87 C limit: every run, `max`
    included, sat at the lowest clock with no word said. Refused, naming the fields."""
    manifest, csv_path = copy_profile(tmp_path)
    lines = csv_path.read_text().splitlines()
    scaled = [lines[0]]
    for line in lines[1:]:
        clock, *rest = line.split(",")
        scaled.append(",".join([clock, *(f"{float(cell) * 8:g}" for cell in rest)]))
    csv_path.write_text("\n".join(scaled) + "\n")
    edit_manifest(manifest, power_limit_w=5600.0, tensor_parallel={"size": 8})
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    message = str(caught.value)
    assert message.startswith(f"{manifest}: thermal.thermal_resistance_c_per_w (0.078 C/W)")
    assert "thermal.thermal_limit_c (87 C)" in message and "\n" not in message
    # The domain's resistance (one GPU's over eight) loads, and its idle sits under 87 C.
    edit_manifest(manifest, thermal__thermal_resistance_c_per_w=0.078 / 8)
    profile = load_profile(manifest)
    assert 30.0 + 0.078 / 8 * float(profile.idle_power_w.min()) < 87.0


@pytest.mark.parametrize(
    "thermal",
    [{"thermal_limit_c": 30.5}, {"thermal_resistance_c_per_w": 1e300}],
    ids=["limit-just-over-ambient", "resistance-huge"],
)
def test_a_thermal_section_no_board_idles_under_is_refused(
    tmp_path: Path, thermal: dict[str, float]
) -> None:
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, **{f"thermal__{key}": value for key, value in thermal.items()})
    with pytest.raises(ProfileError, match=r"not below thermal\.thermal_limit_c") as caught:
        load_profile(manifest)
    assert manifest.name in str(caught.value)


@pytest.mark.parametrize("empty", [None, {}])
def test_an_empty_engine_model_section_is_no_section(tmp_path: Path, empty: object) -> None:
    """``null`` or ``{}`` keeps the defaults: a pure aggregate decode rate, power
    independent of the batch."""
    manifest, _ = copy_profile(tmp_path)
    edit_manifest(manifest, decode_latency_model=empty, decode_power_batch_model=empty)
    profile = load_profile(manifest)
    assert profile.decode_latency_model.weight_fraction == 1.0
    assert profile.decode_power_batch_model is None


@pytest.mark.parametrize(
    "cell", ["3_60", "٣٦٠", "３６０"], ids=["underscore", "arabic", "fullwidth"]
)
def test_a_cell_that_is_no_plain_number_is_refused(tmp_path: Path, cell: str) -> None:
    """float() reads digit separators and other scripts' digits: a typo '3_60' loaded as
    360 MHz. A profile's cell is ASCII without separators, as a trace's is."""
    manifest, csv_path = copy_profile(tmp_path)
    _edit_row(csv_path, 1, lambda cells: [cell, *cells[1:]])
    with pytest.raises(ProfileError) as caught:
        load_profile(manifest)
    assert str(caught.value) == f"{csv_path}:3: column 'clock_mhz' is not a number: {cell!r}"


@pytest.mark.parametrize("name", ["synthetic:tp2", "synthetic"])
def test_a_synthetic_name_where_none_is_generated_says_so(name: str) -> None:
    """experiments, fleet, emulate and a controller's profile read profiles only: a
    synthetic name was refused as an unknown profile beside the bundled names."""
    with pytest.raises(ProfileError) as caught:
        load_profile(name)
    said = str(caught.value)
    assert said.startswith(f"{name!r}: a synthetic profile is generated only by gpugov ")
    assert "python -m gpugov.plant.synthetic_profiles --out DIR SHAPE" in said
