"""What ``gpugov check-config`` checks beyond the file: this node, read-only.

``gpugov run`` refuses to start for a config's sake in a few places: a GPU index or UUID
that does not exist (or an emulator that does not answer), GPUs without a supported clock
in common, ``safety.floor_mhz`` above the GPUs' top supported clock, a controller that
cannot be built (an open-loop plan file, an ``mpc`` profile, an ``mpc-online`` prior
profile), a record file that cannot be written, a metrics address it cannot bind.
:func:`check_node` looks for the same problems without applying anything: the GPUs are
opened through a dry-run backend (reads only; no lock, no reset), the lock state and any
learned-model file are neither read nor written, and each controller is built (which
loads its files) but never asked for a decision.

Without an NVIDIA driver here (or ``nvidia-smi`` for that backend) the GPU part is
skipped and said so in one line; ``--offline`` skips everything that depends on this
machine (GPUs, emulator, record file, metrics address). The controllers are built either
way.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from gpugov.daemon.addresses import parse_address
from gpugov.daemon.backend import GpuBackend, power_limit_backend
from gpugov.daemon.cli_outputs import check_not_an_input, check_output_file, controller_files
from gpugov.daemon.cli_support import UsageError, check_metrics_address
from gpugov.daemon.config import (
    ONLINE_PERIOD_S,
    DomainConfig,
    GpugovConfig,
    controller_state_dir,
)
from gpugov.daemon.controller_config import POWER_LIMIT_BACKENDS, OnlineMPCControllerConfig
from gpugov.daemon.errors import (
    NO_DRIVER_CODES,
    ConfigError,
    ControllerError,
    GpuCallHung,
    GpugovError,
    GpuUnavailable,
)
from gpugov.daemon.files import STATE_DIR_ENV, resolve_state_dir
from gpugov.daemon.lockstate import HOLD_FILE, STATE_FILE, model_hold_path, newer_record
from gpugov.daemon.node_support import GPU_CALL_DEADLINE_S, bounded_gpu_call, write_path_status

T = TypeVar("T")

log = logging.getLogger(__name__)

SLO_SERIES = {"ttft_slo_s": "gpugov_ttft_slo_seconds", "tpot_slo_s": "gpugov_tpot_slo_seconds"}
"""The domain's SLO keys and the exporter's series that carry them (absent when unset)."""
SLO_RECORDING_RULES = ("domain:gpugov_slo_met:bool", "domain:gpugov_slo_attainment:ratio_avg10m")
"""The recording rules in ``deploy/prometheus/rules`` that need the role's SLO series."""
SLO_ALERTS = ("GpugovSLOAttainmentLow",)
"""The alerts in ``deploy/prometheus/rules`` that need the role's SLO series."""
ROLE_SLOS = {"prefill": ("ttft_slo_s",), "decode": ("tpot_slo_s",)}
"""The SLOs the rules judge a disaggregated pool on (its role's latency); a colocated
domain, or one whose role the engine's labels decide, is judged on both."""


@dataclass
class NodeReport:
    """What the checks found: lines to print, warning lines, and the problems ``run``
    would refuse to start with (each an exception carrying one line)."""

    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[Exception] = field(default_factory=list)
    hung: bool = False
    """A GPU call hung past its deadline: no GPU is closed (NVML is not shut down under
    the hung call; the process's exit releases what is open)."""


def slo_warnings(config: GpugovConfig) -> list[str]:
    """One line per domain that sets no SLO its role is judged on (TTFT and TPOT for a
    colocated domain, TTFT for a prefill pool, TPOT for a decode pool): the exporter then
    publishes no SLO series for it, so the SLO rules, the SLO alert and the dashboard's
    SLO panels never have data for that domain (the daemon itself runs fine)."""
    lines = []
    for domain in config.domains:
        needed = ROLE_SLOS.get(str(domain.role), tuple(SLO_SERIES))
        missing = [key for key in needed if getattr(domain, key) is None]
        if not missing:
            continue
        series = " and ".join(SLO_SERIES[key] for key in missing)
        lines.append(
            f"domain {domain.name!r} sets no {' or '.join(missing)}: {series} "
            f"{'is' if len(missing) == 1 else 'are'} not exported, so the recording rules "
            f"{' and '.join(SLO_RECORDING_RULES)}, the alert {', '.join(SLO_ALERTS)} and the "
            f"dashboard's SLO panels have no data for it; set {' and '.join(missing)}"
        )
    return lines


TARGET_KINDS = ("mpc", "mpc-online", "external")
"""The controller kinds an SLO target reaches: ``mpc`` and ``mpc-online`` spend its
budget, an outside controller is given it (``ControllerContext.slo_target``)."""


def ignored_target_warnings(config: GpugovConfig) -> list[str]:
    """One line per domain whose ``slo_target`` its controller ignores (every kind but
    :data:`TARGET_KINDS`): nothing measures, spends or exports it, where the config's
    summary names it as if it were pursued."""
    return [
        f"domain {domain.name!r} sets slo_target, which its {domain.controller.kind} "
        "controller ignores: only mpc and mpc-online spend an SLO target's budget (and "
        "measure and export its attainment); choose one of them, or drop slo_target"
        for domain in config.domains
        if domain.slo_target is not None and domain.controller.kind not in TARGET_KINDS
    ]


def ignored_backend_warnings(config: GpugovConfig) -> list[str]:
    """A line for each backend's setting the configured backend ignores (``emulator`` or
    a ``[daemon.zeusd]`` table under another ``backend``): the backend line forgotten,
    the node drives other GPUs than meant, where ``--emulator`` with another backend is
    refused."""
    d = config.daemon
    lines = []
    if d.emulator is not None and d.backend != "emulated":
        lines.append(
            f'daemon.emulator is set, but backend = "{d.backend}" ignores it (only backend = '
            '"emulated" uses it); set backend = "emulated", or drop emulator'
        )
    if d.zeusd is not None and d.backend != "zeusd":
        lines.append(
            f'[daemon.zeusd] is set, but backend = "{d.backend}" ignores it (only backend = '
            '"zeusd" uses it); set backend = "zeusd", or drop the table'
        )
    return lines


def pool_warnings(config: GpugovConfig, pools: Mapping[int, str]) -> list[str]:
    """One line per domain that does not match a disaggregated emulator's pools
    (``pools``: each GPU's pool role, :func:`daemon.emulated.emulated_gpu_roles`): over
    both pools, set no role (its vLLM pages state none, so it would be governed as
    colocated), or set the other pool's role (it would follow the wrong objective)."""
    lines = []
    for domain in config.domains:
        roles = sorted(
            {pools[gpu] for gpu in domain.gpus if isinstance(gpu, int) and gpu in pools},
            reverse=True,
        )
        if not roles:
            continue
        noun = "GPU" if len(domain.gpus) == 1 else "GPUs"
        gpus = f"{noun} {', '.join(str(gpu) for gpu in domain.gpus)}"
        if len(roles) > 1:
            lines.append(
                f"domain {domain.name!r}: {gpus} span the emulator's {' and '.join(roles)} "
                "pools, which one domain locks to one clock; give each pool its own domain"
            )
        elif domain.role is None:
            verb = "is" if len(domain.gpus) == 1 else "are"
            lines.append(
                f"domain {domain.name!r}: {gpus} {verb} the emulator's {roles[0]} pool, but "
                "the domain sets no role (the emulator's vLLM pages state none): it is "
                f"governed as colocated; set role = {roles[0]!r}"
            )
        elif domain.role != roles[0]:
            verb = "is" if len(domain.gpus) == 1 else "are"
            lines.append(
                f"domain {domain.name!r}: role = {domain.role!r} in the config, but {gpus} "
                f"{verb} the emulator's {roles[0]} pool"
            )
    return lines


def tensor_group_warnings(config: GpugovConfig, replicas: Sequence[Sequence[int]]) -> list[str]:
    """One line per engine replica of an emulator (``replicas``: each one's GPUs,
    :func:`daemon.emulated.emulated_replicas`) whose tensor-parallel group of GPUs is
    split over domains, or governed in part: a group runs at its slowest GPU's clock, so
    its domains' controllers fight over one clock and none sees the group it sets."""
    owner = {gpu: domain.name for domain in config.domains for gpu in domain.gpus}
    lines = []
    for index, gpus in enumerate(replicas):
        domains = {owner.get(gpu) for gpu in gpus}
        if len(gpus) < 2 or len(domains) == 1:
            continue  # one GPU, or one domain (or none) for the whole group
        where = ", ".join(
            f"GPU {gpu} in " + (f"domain {owner[gpu]!r}" if gpu in owner else "no domain")
            for gpu in gpus
        )
        lines.append(
            f"the emulator's replica {index} (GPUs {', '.join(map(str, gpus))}: one "
            f"tensor-parallel group) is split: {where}; the group runs at its slowest GPU's "
            "clock, so give one domain all of its GPUs"
        )
    return lines


def period_warnings(config: GpugovConfig) -> list[str]:
    """One line per ``mpc-online`` domain whose loop runs slower than the controller's
    recommended period (:data:`ONLINE_PERIOD_S`, its default alone and in every simulated
    command): set slower, or left at 1 s beside another controller, it explores, learns
    and reacts that many times slower in wall time."""
    period = config.daemon.period_s
    if period <= ONLINE_PERIOD_S:
        return []
    setting = "daemon.period_s"
    if "period_s" not in config.daemon.model_fields_set:
        setting += (
            " unset, kept at 1 s by another domain's controller or a timing the file sets; "
            f"set period_s = {ONLINE_PERIOD_S:g} to be told which"
        )
    return [
        f"domain {domain.name!r} runs mpc-online every {period:g} s ({setting}); its "
        f"recommended period is {ONLINE_PERIOD_S:g} s, as a node of mpc-online alone and "
        f"'gpugov simulate' run it: at {period:g} s it learns and reacts "
        f"{period / ONLINE_PERIOD_S:.3g} times slower"
        for domain in config.domains
        if isinstance(domain.controller, OnlineMPCControllerConfig)
    ]


def _page_key(url: str) -> tuple[str, str, int | None, str]:
    """``url`` as the page it names: scheme and host in lower case, the scheme's default
    port filled in, an empty path read as ``/``."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port, parts.path or "/"


def shared_engine_warnings(config: GpugovConfig) -> list[str]:
    """One line per engine page two or more domains read (``engine.url``, the default
    ``http://127.0.0.1:8000/metrics`` where left unset): each domain's controller then
    sees the other's load as its own and raises its clock for it."""
    readers: dict[tuple[str, str, int | None, str], tuple[str, list[str]]] = {}
    for domain in config.domains:
        url = domain.engine.url
        readers.setdefault(_page_key(url), (url, []))[1].append(domain.name)
    return [
        f"domains {', '.join(repr(name) for name in names)} read the same engine page "
        f"({url}): each governs its GPUs for the load of all of them; give each domain "
        "its own engine's engine.url"
        for url, names in readers.values()
        if len(names) > 1
    ]


def shared_budget_file_warnings(config: GpugovConfig) -> list[str]:
    """One line per ``power_budget_file`` two or more domains read where one takes its
    number as the whole domain's (``power_budget_file_scope = "domain"``): each holds that
    number as its own budget, so together they may draw more than it (a node's budget
    split over its domains in silence). A per-GPU number (scope ``"gpu"``) is one cap for
    every GPU, and shared rightly."""
    readers: dict[str, list[DomainConfig]] = {}
    for domain in config.domains:
        if domain.power_budget_file is not None:
            key = os.path.realpath(domain.power_budget_file)
            readers.setdefault(key, []).append(domain)
    lines = []
    for domains in readers.values():
        whole = [
            repr(domain.name) for domain in domains if domain.power_budget_file_scope == "domain"
        ]
        if len(domains) < 2 or not whole:
            continue
        lines.append(
            f"domains {', '.join(repr(domain.name) for domain in domains)} read one "
            f"power_budget_file ({domains[0].power_budget_file}) and {', '.join(whole)} "
            f"take{'s' if len(whole) == 1 else ''} its number as the whole domain's "
            '(power_budget_file_scope = "domain"): each holds it as its own budget, so '
            "together they may draw more than it; give each domain its own file, or take "
            'the number per GPU (scope "gpu")'
        )
    return lines


def unkept_model_warnings(config: GpugovConfig) -> list[str]:
    """One line per ``mpc-online`` domain whose learned model is kept nowhere (no
    ``daemon.state_dir``, ``controller.state_dir`` or ``$STATE_DIRECTORY``): each start
    learns anew, which ``run`` did in silence. None for a dry run, which writes nothing."""
    if config.daemon.dry_run or resolve_state_dir(config.daemon.state_dir) is not None:
        return []
    return [
        f"domain {domain.name!r} runs mpc-online with no state directory (no "
        f"daemon.state_dir, controller.state_dir or ${STATE_DIR_ENV}): its learned model "
        "is kept nowhere, so each start learns anew; set daemon.state_dir"
        for domain in config.domains
        if isinstance(domain.controller, OnlineMPCControllerConfig)
        and domain.controller.state_dir is None
    ]


def config_inputs(
    config: GpugovConfig, path: str | os.PathLike[str] | None = None
) -> list[tuple[str, str | os.PathLike[str] | None]]:
    """The files a node config reads, as :func:`check_output_file`'s ``inputs`` for its
    record file, each named by its field: the config file itself (``path``), each domain's
    controller files (an open-loop plan, a profile's manifest and CSV) and power budget
    file, zeusd's token file, and the state directory's files (the lock record, its hold
    file, each ``mpc-online`` domain's learned model): a record there moved them aside."""
    inputs: list[tuple[str, str | os.PathLike[str] | None]] = [("the config file", path)]
    for domain in config.domains:
        where = f"domain {domain.name!r}"
        inputs += [
            (f"{where} controller.{name}", file)
            for name, file in controller_files(domain.controller)
        ]
        inputs.append((f"{where} power_budget_file", domain.power_budget_file))
        directory = controller_state_dir(domain.controller, config.daemon.state_dir)
        if directory is not None:
            # Here, not at the top: stored_model imports the online model and with it
            # numba (about 0.4 s of CPU), which a daemon of another controller never needs.
            from gpugov.daemon.stored_model import model_path

            inputs.append((f"{where}'s learned model", model_path(directory, domain.name)))
            inputs.append(
                (f"{where}'s learned model's hold file", model_hold_path(directory, domain.name))
            )
    if config.daemon.zeusd is not None:
        inputs.append(("daemon.zeusd.token_file", config.daemon.zeusd.token_file))
    state_dir = resolve_state_dir(config.daemon.state_dir)
    if state_dir is not None:
        inputs.append(("the lock state file", state_dir / STATE_FILE))
        inputs.append(("the state directory's hold file", state_dir / HOLD_FILE))
    return inputs


def check_node(
    config: GpugovConfig,
    *,
    path: str | os.PathLike[str] | None = None,
    offline: bool = False,
    nvml: ModuleType | None = None,
    load_nvml: Callable[[], ModuleType] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
) -> NodeReport:
    """Check ``config`` against this node as ``run`` would at start, applying nothing.

    Args:
        path: the config file (``daemon.record`` must not be it, nor any file it names).
        offline: skip everything that depends on this machine; build the controllers only
            (and refuse a ``daemon.record`` that is a file the config reads).
        nvml: the ``pynvml`` module (tests pass a fake); else ``load_nvml()``.
        load_nvml: imports the real one (default :func:`daemon.nvml.load_pynvml`).
        sleep: for the retries of a transient error while opening a GPU.
    """
    report = NodeReport()
    opened: dict[str, list[GpuBackend]] | None = None
    with _warnings_into(report.warnings):
        try:
            if offline:
                report.lines.append("node checks skipped (--offline): GPUs, emulator, files")
                try:
                    check_not_an_input(
                        "daemon.record", config.daemon.record, config_inputs(config, path)
                    )
                except UsageError as error:
                    report.problems.append(error)
            else:
                _check_outputs(config, report, path)
                opened = _open_gpus(config, report, nvml, load_nvml, sleep)
            for domain in config.domains:
                backends = None if opened is None else opened.get(domain.name)
                _check_domain(config, domain, backends, report)
        finally:
            _close_all(opened or {}, report)
    return report


def _close_all(opened: dict[str, list[GpuBackend]], report: NodeReport) -> None:
    """Close the GPUs :func:`check_node` opened, each close waited for at most
    :data:`~daemon.node_support.GPU_CALL_DEADLINE_S`; none once a call has hung (a close
    that hangs is one more problem, and the rest are left open)."""
    for backends in opened.values():
        for backend in backends:
            if report.hung:
                return
            try:
                bounded_gpu_call(backend.close, "close", GPU_CALL_DEADLINE_S, gpu=backend.label)
            except GpuCallHung as error:
                report.problems.append(error)
                report.hung = True


@contextmanager
def _warnings_into(lines: list[str]) -> Iterator[None]:
    """Collect what the daemon's modules log at WARNING or above while checking (an
    unknown GPU family in a prior hint, a retried GPU open) as warning lines."""

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("gpugov")
    handler = Collect(logging.WARNING)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


# ---------------------------------------------------------------------- files, socket
def _check_outputs(
    config: GpugovConfig, report: NodeReport, path: str | os.PathLike[str] | None
) -> None:
    """The record file ``run`` would write (never a file the config at ``path`` reads),
    the state directories it would keep its files in and the address its exporter would
    bind."""
    try:
        check_output_file("daemon.record", config.daemon.record, config_inputs(config, path))
    except UsageError as error:
        report.problems.append(error)
    _check_state_dirs(config, report)
    address = config.daemon.metrics_address
    if address and address.lower() != "none" and _bind_error(address) is not None:
        # In run's own line (its check, which this one's tolerance of a port a running
        # gpugov holds aside, refuses the same address).
        name = "daemon.metrics_address" if path is None else f"{path}: daemon.metrics_address"
        try:
            check_metrics_address(address, name)
        except UsageError as error:
            report.problems.append(error)


def _check_state_dirs(config: GpugovConfig, report: NodeReport) -> None:
    """A warning per state directory ``run`` could not keep its files in (the lock record,
    a learner's model): it runs without them, and a restart then learns anew."""
    wanted: dict[Path, tuple[str, str]] = {}
    daemon_dir = resolve_state_dir(config.daemon.state_dir)
    if daemon_dir is not None:
        source = "daemon.state_dir" if config.daemon.state_dir is not None else STATE_DIR_ENV
        wanted[daemon_dir] = (source, "no lock record and no learned model")
    for domain in config.domains:
        spec = domain.controller
        if isinstance(spec, OnlineMPCControllerConfig) and spec.state_dir is not None:
            wanted.setdefault(
                Path(spec.state_dir),
                (f"domain {domain.name!r} controller.state_dir", "no learned model"),
            )
    if not config.daemon.dry_run:  # run refuses it (exit 2); a dry run reads no record
        newer = newer_record(daemon_dir)
        if newer is not None:
            report.problems.append(newer)
    for directory, (source, kept) in wanted.items():
        reason = state_dir_problem(directory)
        if reason is not None:
            report.warnings.append(
                f"{source} {directory}: {reason}; run keeps {kept} there, so a restart learns anew"
            )


def state_dir_problem(directory: Path) -> str | None:
    """Why no file could be kept in ``directory`` (created with its parents on the first
    write), or None."""
    if directory.exists():
        if not directory.is_dir():
            return "exists and is not a directory"
        probe = directory
    else:
        probe = directory.parent
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user"
    return None


def _bind_error(address: str) -> str | None:
    """Why ``run`` could not serve ``/metrics`` on ``address``, or None. The port itself is
    tried: one held by a running gpugov (its own exporter answers there, as when a config
    is checked before a restart) is no problem; one held by anything else is, as ``run``
    would find."""
    host, port = parse_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter
            probe.bind((host, port))
    except OSError as error:
        if port and error.errno == errno.EADDRINUSE and _gpugov_serves(host, port):
            return None
        return error.strerror or str(error)
    return None


def _gpugov_serves(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether ``host:port`` answers ``/metrics`` with gpugov's own series."""
    import http.client

    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        return response.status == 200 and b"gpugov_" in response.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


# ------------------------------------------------------------------------------ GPUs
def _open_gpus(
    config: GpugovConfig,
    report: NodeReport,
    nvml: ModuleType | None,
    load_nvml: Callable[[], ModuleType] | None,
    sleep: Callable[[float], Any],
) -> dict[str, list[GpuBackend]] | None:
    """Open every domain's GPUs read-only as ``run`` opens them; None when this machine
    has no driver for the backend (the GPU part is skipped). A domain whose GPUs could
    not all be opened is left out (its problem is reported)."""
    from gpugov.daemon.gpu_open import (
        GPU_OPEN_DEADLINE_S,
        check_actuator_serves,
        check_opened_once,
        open_domain_gpu,
    )

    kind = config.daemon.backend
    if kind in ("nvml", "actuator", "zeusd"):  # the split backends read through NVML
        nvml = _nvml_or_none(nvml, load_nvml, report)
        if kind != "nvml":  # the actuator (or zeusd) answers or not, driver or none here
            _check_write_path(config, report)
        if nvml is None:
            return None
    elif kind == "nvidia-smi" and shutil.which("nvidia-smi") is None:
        report.lines.append("GPU checks skipped: nvidia-smi is not installed here")
        return None
    elif kind == "emulated":
        from gpugov.daemon.emulated import (
            emulated_device_count,
            emulated_gpu_roles,
            emulated_replicas,
        )

        emulator = str(config.daemon.emulator)
        try:
            count = emulated_device_count(emulator)
            pools = emulated_gpu_roles(emulator)
            replicas = emulated_replicas(emulator) or []
        except GpuUnavailable as error:
            report.problems.append(
                GpuUnavailable(
                    f"{error}: start `gpugov emulate` there, or check the file alone with --offline"
                )
            )
            return {}
        report.lines.append(f"emulator {emulator}: answers, {count} GPU(s)")
        report.warnings.extend(pool_warnings(config, pools))
        report.warnings.extend(tensor_group_warnings(config, replicas))
    opened: dict[str, list[GpuBackend]] = {}
    uuids: dict[str, tuple[str, str]] = {}
    for domain in config.domains:
        backends: list[GpuBackend] = []
        try:
            for gpu in domain.gpus:
                backends.append(
                    open_domain_gpu(
                        domain.name,
                        gpu,
                        kind,
                        dry_run=True,  # reads only, whatever happens next
                        nvml=nvml,
                        sleep=sleep,
                        emulator=config.daemon.emulator,
                        daemon=config.daemon,
                        deadline_s=GPU_OPEN_DEADLINE_S,  # as run's start: a hung call ends it
                    )
                )
                check_opened_once(uuids, backends[-1], domain.name, str(gpu))
            if not config.daemon.dry_run:
                check_actuator_serves(domain.name, backends)
        except GpuCallHung as error:
            # No GPU is closed, nor another opened: each would queue behind the hung call
            # in the driver (NVML is not shut down under it; the process's exit releases
            # what is open).
            report.problems.append(error)
            report.hung = True
            return opened
        except GpugovError as error:
            report.problems.append(error)
            for backend in backends:
                backend.close()
            continue
        opened[domain.name] = backends
    return opened


def _check_write_path(config: GpugovConfig, report: NodeReport) -> None:
    """Whether the actuator (or zeusd) answers: a line when it does, a warning when not.
    Not a problem: ``run`` starts without it and holds the fail-safe until it answers."""
    answers, line = write_path_status(config.daemon)
    if answers:
        report.lines.append(line)
    else:
        report.warnings.append(
            f"{line}; run would start and hold each domain's fail-safe until it answers "
            "(a refusal of this user is expected when check-config runs as another user "
            "than the governor)"
        )


def _nvml_or_none(
    nvml: ModuleType | None, load_nvml: Callable[[], ModuleType] | None, report: NodeReport
) -> ModuleType | None:
    """The NVML module when a driver answers here; None (and one line) when this machine
    has no NVIDIA driver or library. Any other NVML failure is a problem: ``run`` on this
    node would fail the same way."""
    from gpugov.daemon.gpu_open import GPU_OPEN_DEADLINE_S
    from gpugov.daemon.nvml import load_pynvml, nvml_device_count

    try:
        module = nvml or (load_nvml or load_pynvml)()
        count = bounded_gpu_call(
            lambda: nvml_device_count(module), "NVML: list the GPUs", GPU_OPEN_DEADLINE_S
        )
    except GpuCallHung as error:  # a driver in trouble, not "no driver here"
        report.problems.append(error)
        report.hung = True
        return None
    except GpuUnavailable as error:
        if error.code in NO_DRIVER_CODES:  # the error's line says where to go without one
            report.lines.append(f"GPU checks skipped: {error}")
        elif error.code is None:
            report.lines.append(f"GPU checks skipped: no NVIDIA driver here ({error})")
        else:
            report.problems.append(error)
        return None
    except GpugovError as error:
        report.problems.append(error)
        return None
    report.lines.append(f"NVML: {count} GPU(s)")
    return module


# ---------------------------------------------------------------------------- domains
def _check_domain(
    config: GpugovConfig,
    domain: DomainConfig,
    backends: Sequence[GpuBackend] | None,
    report: NodeReport,
) -> None:
    """The domain's clocks and floor (when its GPUs were opened) and its controller."""
    from gpugov.plant.profile import ProfileError

    names: list[str] = []
    clocks: tuple[float, ...] = ()
    if backends is not None:
        try:
            clocks = _common_clocks(backends)
        except GpugovError as error:
            report.problems.append(error)
            clocks = ()
        labels = ", ".join(b.label for b in backends)
        from gpugov.daemon.gpu_open import check_configured_clocks, gpu_names, no_common_clock

        names = gpu_names(backends)
        if not clocks:
            report.problems.append(no_common_clock(domain.name, backends))
        else:
            report.lines.append(
                f"domain {domain.name}: GPU {labels} ({', '.join(sorted(set(names))) or '?'}): "
                f"{len(clocks)} supported clocks, {clocks[0]:g}-{clocks[-1]:g} MHz"
            )
        try:
            # The refusal of daemon.service.build_domain, word for word.
            check_configured_clocks(domain.name, domain.safety.floor_mhz, domain.controller, clocks)
        except ConfigError as error:
            report.problems.append(error)
        if domain.power_budget_w is None and domain.power_budget_file is None:
            pass  # no power limit to read
        elif report.hung:
            # Another read would queue behind the hung call in the driver (NVML is one
            # library for every GPU): no further GPU call is made, and the line says so.
            report.warnings.append(
                f"domain {domain.name}: power budget not checked: a GPU call hung; no "
                "further GPU call is made (it would queue behind the hung one)"
            )
        else:
            _check_budget(domain, backends, report)
        if not report.hung:
            _check_configured_cap(domain, backends, report)
        if not report.hung and domain.thermal_limit_c is not None:
            from gpugov.daemon.thermal_limit import held_thermal_limit

            # The line run logs at start (daemon.service), word for word.
            held = _read_power_limits(
                domain,
                backends,
                report,
                lambda: held_thermal_limit(domain.name, domain.thermal_limit_c, backends),
                "the thermal limit not checked against the GPUs' slowdown temperature",
                "read the slowdown temperatures",
            )
            if held is not None and held[1] is not None:
                report.warnings.append(held[1])
    try:
        controller = _build_controller(
            config, domain, names, clocks, gpus_seen=backends is not None
        )
    except (GpugovError, ProfileError) as error:
        # Named as run names it (daemon.service.build_domain): the domain and its field.
        report.problems.append(ControllerError(f"domain {domain.name!r}: controller: {error}"))
        return
    from gpugov.daemon.gpu_open import check_power_capping

    # As run's power limit actuator is made: each GPU's backend sets power limits;
    # offline, the config's backend does (only nvml).
    can_set = (
        config.daemon.backend in POWER_LIMIT_BACKENDS
        if backends is None
        else bool(backends) and all(power_limit_backend(b) is not None for b in backends)
    )
    try:
        check_power_capping(domain.name, domain.controller, controller, can_set=can_set)
    except ConfigError as error:
        report.problems.append(error)
        return
    from gpugov.daemon.decide import profile_fit_warnings

    # The lines run logs at start (daemon.service.build_domain), word for word. Offline
    # the clocks are unknown, but the domain's GPU count is the config's: the TP line.
    count = len(backends) if backends is not None else len(domain.gpus)
    report.warnings.extend(
        f"domain {domain.name!r}: controller: {line}"
        for line in profile_fit_warnings(domain.controller, clocks, count)
    )


def _read_power_limits(
    domain: DomainConfig,
    backends: Sequence[GpuBackend],
    report: NodeReport,
    read: Callable[[], T],
    unread: str,
    what: str = "read the power limits",
) -> T | None:
    """``read()`` (a check that reads the GPUs' power limits, or ``what`` else) on a
    worker thread, waited for at most :data:`~daemon.gpu_sampling.GPU_READ_DEADLINE_S`
    per GPU, as ``run``'s start reads them; a read past it is a warning saying ``unread``
    and marks the report hung (no further GPU call is made: it would queue behind the
    hung one), a :class:`ConfigError` a problem. None where either."""
    from gpugov.daemon.gpu_sampling import GPU_READ_DEADLINE_S

    try:
        return bounded_gpu_call(
            read,
            what,
            GPU_READ_DEADLINE_S * len(backends),
            gpu=", ".join(b.label for b in backends),
        )
    except GpuCallHung as error:
        report.hung = True
        report.warnings.append(
            f"domain {domain.name}: {error}; {unread}; no further GPU call is made (it "
            "would queue behind the hung one)"
        )
    except ConfigError as error:
        report.problems.append(error)
    return None


def _check_budget(domain: DomainConfig, backends: Sequence[GpuBackend], report: NodeReport) -> None:
    """The domain's power budget as ``run`` takes it: ``power_budget_w`` against the
    GPUs' lowest power limit (a problem), and one read of ``power_budget_file`` (its
    trouble is a warning: ``run`` starts and keeps the last good value); the limits read
    as ``run``'s start reads them (:func:`_read_power_limits`: past the deadline ``run``
    takes them as unknown)."""
    from gpugov.daemon.power_budget import domain_budget

    budget = _read_power_limits(
        domain,
        backends,
        report,
        lambda: domain_budget(
            domain.name,
            backends,
            config_w=domain.power_budget_w,
            file=domain.power_budget_file,
            file_scope=domain.power_budget_file_scope,
        ),
        "run takes the limits as unknown",
    )
    if budget is not None and budget.file is not None and budget.file.read() is not None:
        report.lines.append(
            f"domain {domain.name}: power budget file {budget.file.path}: "
            f"{budget.file.value_w:g} W for the domain"
        )


def _check_configured_cap(
    domain: DomainConfig, backends: Sequence[GpuBackend], report: NodeReport
) -> None:
    """The controller's configured ``cap_w`` against the GPUs' lowest power limit, as
    ``run`` refuses it (:func:`~daemon.power_budget.check_configured_cap`, word for
    word), the limits read as ``run``'s start reads them (:func:`_read_power_limits`)."""
    from gpugov.daemon.power_budget import check_configured_cap

    cap_w = getattr(domain.controller, "cap_w", None)
    if cap_w is None:
        return
    _read_power_limits(
        domain,
        backends,
        report,
        lambda: check_configured_cap(domain.name, cap_w, backends),
        "the power cap not checked",
    )


def _common_clocks(backends: Sequence[GpuBackend]) -> tuple[float, ...]:
    """The clocks every GPU of a domain supports, ascending (as the observer takes them)."""
    common = set(backends[0].supported_clocks_mhz())
    for backend in backends[1:]:
        common &= set(backend.supported_clocks_mhz())
    return tuple(float(c) for c in sorted(common))


def _build_controller(
    config: GpugovConfig,
    domain: DomainConfig,
    gpu_names: Sequence[str],
    clocks: Sequence[float],
    *,
    gpus_seen: bool,
) -> Any:
    """The domain's controller, built by ``run``'s factory (its plan, profile or prior
    profile loaded) but with no state directory (no learned-model file is read or
    written) and never asked for a decision. Offline the GPUs' clocks are unknown: a
    stand-in clock builds the chain, which decides nothing here.

    Raises:
        ControllerError: it cannot be built.
    """
    from gpugov.daemon.decide import ControllerContext, build_controller

    spec = domain.controller
    hints = spec.prior if isinstance(spec, OnlineMPCControllerConfig) else None
    if not gpus_seen and hints is not None and (hints.gpu or "").strip().lower() == "auto":
        # gpu = "auto" takes the GPU's NVML name, which is unknown without the GPUs.
        spec = spec.model_copy(update={"prior": hints.model_copy(update={"gpu": None})})
    context = ControllerContext(
        period_s=config.daemon.period_s,
        supported_clocks_mhz=tuple(clocks) or (1.0,),
        gpu_names=tuple(gpu_names),
        gpu_count=len(domain.gpus),
        ttft_slo_s=domain.ttft_slo_s,
        tpot_slo_s=domain.tpot_slo_s,
        thermal_limit_c=domain.thermal_limit_c,
        state_dir=None,
        domain=domain.name,
        role=domain.role or "colocated",
    )
    return build_controller(spec, context)
