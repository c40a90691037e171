"""The Grafana dashboard: the committed JSON is what the generator builds, and it has the
panels and variables the operator guide promises. Its queries are run against a real
Prometheus in ``test_deploy_live.py``."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

from deploytools import DASHBOARD, GRAFANA, dashboard, panels, require_module

GENERATOR = GRAFANA / "dashboard.py"
REGENERATE = ".venv/bin/python deploy/grafana/dashboard.py > deploy/grafana/gpugov-dashboard.json"


def generator() -> ModuleType:
    """deploy/grafana/dashboard.py as a module (it is a script, not a package)."""
    require_module("grafana_foundation_sdk")
    spec = importlib.util.spec_from_file_location("gpugov_dashboard", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_json_is_up_to_date() -> None:
    built = generator().dashboard_json()
    assert DASHBOARD.read_text() == built, f"the dashboard JSON is stale; run: {REGENERATE}"


def test_json_round_trips_through_the_sdk_model() -> None:
    require_module("grafana_foundation_sdk")
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    model = Dashboard.from_json(dashboard())
    assert model.uid == "gpugov-node"


def test_panel_ids_are_unique_and_every_query_uses_the_datasource_variable() -> None:
    board = dashboard()
    rows = [p for p in board["panels"] if p["type"] == "row"]
    ids = [p["id"] for p in rows + panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert panel.get("description"), f"{panel['title']}: say how to read it"
        for target in panel["targets"]:
            assert target["expr"].strip()
            assert 'instance=~"$instance"' in target["expr"], (
                f"{panel['title']}/{target['refId']}: not filtered by the node variable"
            )


def test_node_and_domain_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "domain"):
        assert variables[name]["type"] == "query"
        assert variables[name]["multi"] and variables[name]["includeAll"]
        assert variables[name]["allValue"] == ".*"
    assert "$instance" in variables["domain"]["query"]


def test_rows_per_domain_and_per_gpu_with_the_promised_panels() -> None:
    board = dashboard()
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows] == [
        "Overview",
        "Domain $domain",
        "GPUs",
        "Daemon",
        "Learned model (mpc-online)",
        "Power budget",
        "Energy attribution",
    ]
    assert rows[1]["repeat"] == "domain"
    titles = " | ".join(p["title"] for p in panels(board))
    for topic in (
        r"SM clock: requested, applied, realised",
        r"Power",
        r"Energy per output token",
        r"Temperature per GPU",
        r"Engine queue",
        r"Time to first token vs SLO",
        r"Time per output token vs SLO",
        r"Controller solve time",
        r"Fallbacks",
        r"Engine scrapes",
        r"Throttling per GPU",
        r"Learned model: samples and confidence",
        r"Learned model: fit residuals",
        r"Learned model: exploration",
        r"Power: need, budget and draw",
        r"Power headroom and over-budget time",
        r"Fleet: need, budget and headroom",
        r"Energy per output token by model",
        r"Energy split: prefill, decode, idle",
        r"Estimated energy per request",
    ):
        assert re.search(topic, titles), f"no panel for {topic!r}"
    per_gpu = [p for p in panels(board) if p["title"].endswith("per GPU")]
    for panel in per_gpu:
        assert "{{gpu}}" in panel["targets"][0]["legendFormat"], panel["title"]


def test_the_panels_that_need_the_slos_are_the_four_slo_panels() -> None:
    """``gpugov check-config`` warns that the dashboard's SLO panels stay empty for a
    domain without SLOs (docs/daemon.md says four): every panel that reads an SLO series
    or an SLO recording rule says SLO in its title, and there are four."""
    from gpugov.daemon.node_check import SLO_RECORDING_RULES, SLO_SERIES

    names = (*SLO_SERIES.values(), *SLO_RECORDING_RULES)
    needing = [
        panel["title"]
        for panel in panels(dashboard())
        if any(
            name in target.get("expr", "") for target in panel.get("targets", []) for name in names
        )
    ]
    assert len(needing) == 4 and all("SLO" in title for title in needing), needing


def test_series_on_a_watt_panel_that_are_not_watts_have_their_own_unit() -> None:
    """A watt panel draws power; a series that is not a power (the share of time over
    the budget, 0-1) gets its own unit on an axis of its own, not the watt axis."""
    checked = 0
    for panel in panels(dashboard()):
        if panel.get("fieldConfig", {}).get("defaults", {}).get("unit") != "watt":
            continue
        overrides = {
            o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
            for o in panel["fieldConfig"].get("overrides", [])
            if o["matcher"]["id"] == "byFrameRefID"
        }
        for target in panel["targets"]:
            if re.search(r"_watts\b|_joules", target["expr"]):
                continue
            own = overrides.get(target["refId"], {})
            assert own.get("unit") not in (None, "watt"), (panel["title"], target["expr"])
            assert own.get("custom.axisPlacement") == "right", (panel["title"], target["expr"])
            checked += 1
    assert checked >= 1
    headroom = next(p for p in panels(dashboard()) if p["title"].startswith("Power headroom"))
    share = next(t for t in headroom["targets"] if "over_budget" in t["expr"])
    (override,) = [
        o for o in headroom["fieldConfig"]["overrides"] if o["matcher"]["options"] == share["refId"]
    ]
    assert {"id": "unit", "value": "percentunit"} in override["properties"]


def test_a_ratio_panel_shows_no_data_rather_than_infinity_on_an_idle_node() -> None:
    """A query that divides by a rate guards it with ``> 0``, as the recording rules do: an
    idle node (no tokens generated) shows no data, not +Inf or NaN."""
    for panel in panels(dashboard()):
        for target in panel["targets"]:
            expr = target["expr"]
            if " / " in expr:
                denominator = expr.rsplit(" / ", 1)[1]
                assert re.fullmatch(r"\(.*\s>\s0\)", denominator), (
                    f"{panel['title']}: {expr} divides by an unguarded {denominator}"
                )
