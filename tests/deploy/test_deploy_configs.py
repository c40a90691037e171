"""The example configs in deploy/ load with gpugov's own loader and mean what their comments
say: ``gpugov.example.toml`` shows every key it sets with its default unless the key (or
its table) is marked "example", the commands in the comments parse with gpugov's CLI, and
the emulator examples set the SLOs of the profile they tell ``gpugov emulate`` to serve.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from deploytools import DEPLOY, check_config

from gpugov.cli import build_parser
from gpugov.daemon.config import GpugovConfig, load_config, parse_config

EXAMPLE = DEPLOY / "gpugov.example.toml"
CONFIGS = sorted(DEPLOY.glob("*.toml"))
PROFILES = Path(__file__).resolve().parents[2] / "profiles"
ASSIGNMENT = re.compile(r"^([A-Za-z_][\w-]*)\s*=\s*[^#]*?(?:#(.*))?$")
TABLE = re.compile(r"^\[\[?([\w.]+)\]\]?\s*(?:#(.*))?$")


def section(config: GpugovConfig, table: str) -> Any:
    """The config object a TOML table fills (``domains`` is the first domain)."""
    node: Any = config
    for part in table.split("."):
        node = getattr(node, part)
        if isinstance(node, tuple):
            node = node[0]
    return node


def shown_defaults() -> list[tuple[int, str, str]]:
    """``(line number, table, key)`` of every uncommented key of the example that is not
    marked "example" on its line or its table's line."""
    out = []
    table, table_is_example = "", False
    for number, raw in enumerate(EXAMPLE.read_text().splitlines(), 1):
        line = raw.strip()
        if header := TABLE.match(line):
            table, table_is_example = header.group(1), "example" in (header.group(2) or "")
        elif (
            (assignment := ASSIGNMENT.match(line))
            and not table_is_example
            and "example" not in (assignment.group(2) or "")
        ):
            out.append((number, table, assignment.group(1)))
    return out


def test_the_example_shows_defaults_unless_it_says_example() -> None:
    example = load_config(EXAMPLE)
    # The defaults of a node like the example's: one domain of its controller (mpc-online,
    # whose period is the daemon's default when it runs alone).
    kind = example.domains[0].controller.kind
    defaults = parse_config(
        {"domains": [{"name": "llm", "gpus": [0], "controller": {"kind": kind}}]}, "<defaults>"
    )
    checked = shown_defaults()
    assert len(checked) >= 15, "the parser of the example found too few keys"
    for number, table, key in checked:
        shown = getattr(section(example, table), key)
        default = getattr(section(defaults, table), key)
        assert shown == default, (
            f"gpugov.example.toml:{number}: [{table}] {key} = {shown!r} is not marked "
            f"'example', but the default is {default!r}"
        )


def commented_commands(path: Path) -> list[list[str]]:
    """The ``gpugov ...`` command lines in a file's comments, as argv (without ``&``): the
    comment lines indented like a shell session (``#   gpugov run ...``), not prose."""
    out = []
    for line in path.read_text().splitlines():
        match = re.match(r"#\s{2,}gpugov\s+(.+?)\s*&?\s*$", line.strip())
        if match:
            out.append(shlex.split(match.group(1)))
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_example_loads_and_the_commands_in_its_comments_parse(path: Path) -> None:
    config = load_config(path)
    assert config.domains
    for argv in commented_commands(path):
        build_parser().parse_args(argv)  # SystemExit on a flag gpugov does not have


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_example_passes_check_config_without_a_warning(path: Path) -> None:
    """``gpugov check-config FILE --offline --watchdog-sec 30`` (deploy/README.md's step,
    with the units' ``WatchdogSec=``) exits 0 and prints no warning line."""
    code, lines = check_config(path, "--watchdog-sec", "30")
    assert (code, lines) == (0, []), f"{path.name}: check-config exits {code}: {lines}"


@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if p.name.startswith("emulated")], ids=lambda p: p.name
)
def test_the_emulator_examples_set_the_slos_of_the_profile_they_emulate(path: Path) -> None:
    """Their comments start ``gpugov emulate --profile NAME`` and say its SLOs are the
    domains' (the SLO rules, the alert and the dashboard judge against them)."""
    config = load_config(path)
    assert config.daemon.backend == "emulated"
    (emulate,) = [argv for argv in commented_commands(path) if argv[0] == "emulate"]
    profile = build_parser().parse_args(emulate).profile
    manifest = json.loads((PROFILES / f"{profile}.json").read_text())
    for domain in config.domains:
        assert (domain.ttft_slo_s, domain.tpot_slo_s) == (
            manifest["ttft_slo_s"],
            manifest["tpot_slo_s"],
        ), f"{path.name}: domain {domain.name} does not set {profile}'s SLOs"


@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if p.name.startswith("emulated")], ids=lambda p: p.name
)
def test_the_emulator_examples_govern_the_gpus_it_serves_one_group_a_domain(path: Path) -> None:
    """Against the node the commented ``gpugov emulate`` serves (started here on loopback,
    its GPUs and replicas read from ``GET /gpu``): every GPU a domain lists is one it
    serves; every domain's engine page answers; a domain scraping one replica's own page
    (``/replica/<r>/metrics``) lists that replica's GPUs; and a domain whose ``mpc`` plans
    on that profile lists one whole tensor-parallel group, as many GPUs as the profile's
    domain (else the daemon warns its rates are another domain's)."""
    import urllib.parse
    import urllib.request

    from gpugov.daemon.controller_config import MPCControllerConfig
    from gpugov.plant import ServingPlant, load_profile
    from gpugov.study.emulate.disaggregated import DisaggregatedNode
    from gpugov.study.emulate.node import EmulatedNode
    from gpugov.study.emulate.server import EmulatorServer

    config = load_config(path)
    (emulate,) = [argv for argv in commented_commands(path) if argv[0] == "emulate"]
    args = build_parser().parse_args(emulate)
    plant = ServingPlant.from_profile(load_profile(args.profile))
    node: EmulatedNode
    if args.layout is not None:
        node = DisaggregatedNode(
            plant, prefill_replicas=args.layout[0], decode_replicas=args.layout[1]
        )
    else:
        node = EmulatedNode(plant, gpus=args.gpus)
    server = EmulatorServer(node, "127.0.0.1", 0)
    server.start()
    try:
        with urllib.request.urlopen(f"{server.url}/gpu", timeout=5) as response:
            served = json.loads(response.read())
        groups = [set(replica["gpus"]) for replica in served["replicas"]]
        pages = {replica["metrics"]: set(replica["gpus"]) for replica in served["replicas"]}
        for domain in config.domains:
            where = f"{path.name}: domain {domain.name}"
            assert max(domain.gpus) < served["count"], f"{where} GPUs {domain.gpus}"
            page = urllib.parse.urlsplit(domain.engine.url).path
            with urllib.request.urlopen(f"{server.url}{page}", timeout=5) as response:
                assert response.status == 200, f"{where}: {page}"
            if page in pages:
                assert set(domain.gpus) == pages[page], (
                    f"{where} GPUs {domain.gpus} scrape {page}, the page of GPUs "
                    f"{sorted(pages[page])}"
                )
            controller = domain.controller
            if isinstance(controller, MPCControllerConfig) and controller.profile == args.profile:
                assert len(domain.gpus) == served["tensor_parallel"], (
                    f"{where} has {len(domain.gpus)} GPU(s), its mpc profile {args.profile} "
                    f"a domain of {served['tensor_parallel']}"
                )
                assert set(domain.gpus) in groups, f"{where} GPUs {domain.gpus} span groups"
    finally:
        server.close()
