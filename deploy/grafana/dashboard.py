"""The gpugov Grafana dashboard, built with grafana-foundation-sdk.

Regenerate the committed JSON after editing this file::

    .venv/bin/python deploy/grafana/dashboard.py > deploy/grafana/gpugov-dashboard.json

``tests/deploy/test_deploy_grafana.py`` fails when the JSON is out of date, and
``tests/deploy/test_deploy_live.py`` runs every panel query against a real Prometheus that
scraped the simulated daemon: a query that returns nothing fails the build.

Layout: an overview row for the selected nodes; one row per control domain (repeated
over ``$domain``) with requested vs realised clock, power, J/token, queue, TTFT/TPOT
against their SLOs, SLO attainment, controller solve time, fallbacks and engine scrape
health; a per-GPU row; a daemon row; the learned model; the power budget (need, budget,
headroom, the selected nodes summed, the power limit gpugov set); the energy attribution
(J per output token per model, the prefill/decode/idle split, J per request). Heavier
expressions come from the recording rules in ``deploy/prometheus/rules/``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DynamicConfigValue,
    Panel,
    Threshold,
    ThresholdsMode,
    VariableModel,
    VariableRefresh,
    VariableSort,
)

UID = "gpugov-node"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NODE = 'instance=~"$instance"'
DOMAIN = 'instance=~"$instance", domain=~"$domain"'
RATE = "$__rate_interval"
DASHED = DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})


class _Ids:
    """Stable panel ids in build order (Grafana needs them unique)."""

    def __init__(self) -> None:
        self.next_id = 0

    def __call__(self) -> int:
        self.next_id += 1
        return self.next_id


def query(expr: str, legend: str, ref_id: str) -> Dataquery:
    """A range query on the dashboard's Prometheus data source."""
    return Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).range()


def timeseries(
    ids: _Ids,
    title: str,
    description: str,
    unit: str,
    queries: Sequence[tuple[str, str]],
    *,
    width: int = 12,
    height: int = 8,
    dashed: Sequence[str] = (),
    right_axis: dict[str, str] | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
) -> Timeseries:
    """A time-series panel; ``queries`` are ``(expr, legend)``; ``dashed`` names ref ids;
    ``right_axis`` maps a ref id to the unit of its own axis on the right (a 0-1 share
    beside watts, say)."""
    panel = (
        Timeseries()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .line_width(1)
        .fill_opacity(8)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
        )
    )
    for index, (expr, legend) in enumerate(queries):
        panel = panel.with_target(query(expr, legend, chr(ord("A") + index)))
    right_axis = right_axis or {}
    for index in range(len(queries)):
        ref_id = chr(ord("A") + index)
        properties = [DASHED] if ref_id in dashed else []
        if ref_id in right_axis:
            properties += [
                DynamicConfigValue(id_val="unit", value=right_axis[ref_id]),
                DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            ]
            if right_axis[ref_id] == "percentunit":
                properties += [
                    DynamicConfigValue(id_val="min", value=0),
                    DynamicConfigValue(id_val="max", value=1),
                ]
        if properties:
            panel = panel.override_by_query(ref_id, properties)
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def stat(
    ids: _Ids,
    title: str,
    description: str,
    unit: str,
    expr: str,
    steps: Sequence[tuple[float | None, str]],
) -> Stat:
    """A single-value panel coloured by absolute thresholds ``(value, colour)``."""
    thresholds = (
        ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=value, color=color) for value, color in steps])
    )
    return (
        Stat()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(4)
        .height(4)
        .thresholds(thresholds)
        .color_mode(BigValueColorMode.BACKGROUND)
        .graph_mode(BigValueGraphMode.AREA)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .with_target(query(expr, "", "A"))
    )


def variables() -> list[Builder[VariableModel]]:
    """Data source, node (``instance``) and domain variables."""
    return [
        DatasourceVariable("datasource").label("Data source").type("prometheus"),
        QueryVariable("instance")
        .label("Node")
        .description("gpugov instances (one per node)")
        .datasource(DATASOURCE)
        .query("label_values(gpugov_build_info, instance)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
        QueryVariable("domain")
        .label("Domain")
        .description("Control domains (GPUs serving one engine)")
        .datasource(DATASOURCE)
        .query('label_values(gpugov_failsafe_active{instance=~"$instance"}, domain)')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
    ]


def overview(ids: _Ids) -> list[Stat]:
    """The top row: is it running, is it saving, is it safe."""
    green, amber, red = "green", "orange", "red"
    return [
        stat(
            ids,
            "Daemons up",
            "Scraped gpugov instances that answer.",
            "short",
            f'sum(up{{job="gpugov", {NODE}}})',
            [(None, red), (1, green)],
        ),
        stat(
            ids,
            "Domains in fail-safe",
            "Domains held at their fail-safe clock because engine data is stale.",
            "short",
            f"sum(gpugov_failsafe_active{{{DOMAIN}}})",
            [(None, green), (1, red)],
        ),
        stat(
            ids,
            "GPU power",
            "Summed board power of the selected GPUs.",
            "watt",
            f"sum(gpugov_gpu_power_watts{{{DOMAIN}}})",
            [(None, "blue")],
        ),
        stat(
            ids,
            "Energy per output token",
            "Energy of the selected domains over 5 minutes divided by their generated "
            "tokens (lower is better).",
            "joule",
            # No data, not infinity, while nothing is generated (an idle node).
            f"sum(domain:gpugov_gpu_energy_joules:rate5m{{{DOMAIN}}}) / "
            f"(sum(rate(gpugov_output_tokens_total{{{DOMAIN}}}[5m])) > 0)",
            [(None, "blue")],
        ),
        stat(
            ids,
            "Worst SLO attainment (10 min)",
            "Lowest share of the last 10 minutes with mean TTFT and TPOT within SLO.",
            "percentunit",
            f"min(domain:gpugov_slo_attainment:ratio_avg10m{{{DOMAIN}}})",
            [(None, red), (0.95, amber), (0.99, green)],
        ),
        stat(
            ids,
            "Restarts (1 h)",
            "Daemon restarts seen as control-loop counter resets.",
            "short",
            f"sum(resets(gpugov_loop_ticks_total{{{NODE}}}[1h]))",
            [(None, green), (1, amber), (3, red)],
        ),
    ]


def domain_panels(ids: _Ids) -> list[Timeseries]:
    """The repeated per-domain row."""
    return [
        timeseries(
            ids,
            "SM clock: requested, applied, realised",
            "Requested: the controller's decision after the safety wrappers. Applied: the "
            "lock written to the GPUs. Realised: the clock the GPUs ran at (below the lock "
            "when power or thermal limits throttle).",
            "hertz",
            [
                (
                    f"gpugov_requested_clock_hertz{{{DOMAIN}}}",
                    "requested {{instance}} ({{controller}})",
                ),
                (f"gpugov_applied_clock_hertz{{{DOMAIN}}}", "applied {{instance}}"),
                (f"domain:gpugov_gpu_sm_clock_hertz:avg{{{DOMAIN}}}", "realised {{instance}}"),
            ],
        ),
        timeseries(
            ids,
            "Power",
            "Instant board power of the domain's GPUs, the 5-minute average from the energy "
            "counters, and the summed enforced power limit.",
            "watt",
            [
                (f"gpugov_domain_power_watts{{{DOMAIN}}}", "power {{instance}}"),
                (
                    f"domain:gpugov_gpu_energy_joules:rate5m{{{DOMAIN}}}",
                    "5 min average {{instance}}",
                ),
                (
                    f"sum without (gpu) (gpugov_gpu_power_limit_watts{{{DOMAIN}}})",
                    "power limit {{instance}}",
                ),
            ],
            dashed=("C",),
            min_value=0,
        ),
        timeseries(
            ids,
            "Energy per output token",
            "Joules per generated token over 5 minutes: what the governor minimises while "
            "keeping latency within SLO.",
            "joule",
            [
                (
                    f"domain:gpugov_energy_per_output_token_joules:ratio_rate5m{{{DOMAIN}}}",
                    "J/token {{instance}}",
                )
            ],
            width=8,
            min_value=0,
        ),
        timeseries(
            ids,
            "Engine queue",
            "Requests waiting for their first token and requests decoding, as the engine "
            "reports them.",
            "short",
            [
                (f"gpugov_queue_waiting_requests{{{DOMAIN}}}", "waiting {{instance}}"),
                (f"gpugov_queue_running_requests{{{DOMAIN}}}", "running {{instance}}"),
            ],
            width=8,
            min_value=0,
        ),
        timeseries(
            ids,
            "SLO attainment (10 min)",
            "Share of the last 10 minutes in which both the mean TTFT and the mean TPOT of "
            "a control period were within their SLOs. Alert below 95%.",
            "percentunit",
            [(f"domain:gpugov_slo_attainment:ratio_avg10m{{{DOMAIN}}}", "attainment {{instance}}")],
            width=8,
            min_value=0,
            max_value=1,
        ),
        timeseries(
            ids,
            "Time to first token vs SLO",
            "Mean TTFT of the requests that got their first token in each control period; "
            "dashed: the SLO.",
            "s",
            [
                (f"gpugov_ttft_seconds{{{DOMAIN}}}", "TTFT {{instance}}"),
                (f"gpugov_ttft_slo_seconds{{{DOMAIN}}}", "SLO {{instance}}"),
            ],
            dashed=("B",),
            min_value=0,
        ),
        timeseries(
            ids,
            "Time per output token vs SLO",
            "Mean TPOT over each control period; dashed: the SLO.",
            "s",
            [
                (f"gpugov_tpot_seconds{{{DOMAIN}}}", "TPOT {{instance}}"),
                (f"gpugov_tpot_slo_seconds{{{DOMAIN}}}", "SLO {{instance}}"),
            ],
            dashed=("B",),
            min_value=0,
        ),
        timeseries(
            ids,
            "Controller solve time",
            "Median and 99th percentile wall time of one controller call over 5 minutes; "
            "dashed: the control period it must fit in.",
            "s",
            [
                (
                    f"domain:gpugov_controller_solve_seconds:histogram_quantile_rate5m{{{DOMAIN}}}",
                    "p{{quantile}} {{instance}} ({{controller}})",
                ),
                (f"gpugov_loop_period_seconds{{{NODE}}}", "period {{instance}}"),
            ],
            width=8,
            dashed=("B",),
            min_value=0,
        ),
        timeseries(
            ids,
            "Fallbacks and fail-safe",
            'Decisions replaced by a fallback, per second by reason ("none" when there '
            "were none), and 1 while the domain is in fail-safe.",
            "short",
            [
                (f"domain:gpugov_fallbacks:rate5m{{{DOMAIN}}}", "{{reason}} {{instance}}"),
                (f"gpugov_failsafe_active{{{DOMAIN}}}", "fail-safe {{instance}}"),
            ],
            width=8,
            min_value=0,
        ),
        timeseries(
            ids,
            "Engine scrapes",
            "Failed engine /metrics scrapes per second, and the age of the newest engine "
            "data at the last tick (fail-safe starts when it passes stale_after_s).",
            "short",
            [
                (f"domain:gpugov_engine_scrape_errors:rate5m{{{DOMAIN}}}", "errors/s {{instance}}"),
                (f"gpugov_observation_age_seconds{{{DOMAIN}}}", "data age (s) {{instance}}"),
            ],
            width=8,
            min_value=0,
        ),
    ]


def gpu_panels(ids: _Ids) -> list[Timeseries]:
    """One series per GPU of the selected domains."""
    legend = "{{instance}} {{domain}}/{{gpu}}"
    return [
        timeseries(
            ids,
            "Realised SM clock per GPU",
            "SM clock each GPU ran at.",
            "hertz",
            [(f"gpugov_gpu_sm_clock_hertz{{{DOMAIN}}}", legend)],
            width=8,
        ),
        timeseries(
            ids,
            "Power per GPU",
            "Board power; energy counter rate for comparison.",
            "watt",
            [
                (f"gpugov_gpu_power_watts{{{DOMAIN}}}", legend),
                (
                    f"rate(gpugov_gpu_energy_joules_total{{{DOMAIN}}}[{RATE}])",
                    "energy rate " + legend,
                ),
            ],
            width=8,
            min_value=0,
        ),
        timeseries(
            ids,
            "Power as a share of the limit",
            "Power over the enforced power limit: near 100% the power cap, not the lock, "
            "sets the clock.",
            "percentunit",
            [(f"gpu:gpugov_gpu_power_limit_utilization:ratio{{{DOMAIN}}}", legend)],
            width=8,
            min_value=0,
            max_value=1,
        ),
        timeseries(
            ids,
            "Temperature per GPU",
            "GPU die temperature.",
            "celsius",
            [(f"gpugov_gpu_temperature_celsius{{{DOMAIN}}}", legend)],
            width=8,
        ),
        timeseries(
            ids,
            "Utilisation per GPU",
            "NVML GPU utilisation.",
            "percentunit",
            [(f"gpugov_gpu_utilization_ratio{{{DOMAIN}}}", legend)],
            width=8,
            min_value=0,
            max_value=1,
        ),
        timeseries(
            ids,
            "Throttling per GPU",
            "1 while NVML reports the reason (power_cap, thermal, hw_slowdown); alert when "
            "throttled over 25% of 10 minutes. GPU read errors per second below.",
            "short",
            [
                (f"gpu:gpugov_gpu_throttled:bool{{{DOMAIN}}}", "{{reason}} " + legend),
                (
                    f"rate(gpugov_gpu_read_errors_total{{{DOMAIN}}}[{RATE}])",
                    "read errors/s " + legend,
                ),
            ],
            width=8,
            min_value=0,
        ),
    ]


def daemon_panels(ids: _Ids) -> list[Timeseries]:
    """The daemon's own health."""
    return [
        timeseries(
            ids,
            "Loop tick duration",
            "Wall time of the last control-loop iteration against the control period.",
            "s",
            [
                (f"gpugov_loop_tick_duration_seconds{{{NODE}}}", "tick {{instance}}"),
                (f"gpugov_loop_period_seconds{{{NODE}}}", "period {{instance}}"),
            ],
            width=8,
            dashed=("B",),
            min_value=0,
        ),
        timeseries(
            ids,
            "Loop rate and overruns",
            "Control ticks per second, ticks skipped because an iteration overran, and failed "
            "writes of the lock state file per second (should be 0: while they fail, a killed "
            "daemon's locks are found at the next start only by reading the clocks; alert "
            "GpugovLockStateWritesFailing), and ticks left out of a --record file per second "
            "(a hung or slow disk under the recording).",
            "short",
            [
                (f"rate(gpugov_loop_ticks_total{{{NODE}}}[{RATE}])", "ticks/s {{instance}}"),
                (f"rate(gpugov_loop_overruns_total{{{NODE}}}[{RATE}])", "overruns/s {{instance}}"),
                (
                    f"rate(gpugov_lock_state_write_failures_total{{{NODE}}}[{RATE}])",
                    "lock state write failures/s {{instance}}",
                ),
                (
                    f"rate(gpugov_recording_dropped_ticks_total{{{NODE}}}[{RATE}])",
                    "recording ticks dropped/s {{instance}}",
                ),
            ],
            width=8,
            min_value=0,
        ),
        timeseries(
            ids,
            "Decisions and clock writes",
            "Controller decisions and clock lock/reset writes per second (writes happen only "
            "when the decision changes).",
            "short",
            [
                (
                    f"sum without (controller) (rate(gpugov_decisions_total{{{DOMAIN}}}[{RATE}]))",
                    "decisions/s {{instance}} {{domain}}",
                ),
                (
                    f"rate(gpugov_clock_writes_total{{{DOMAIN}}}[{RATE}])",
                    "writes/s {{instance}} {{domain}}",
                ),
            ],
            width=8,
            min_value=0,
        ),
    ]


def model_panels(ids: _Ids) -> list[Timeseries]:
    """The online MPC's learned model (``mpc-online``): evidence, fit, confidence and
    exploration. Empty for domains running another controller."""
    return [
        timeseries(
            ids,
            "Learned model: samples and confidence",
            "Control windows folded into the learned latency model, and its confidence "
            "(1 minus the mean relative standard deviation of its latency predictions).",
            "short",
            [
                (f"gpugov_model_samples_total{{{DOMAIN}}}", "samples {{instance}} {{domain}}"),
                (
                    f"gpugov_model_confidence_ratio{{{DOMAIN}}} * 100",
                    "confidence % {{instance}} {{domain}}",
                ),
            ],
            width=8,
            min_value=0,
        ),
        timeseries(
            ids,
            "Learned model: fit residuals",
            "RMS innovation of the busy-time fit (seconds per window) and the energy fit "
            "(joules per window, dashed).",
            "short",
            [
                (
                    f"gpugov_model_busy_residual_seconds{{{DOMAIN}}}",
                    "busy s {{instance}} {{domain}}",
                ),
                (
                    f"gpugov_model_energy_residual_joules{{{DOMAIN}}}",
                    "energy J {{instance}} {{domain}}",
                ),
            ],
            width=8,
            dashed=("B",),
            min_value=0,
        ),
        timeseries(
            ids,
            "Learned model: exploration",
            "1 while the floor sits below the explored clocks (safe exploration), the "
            "model warms up at the top clock, the burst guard or the efficiency floor raised "
            "the clock, or the decode descent lowered it; "
            "back-offs to the maximum clock per minute.",
            "short",
            [
                (
                    f"gpugov_model_exploration_active{{{DOMAIN}}}",
                    "exploring {{instance}} {{domain}}",
                ),
                (f"gpugov_model_warmup_active{{{DOMAIN}}}", "warm-up {{instance}} {{domain}}"),
                (
                    f"gpugov_model_burst_guard_active{{{DOMAIN}}}",
                    "burst guard {{instance}} {{domain}}",
                ),
                (
                    f"gpugov_model_decode_descent_active{{{DOMAIN}}}",
                    "decode descent {{instance}} {{domain}}",
                ),
                (
                    f"gpugov_model_efficiency_floor_active{{{DOMAIN}}}",
                    "efficiency floor {{instance}} {{domain}}",
                ),
                (
                    f"60 * rate(gpugov_model_backoffs_total{{{DOMAIN}}}[{RATE}])",
                    "back-offs/min {{instance}} {{domain}}",
                ),
            ],
            width=8,
            min_value=0,
        ),
    ]


def power_budget_panels(ids: _Ids) -> list[Timeseries]:
    """Power budgets (``docs/power-budget.md``): what the domains need to hold their SLOs,
    the budgets they were given, the headroom, the selected nodes summed, and the power
    limit a cap-setting controller had gpugov write (``docs/daemon.md``)."""
    return [
        timeseries(
            ids,
            "Power: need, budget and draw",
            "The power each domain needs to hold its SLO at the current load (its controller's "
            "model, no cap applied), that need plus two standard deviations (dashed), the "
            "budget in force with the source that set it (config, file or nvml), and the "
            "power drawn.",
            "watt",
            [
                (f"gpugov_power_needed_watts{{{DOMAIN}}}", "need {{instance}} {{domain}}"),
                (
                    f"gpugov_power_needed_watts{{{DOMAIN}}}"
                    f" + 2 * gpugov_power_needed_uncertainty_watts{{{DOMAIN}}}",
                    "need + 2 sd {{instance}} {{domain}}",
                ),
                (
                    f"gpugov_power_budget_watts{{{DOMAIN}}}",
                    "budget ({{source}}) {{instance}} {{domain}}",
                ),
                (f"gpugov_domain_power_watts{{{DOMAIN}}}", "drawn {{instance}} {{domain}}"),
            ],
            width=8,
            dashed=("B",),
            min_value=0,
        ),
        timeseries(
            ids,
            "Power headroom and over-budget time",
            "Budget less need (negative: the SLO cannot be held within the budget), and the "
            "share of time over budget (dashed, right axis, 100 %: over budget all the time; "
            "the budget rule lets TTFT of queued requests slip first).",
            "watt",
            [
                (f"gpugov_power_headroom_watts{{{DOMAIN}}}", "headroom {{instance}} {{domain}}"),
                (
                    f"rate(gpugov_power_over_budget_seconds_total{{{DOMAIN}}}[{RATE}])",
                    "over budget (share) {{instance}} {{domain}}",
                ),
            ],
            width=8,
            dashed=("B",),
            right_axis={"B": "percentunit"},
        ),
        timeseries(
            ids,
            "Fleet: need, budget and headroom of the selected nodes",
            "The selected nodes summed (recording rules in "
            "gpugov-power-budget.rules.yml): the need, the need plus two standard "
            "deviations of the sum (dashed), the budgets and the headroom.",
            "watt",
            [
                (f"sum(node:gpugov_power_needed_watts:sum{{{NODE}}})", "need"),
                (
                    f"sum(node:gpugov_power_needed_watts:sum{{{NODE}}}) + 2 * sqrt("
                    f"sum(node:gpugov_power_needed_uncertainty_watts:rss{{{NODE}}} ^ 2))",
                    "need + 2 sd",
                ),
                (f"sum(node:gpugov_power_budget_watts:sum{{{NODE}}})", "budget"),
                (f"sum(node:gpugov_power_headroom_watts:sum{{{NODE}}})", "headroom"),
            ],
            width=8,
            dashed=("B",),
        ),
        timeseries(
            ids,
            "Power limit gpugov set",
            "Where the controller sets a power cap (power-cap, dps, power-profile, "
            "default-dvfs): the limit gpugov wrote, summed over the domain's GPUs (absent "
            "while they keep their own), the limit their firmware enforces (dashed), and "
            "failed limit writes and restores per second (right axis; alert "
            "GpugovPowerCapWritesFailing).",
            "watt",
            [
                (
                    f"gpugov_power_cap_applied_watts{{{DOMAIN}}}",
                    "set by gpugov {{instance}} {{domain}}",
                ),
                (
                    f"sum by (instance, domain) (gpugov_gpu_power_limit_watts{{{DOMAIN}}})",
                    "enforced {{instance}} {{domain}}",
                ),
                (
                    f"rate(gpugov_power_cap_write_failures_total{{{DOMAIN}}}[{RATE}])",
                    "failed writes {{instance}} {{domain}}/{{gpu}}",
                ),
            ],
            width=12,
            dashed=("B",),
            right_axis={"C": "ops"},
            min_value=0,
        ),
    ]


def energy_panels(ids: _Ids) -> list[Timeseries]:
    """The energy attribution per engine model (``gpugov_energy_*``, docs/energy.md)."""
    return [
        timeseries(
            ids,
            "Energy per output token by model",
            "J per output token as ML.ENERGY reports it: the prefill and decode energy "
            "(idle excluded) over the output tokens, 5-minute rate, per engine model; the "
            "daemon's own last-minute gauge dashed.",
            "joule",
            [
                (
                    "domain:gpugov_energy_attributed_per_output_token_joules:ratio_rate5m"
                    f"{{{DOMAIN}}}",
                    "{{model}} {{instance}} {{domain}}",
                ),
                (
                    f"gpugov_energy_per_output_token_joules{{{DOMAIN}}}",
                    "{{model}} last minute {{instance}} {{domain}}",
                ),
            ],
            width=8,
            dashed=("B",),
            min_value=0,
        ),
        timeseries(
            ids,
            "Energy split: prefill, decode, idle",
            "Power per phase (W): the measured GPU energy split by the daemon's estimate "
            "(the sum is the energy counter's; the split is estimated).",
            "watt",
            [
                (
                    f"domain:gpugov_energy_joules:rate5m{{{DOMAIN}}}",
                    "{{phase}} {{model}} {{instance}} {{domain}}",
                )
            ],
            width=8,
            min_value=0,
        ),
        timeseries(
            ids,
            "Estimated energy per request",
            "(prefill + decode) J per finished request over 5 minutes (J per request reads "
            "as kJ per 1,000 requests), and the median and p90 of the estimated per-request "
            "energy (engines that publish per-request token histograms).",
            "joule",
            [
                (
                    f"domain:gpugov_energy_per_request_joules:ratio_rate5m{{{DOMAIN}}}",
                    "mean {{model}} {{instance}} {{domain}}",
                ),
                (
                    "domain:gpugov_energy_request_joules:histogram_quantile_rate5m"
                    f'{{{DOMAIN}, quantile="0.5"}}',
                    "p50 {{model}} {{instance}} {{domain}}",
                ),
                (
                    "domain:gpugov_energy_request_joules:histogram_quantile_rate5m"
                    f'{{{DOMAIN}, quantile="0.9"}}',
                    "p90 {{model}} {{instance}} {{domain}}",
                ),
            ],
            width=8,
            dashed=("C",),
            min_value=0,
        ),
    ]


def build_dashboard() -> Dashboard:
    """The whole dashboard."""
    ids = _Ids()
    board = (
        Dashboard("gpugov: GPU clock governor")
        .uid(UID)
        .description("Serving-aware GPU clock governor: clocks, energy, latency and health.")
        .tags(["gpugov", "gpu", "llm-serving"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .variables(variables())
    )
    # Built in order so that ids run top to bottom: each row, then its panels.
    sections: list[tuple[Row, Sequence[Builder[Panel]]]] = [
        (Row("Overview").id(ids()), overview(ids)),
        (Row("Domain $domain").id(ids()).repeat("domain"), domain_panels(ids)),
        (Row("GPUs").id(ids()), gpu_panels(ids)),
        (Row("Daemon").id(ids()), daemon_panels(ids)),
        (Row("Learned model (mpc-online)").id(ids()), model_panels(ids)),
        (Row("Power budget").id(ids()), power_budget_panels(ids)),
        (Row("Energy attribution").id(ids()), energy_panels(ids)),
    ]
    for row, panels in sections:
        board = board.with_row(row)
        for panel in panels:
            board = board.with_panel(panel)
    return board


def dashboard_json() -> str:
    """The dashboard as the JSON committed in ``deploy/grafana/gpugov-dashboard.json``."""
    return JSONEncoder(sort_keys=True, indent=2).encode(build_dashboard().build()) + "\n"


def main() -> int:
    """Print the dashboard JSON to stdout."""
    sys.stdout.write(dashboard_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
