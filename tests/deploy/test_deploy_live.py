"""Live checks: a real Prometheus scrapes the simulated daemons, then every dashboard query
and every recording rule must return data.

The module starts three processes, all bound to 127.0.0.1 on free ports and all stopped
at the end whatever happens: two ``gpugov run --simulate`` daemons (10x real time, a trace
window that ends on its own after about a minute), one with the ``mpc-online`` controller
(so the learned-model panels have data too) and one with ``power-cap`` (so the panels of
the power limit gpugov sets have data), and the distribution's
``prometheus`` with a temporary config (1 s scrape and rule evaluation, the repository's
rule files, both daemons as targets) and a temporary storage directory. Once Prometheus
holds a few seconds of samples and rule evaluations:

* ``promtool check metrics`` lints a live scrape of each daemon;
* every rule (recording and alerting) evaluates without error;
* every recording rule's series has data;
* every dashboard variable resolves, and every panel query, with the variables
  substituted as Grafana would, returns at least one finite sample over the run
  (``/api/v1/query_range``, as a panel asks).

A query that needs a series the daemon does not export yet is listed in NEEDS_DAEMON
and marked ``xfail(strict=True)``: it fails loudly once the daemon exports it, so the
entry gets removed.
"""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deploytools import (
    RULE_FILES,
    all_rules,
    dashboard,
    gpugov_executable,
    panels,
    require_tool,
)

SPEED = 10.0
SIMULATED_S = 600.0  # the daemon ends by itself after SIMULATED_S / SPEED wall seconds
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval for a 1 s scrape: >= 4 scrapes
WANT_SCRAPES = 10
WANT_EVALUATIONS = 6
START_DEADLINE_S = 30.0
DATA_DEADLINE_S = 45.0
HTTP_TIMEOUT_S = 5.0
DAEMONS = {"gpugov": "mpc-online", "gpugov-power-cap": "power-cap"}
"""The simulated daemons (log name -> controller): every panel must have data from one."""

# Series the simulated daemon does not export yet -> the daemon change that adds them.
NEEDS_DAEMON: dict[str, str] = {}


# ------------------------------------------------------------------------ collection
def _recording_rules() -> list[dict[str, Any]]:
    return [rule for _, rule in all_rules() if "record" in rule]


def _names(expr: str) -> set[str]:
    """gpugov metric and recorded-series names mentioned in a PromQL expression."""
    return set(re.findall(r"\b(?:[a-z]+:)?gpugov_[a-z0-9_]+(?::[a-z0-9_]+)?\b", expr))


def _needs_daemon(
    expr: str, rules: list[dict[str, Any]], seen: frozenset[str] = frozenset()
) -> str:
    """The NEEDS_DAEMON reason this expression depends on (through rules too), or ''."""
    for name in sorted(_names(expr) - seen):
        if name in NEEDS_DAEMON:
            return NEEDS_DAEMON[name]
        for rule in rules:
            if rule["record"] == name:
                reason = _needs_daemon(rule["expr"], rules, seen | {name})
                if reason:
                    return reason
    return ""


def _selector(rule: dict[str, Any]) -> str:
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(rule.get("labels", {}).items()))
    return f"{rule['record']}{{{labels}}}"


def _panel_targets() -> list[tuple[str, str]]:
    """(test id, expr) for every query of every panel, rows included."""
    return [
        (f"{panel['id']}:{panel['title']}/{target['refId']}", target["expr"])
        for panel in panels(dashboard())
        for target in panel["targets"]
    ]


def _params(items: list[tuple[str, str]], rules: list[dict[str, Any]]) -> list[Any]:
    params = []
    for test_id, expr in items:
        reason = _needs_daemon(expr, rules)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(expr, id=test_id, marks=marks))
    return params


RULES = _recording_rules()
PANEL_QUERIES = _params(_panel_targets(), RULES)
RECORDED = _params([(_selector(rule), _selector(rule)) for rule in RULES], RULES)


# --------------------------------------------------------------------------- fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> bytes:
    """GET ``url`` (loopback only) with a timeout."""
    assert url.startswith("http://127.0.0.1:"), url
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        return response.read()


@dataclass
class Live:
    """The running pair and how to ask them things."""

    prometheus_url: str
    instances: dict[str, str]
    """Each daemon's scrape address, by its log name (:data:`DAEMONS`)."""
    start_s: float
    logs: dict[str, Path]

    def api(self, path: str, **params: str | float) -> Any:
        """A Prometheus HTTP API call's ``data``; fails on an error status."""
        query = urllib.parse.urlencode(params)
        body = json.loads(get(f"{self.prometheus_url}/api/v1/{path}?{query}"))
        assert body["status"] == "success", body
        return body["data"]

    def query_range(self, expr: str) -> list[dict[str, Any]]:
        """A range query over the whole run, 1 s step: what a panel asks."""
        return self.api("query_range", query=expr, start=self.start_s, end=time.time(), step=1)[
            "result"
        ]

    def series_labels(self, match: str, label: str) -> list[str]:
        """Grafana's ``label_values(match, label)``."""
        params: dict[str, str | float] = {
            "match[]": match,
            "start": self.start_s,
            "end": time.time(),
        }
        series = self.api("series", **params)
        return sorted({s[label] for s in series if label in s})

    def tail(self) -> str:
        """The last lines of both processes' logs, for failure messages."""
        parts = []
        for name, path in self.logs.items():
            lines = path.read_text(errors="replace").splitlines()[-15:] if path.exists() else []
            parts.append(f"--- {name} ---\n" + "\n".join(lines))
        return "\n".join(parts)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def _wait(
    live: Live,
    what: str,
    deadline_s: float,
    ready: Callable[[], object],
    processes: Mapping[str, subprocess.Popen[bytes]],
) -> None:
    """Poll ``ready()`` until true; fail if a process died or the deadline passed."""
    end = time.monotonic() + deadline_s
    while True:
        for name, process in processes.items():
            if process.poll() is not None:
                pytest.fail(f"{name} exited ({process.returncode}) before {what}\n{live.tail()}")
        try:
            if ready():
                return
        except (OSError, ValueError, KeyError, AssertionError):
            pass
        if time.monotonic() > end:
            pytest.fail(f"no {what} within {deadline_s:.0f} s\n{live.tail()}")
        time.sleep(0.25)


def _count(live: Live, expr: str) -> float:
    result = live.api("query", query=expr)["result"]
    return max((float(r["value"][1]) for r in result), default=0.0)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The simulated daemon scraped by a real Prometheus, both stopped afterwards."""
    prometheus = require_tool("prometheus")
    require_tool("promtool")
    gpugov = gpugov_executable()
    work = tmp_path_factory.mktemp("live")
    web_port = free_port()
    instances = {name: f"127.0.0.1:{free_port()}" for name in DAEMONS}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in RULE_FILES],
        "scrape_configs": [
            {"job_name": "gpugov", "static_configs": [{"targets": sorted(instances.values())}]}
        ],
    }
    (work / "prometheus.yml").write_text(json.dumps(config, indent=1))  # JSON is YAML
    logs = {name: work / f"{name}.log" for name in DAEMONS}
    logs["prometheus"] = work / "prometheus.log"
    live = Live(
        prometheus_url=f"http://127.0.0.1:{web_port}",
        instances=instances,
        start_s=time.time(),
        logs=logs,
    )
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, controller in DAEMONS.items():
            with logs[name].open("wb") as out:
                processes[name] = subprocess.Popen(
                    [
                        str(gpugov),
                        "run",
                        "--simulate",
                        "--controller",
                        controller,
                        "--speed",
                        str(SPEED),
                        "--duration",
                        str(SIMULATED_S),
                        "--metrics-address",
                        instances[name],
                        "--log-level",
                        "warning",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
        with logs["prometheus"].open("wb") as out:
            processes["prometheus"] = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{web_port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=work,
            )

        def enough_data() -> bool:
            scrapes = _count(live, "count_over_time(gpugov_loop_ticks_total[1m])")
            evaluations = _count(
                live, "count_over_time(domain:gpugov_gpu_energy_joules:rate5m[1m])"
            )
            return scrapes >= WANT_SCRAPES and evaluations >= WANT_EVALUATIONS

        _wait(
            live,
            "ready Prometheus",
            START_DEADLINE_S,
            lambda: get(f"{live.prometheus_url}/-/ready"),
            processes,
        )
        _wait(
            live,
            f"{WANT_SCRAPES} scrapes and {WANT_EVALUATIONS} rule evaluations",
            DATA_DEADLINE_S,
            enough_data,
            processes,
        )
        yield live
    finally:
        for process in reversed(list(processes.values())):
            _stop(process)


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_promtool_check_metrics_on_a_live_scrape(live: Live, name: str) -> None:
    exposition = get(f"http://{live.instances[name]}/metrics")
    assert b"gpugov_loop_ticks_total" in exposition
    result = subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=exposition,
        capture_output=True,
        timeout=60,
    )
    output = (result.stdout + result.stderr).decode()
    assert result.returncode == 0 and not output.strip(), f"promtool check metrics:\n{output}"


def test_the_targets_are_up(live: Live) -> None:
    targets = live.api("targets")["activeTargets"]
    found = sorted((t["labels"]["job"], t["labels"]["instance"], t["health"]) for t in targets)
    assert found == sorted(("gpugov", i, "up") for i in live.instances.values()), targets


def test_every_rule_evaluates_without_error(live: Live) -> None:
    groups = live.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == len(all_rules())
    broken = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not broken, f"rules failing in a real Prometheus: {broken}"


def _has_finite_sample(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _, v in series["values"])


@pytest.mark.parametrize("selector", RECORDED)
def test_recording_rule_has_data(live: Live, selector: str) -> None:
    result = live.query_range(selector)
    assert _has_finite_sample(result), f"{selector}: no data\n{live.tail()}"


def _regex_value(values: list[str]) -> str:
    """A multi-value variable as Grafana writes it into a =~ matcher (escaped, in quotes)."""
    escaped = [re.escape(value).replace("\\", "\\\\") for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


@pytest.fixture(scope="module")
def variables(live: Live) -> dict[str, str]:
    """The dashboard's variables resolved like Grafana: label_values() through the API."""
    board = dashboard()
    resolved: dict[str, str] = {}
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        for name, value in resolved.items():
            query = query.replace(f"${name}", value)
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert match, f"${variable['name']}: unsupported variable query {query!r}"
        found = live.series_labels(match.group(1), match.group(2))
        assert found, f"${variable['name']}: {query} found nothing\n{live.tail()}"
        resolved[variable["name"]] = _regex_value(found)
    assert resolved["instance"] == _regex_value(sorted(live.instances.values()))
    return resolved


def substitute(expr: str, variables: dict[str, str]) -> str:
    """The query Grafana would send: variables and $__rate_interval replaced."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


@pytest.mark.parametrize("expr", PANEL_QUERIES)
def test_panel_query_returns_data(live: Live, variables: dict[str, str], expr: str) -> None:
    query = substitute(expr, variables)
    result = live.query_range(query)
    assert _has_finite_sample(result), f"panel query returned no data:\n{query}\n{live.tail()}"
