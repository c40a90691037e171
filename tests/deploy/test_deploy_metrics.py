"""The metric names and labels the deployment assets use are the ones the daemon exports.

The exporter's own collector (``daemon/exporter.py``) is given one domain snapshot with
every part filled in (GPU readings, engine observation, learned model, power budget,
energy attribution) and its exposition is parsed: that is the set of sample names and
their labels. Against it, offline (the live run against a real Prometheus is
``test_deploy_live.py``):

* every ``gpugov_*`` name in a rule (recording and alerting), a dashboard query or
  variable, and the docs is exported, and every ``level:gpugov_*:op`` name is recorded
  (``test_deploy_prometheus.py``);
* every label a selector matches on, a ``by``/``without``/``on``/``ignoring`` clause
  names, a panel legend prints and an alert's annotations print is one the series it
  reads can carry: their exported labels, the labels a recording rule adds, and the
  scrape target's (``job``, ``instance``, Kubernetes' ``namespace``/``pod``/...,
  ``cluster``);
* every exported metric is in a metrics table of the docs with its type and labels.

An alert that reads a misspelt name or label evaluates without error and never fires;
these checks are what catch it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from deploytools import DEPLOY, REPO, all_rules, dashboard, panels
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpugov.daemon.backend import GpuSample
from gpugov.daemon.energy import EnergySnapshot, ModelEnergyView, Rates
from gpugov.daemon.exporter import DomainSnapshot, LoopSnapshot, SnapshotCollector, SolveHistogram
from gpugov.daemon.power_budget import BudgetStatus
from gpugov.plant.types import ServingObservation

TARGET_LABELS = frozenset(
    {"job", "instance", "namespace", "pod", "container", "service", "endpoint", "cluster"}
)
"""Labels a series gets from its scrape target (and ``cluster`` from a target or an
external label), beside the ones the daemon exports."""
NOT_METRICS = {
    "gpugov_version": "a field of the scoreboard's JSON (docs/scoreboard.md)",
    "gpugov_versions": "a field of a sweep's summary.json (docs/sweep.md)",
}
METRIC_TABLES = ("daemon.md", "power-budget.md", "online.md")
NAME = re.compile(r"(?<![\w:])((?:[a-z]+:)?gpugov_[a-z0-9_]+(?::[a-z0-9_]+)?)(?![\w:])")
SELECTOR = re.compile(NAME.pattern + r"\s*\{([^}]*)\}")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LABEL_REPLACE = re.compile(r'label_replace\([^"]*"(\w+)"')


def full_snapshot() -> DomainSnapshot:
    """One domain with every optional part present, so every metric family has samples."""
    solve = SolveHistogram()
    solve.observe(0.004)
    observation = ServingObservation(
        time_s=5.0,
        step_index=5,
        arrived_requests=10,
        prefill_remaining_tokens=100.0,
        decode_active=3,
        generated_decode_tokens=10.0,
        temperature_c=61.0,
        waiting_requests=2,
        completed_requests=7,
        output_tokens_total=1234.0,
        prompt_tokens_total=5678.0,
        power_w=650.0,
        ttft_recent_s=0.25,
        tpot_recent_s=0.02,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
    )
    gpu = GpuSample(
        "0",
        power_w=350.0,
        energy_j=1000.0,
        temperature_c=61.0,
        sm_clock_mhz=1410.0,
        utilization=0.8,
        clock_event_reasons=4,
        power_limit_w=700.0,
    )
    model = {
        "samples": 120,
        "confidence": 0.75,
        "exploring": True,
        "warmed_up": False,
        "residual_rms": {"busy_s": 0.01, "energy_j": 3.0, "temperature_c": 0.1},
        "floor_mhz": 1200.0,
        "reason": "burst-guard",
        "backoffs": 2,
        "resets": 1,
        "slo_budget": {
            "target": 0.99,
            "attainment": 0.995,
            "looseness": 1.2,
            "applied_looseness": 1.0,
            "ahead": True,
        },
    }
    budget = BudgetStatus(
        budget_w=500.0,
        source="config",
        sources_w={"config": 500.0, "nvml": 700.0},
        need_w=520.0,
        need_uncertainty_w=10.0,
        over_budget=True,
        slipping="ttft",
    )
    energy = EnergySnapshot(
        models=(
            ModelEnergyView(
                model="llama",
                prefill_j=10.0,
                decode_j=20.0,
                idle_j=5.0,
                prompt_tokens=400.0,
                output_tokens=100.0,
                finished_requests=2.0,
                windows=(("fit", 3),),
                rates=Rates(0.3, 0.025, 0.2, 15.0, 60.0),
                histogram_buckets=(("10.0", 1.0), ("+Inf", 2.0)),
                histogram_sum_j=30.0,
            ),
        ),
        skipped=(("energy_counter_reset", 1),),
    )
    return DomainSnapshot(
        domain="llm",
        controller="mpc-online",
        gpus=(gpu,),
        observation=observation,
        requested_mhz=1410.0,
        applied_mhz=1410.0,
        clock_locked=True,
        failsafe=False,
        engine_age_s=0.1,
        engine_scrape_s=0.002,
        decisions_total=6,
        clock_writes_total=2,
        engine_errors_total=1,
        gpu_read_errors_total={"0": 1},
        fallbacks_total={"engine_stale": 2},
        solve_buckets=tuple(solve.buckets()),
        solve_sum_s=solve.sum_s,
        external_clock_changes_total={"0": 1},
        clock_write_failures_total={"0": 1},
        power_cap_applied_w=490.0,
        power_cap_write_failures_total={"0": 1},
        model=model,
        power_budget=budget,
        energy=energy,
        lowest_mhz=345.0,
        thermal_cap_mhz=900.0,
        thermal_capped_total=3,
    )


@cache
def exported() -> dict[str, frozenset[str]]:
    """Sample name -> its label names, from the collector's exposition of a full snapshot."""
    collector = SnapshotCollector()
    collector.publish([full_snapshot()], LoopSnapshot(ticks_total=6, tick_seconds=0.01))
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in out.items()}


@cache
def family_types() -> dict[str, str]:
    """Metric family name -> type (gauge, counter, histogram, info), as the collector says."""
    return {family.name: family.type for family in SnapshotCollector().collect()}


def family_samples(family: str) -> list[str]:
    """The sample names a family exposes."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "info": ("_info",),
    }.get(family_types()[family], ("",))
    return [family + suffix for suffix in suffixes]


def test_the_full_snapshot_exercises_every_metric_family() -> None:
    """Each family the collector yields has samples here, so the checks below see every
    metric (a new metric must be given a value in full_snapshot())."""
    for family in family_types():
        missing = [name for name in family_samples(family) if name not in exported()]
        assert not missing, f"{family}: full_snapshot() gives it no sample ({missing})"


# ------------------------------------------------------------ labels of a name
@cache
def recorded() -> dict[str, list[dict[str, Any]]]:
    """Recorded series name -> its rules (one name may have several, one per label set)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for _, rule in all_rules():
        if "record" in rule:
            out.setdefault(rule["record"], []).append(rule)
    return out


def labels_of(name: str, seen: frozenset[str] = frozenset()) -> frozenset[str]:
    """Every label the series ``name`` can carry (a recorded one: what its rules read and
    add), the target's included."""
    if name in exported():
        return exported()[name] | TARGET_LABELS
    assert name in recorded(), f"{name} is neither exported nor recorded"
    labels: set[str] = set(TARGET_LABELS)
    for rule in recorded()[name]:
        labels |= expression_labels(rule["expr"], seen | {name})
        labels |= set(rule.get("labels", {}))
    return frozenset(labels)


def expression_labels(expr: str, seen: frozenset[str] = frozenset()) -> frozenset[str]:
    """The union of the labels of every series an expression reads, and those it sets."""
    labels: set[str] = set(TARGET_LABELS) | set(LABEL_REPLACE.findall(expr))
    for name in set(NAME.findall(expr)) - seen:
        labels |= labels_of(name, seen)
    return frozenset(labels)


def matcher_labels(matchers: str) -> list[str]:
    """Label names of a selector's matchers (``a="x", b=~"y"``; a bare ``{source}`` in the
    docs names the label alone)."""
    out = []
    for matcher in matchers.split(","):
        match = re.match(r"\s*([a-zA-Z_]\w*)", matcher)
        if match:
            out.append(match.group(1))
    return out


# ----------------------------------------------------------------- what is used
def expressions() -> Iterator[tuple[str, str, list[str]]]:
    """``(where, PromQL, labels printed from its result)`` for every rule, panel query and
    dashboard variable."""
    for path, rule in all_rules():
        printed = []
        if "alert" in rule:
            for text in rule.get("annotations", {}).values():
                printed += re.findall(r"\$labels\.(\w+)", text)
        yield f"{path.name}: {rule.get('alert') or rule['record']}", rule["expr"], printed
    for panel in panels(dashboard()):
        for target in panel["targets"]:
            printed = re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", ""))
            yield f"panel {panel['title']!r}/{target['refId']}", target["expr"], printed
    board = dashboard()
    for variable in board["templating"]["list"]:
        query = variable.get("query")
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query or "")
        if match:
            yield f"variable {variable['name']}", match.group(1), [match.group(2)]


EXPRESSIONS = list(expressions())


@pytest.mark.parametrize(
    ("where", "expr", "printed"), [pytest.param(*e, id=e[0]) for e in EXPRESSIONS]
)
def test_names_and_labels_of_every_query_exist(where: str, expr: str, printed: list[str]) -> None:
    for name in NAME.findall(expr):
        if ":" not in name:
            assert name in exported(), f"{where}: {name} is not a metric the daemon exports"
    for name, matchers in SELECTOR.findall(expr):
        for label in matcher_labels(matchers):
            assert label in labels_of(name), f"{where}: {name} has no label {label!r}"
    available = expression_labels(expr)
    for clause in GROUPING.findall(expr):
        for label in matcher_labels(clause):
            assert label in available, (
                f"{where}: groups or matches on {label!r}, which no series it reads has"
            )
    for label in printed:
        assert label in available, f"{where}: prints {{{{{label}}}}}, which no series it reads has"


def test_the_checks_catch_a_misspelt_name_and_label() -> None:
    """The checks above would fail on the mistakes they are for."""
    assert "gpugov_loop_tick_total" not in exported()
    assert "gpugov_loop_ticks_total" in exported()
    assert "reason" in labels_of("gpu:gpugov_gpu_throttled:bool")
    assert "reasons" not in labels_of("gpu:gpugov_gpu_throttled:bool")
    assert "gpu" not in labels_of("gpugov_failsafe_active")
    assert "model" in expression_labels("rate(gpugov_energy_joules_total[5m])")


# ------------------------------------------------------------------------- docs
def documents() -> list[Path]:
    """The docs an operator reads (the dated measurement records are left as written)."""
    return [
        *sorted((REPO / "docs").glob("*.md")),
        REPO / "README.md",
        DEPLOY / "README.md",
        *sorted(DEPLOY.glob("*.toml")),
    ]


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_docs_name_only_exported_metrics_and_their_labels(path: Path) -> None:
    text = path.read_text()
    for match in NAME.finditer(text):
        name = match.group(1)
        if ":" in name or name in NOT_METRICS or text[match.end() : match.end() + 1] == "*":
            continue  # recorded (test_deploy_prometheus.py), not a metric, or a wildcard
        family = name in family_types() or any(
            name + suffix in exported() for suffix in ("_total", "_bucket", "_info")
        )
        assert name in exported() or family, f"{path.name}: {name} is not exported"
    for name, matchers in SELECTOR.findall(text):
        if ":" in name or name not in exported():
            continue
        for label in matcher_labels(matchers):
            assert label in exported()[name], f"{path.name}: {name} has no label {label!r}"


def metric_table_rows() -> dict[str, tuple[str, str, str]]:
    """Sample or family name -> (document, type cell, labels cell) for every row of the
    metrics tables (``| metric | type | labels | meaning |``; online.md's has no labels
    column: its metrics carry ``domain`` alone)."""
    rows: dict[str, tuple[str, str, str]] = {}
    for document in METRIC_TABLES:
        for line in (REPO / "docs" / document).read_text().splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not line.startswith("| `gpugov_") or len(cells) < 3:
                continue
            labels = cells[2] if len(cells) >= 4 else "`domain`"
            for name in re.findall(r"`(gpugov_[a-z0-9_]+)(?:\{[^}]*\})?`", cells[0]):
                rows[name] = (document, cells[1], labels)
    return rows


@pytest.mark.parametrize("family", sorted(family_types()))
def test_every_exported_metric_is_in_a_metrics_table_with_its_type_and_labels(
    family: str,
) -> None:
    rows = metric_table_rows()
    documented = [name for name in (family, *family_samples(family)) if name in rows]
    assert documented, f"{family} is in none of the metrics tables of docs/{METRIC_TABLES}"
    document, type_cell, labels_cell = rows[documented[0]]
    assert family_types()[family] in type_cell, (
        f"docs/{document}: {family} is a {family_types()[family]}, the table says {type_cell!r}"
    )
    labels = set().union(*(exported()[name] for name in family_samples(family))) - {"le"}
    listed = set(re.findall(r"`(\w+)`", labels_cell))
    if labels_cell == "none":
        listed = set()
    assert labels <= listed, (
        f"docs/{document}: {family} has labels {sorted(labels)}, the table {labels_cell!r}"
    )
    assert not {"domain", "gpu", "controller", "model"} & listed - labels, (
        f"docs/{document}: {family} has labels {sorted(labels)}, the table {labels_cell!r}"
    )
