"""Kubernetes manifests and the Dockerfile, validated offline.

Built-in kinds are validated by ``kubernetes-validate`` (which ships the Kubernetes JSON
schemas) in strict mode, so an unknown field fails, against the oldest and the newest
Kubernetes minor it knows of that we support. The ServiceMonitor is a CRD the package has
no schema for: it is validated with ``jsonschema`` against a small schema vendored in
``tests/deploy/schemas/`` (a subset of the prometheus-operator CRD, see its $comment).
Then the pieces are checked against each other and against gpugov itself: the config in
the ConfigMap passes gpugov's own validation, the container args and the Dockerfile's
command parse with gpugov's own CLI, and ports, labels and selectors line up.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
from deploytools import DEPLOY, KUBERNETES, REPO, check_config, require_module

from gpugov.cli import build_parser
from gpugov.daemon.addresses import parse_address
from gpugov.daemon.config import parse_config

yaml = require_module("yaml")

MANIFESTS = (
    sorted(KUBERNETES.glob("*.yaml"))
    + sorted(KUBERNETES.glob("examples/*.yaml"))
    + sorted(KUBERNETES.glob("split/*.yaml"))
)
SERVICEMONITOR_SCHEMA = (
    Path(__file__).parent / "schemas" / "servicemonitor-monitoring.coreos.com-v1.json"
)
# The oldest minor we claim (the engine example's internalTrafficPolicy is GA since 1.26).
OLDEST_KUBERNETES = "1.28"
DOCKERFILE = DEPLOY / "Dockerfile"


def documents() -> list[tuple[str, dict[str, Any]]]:
    """``(file name, document)`` for every YAML document of every manifest."""
    out = []
    for path in MANIFESTS:
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                out.append((str(path.relative_to(KUBERNETES)), document))
    return out


def find(kind: str, name: str | None = None) -> dict[str, Any]:
    """The one manifest of ``kind`` (and ``name``) under deploy/kubernetes/ (not examples)."""
    found = [
        d
        for f, d in documents()
        if d["kind"] == kind
        and not f.startswith(("examples/", "split/"))
        and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def kubernetes_versions() -> list[str]:
    """The oldest supported and the newest Kubernetes minor kubernetes-validate knows."""
    module = require_module("kubernetes_validate")
    return [OLDEST_KUBERNETES, module.latest_version()]


@pytest.mark.parametrize(
    ("source", "document"),
    [pytest.param(f, d, id=f"{f}:{d['kind']}") for f, d in documents()],
)
def test_manifest_validates_offline(source: str, document: dict[str, Any]) -> None:
    if document["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema = require_module("jsonschema")
        schema = json.loads(SERVICEMONITOR_SCHEMA.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(document))
        assert not errors, f"{source}: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors
        )
        return
    module = require_module("kubernetes_validate")
    for version in kubernetes_versions():
        try:
            module.validate(document, version, strict=True)
        except module.ValidationError as error:
            pytest.fail(f"{source} ({document['kind']}) on Kubernetes {version}: {error}")


def test_the_vendored_schema_rejects_a_misspelt_field() -> None:
    jsonschema = require_module("jsonschema")
    schema = json.loads(SERVICEMONITOR_SCHEMA.read_text())
    monitor = json.loads(json.dumps(find("ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(monitor))


def container() -> dict[str, Any]:
    """The gpugov container of the DaemonSet."""
    containers = find("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["gpugov"]
    return containers[0]


def config_text() -> str:
    """config.toml from the ConfigMap the DaemonSet mounts."""
    pod = find("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in container()["volumeMounts"] if m["mountPath"] == "/etc/gpugov")
    configmap = find("ConfigMap", volumes[mount["name"]]["configMap"]["name"])
    return configmap["data"]["config.toml"]


def test_configmap_config_passes_gpugovs_validation() -> None:
    config = parse_config(tomllib.loads(config_text()), "configmap.yaml:config.toml")
    host, port = parse_address(config.daemon.metrics_address)
    assert host not in {"127.0.0.1", "localhost", "::1"}, "a probe cannot reach loopback"
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert ports["metrics"] == port
    assert not config.daemon.dry_run


def test_daemonset_privileges_network_and_probes() -> None:
    pod = find("DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is False
    assert pod.get("hostPID", False) is False
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    security = container()["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert "nvidia.com/gpu" not in json.dumps(container().get("resources", {}))
    for probe in ("startupProbe", "readinessProbe"):
        assert container()[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert container()["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_daemonset_args_parse_with_the_real_cli() -> None:
    args = build_parser().parse_args(container()["args"])
    assert args.config == "/etc/gpugov/config.toml"
    assert not args.dry_run


def test_daemonset_resets_on_every_exit_and_keeps_lock_state() -> None:
    """No ExecStopPost= in Kubernetes: a preStop reset, and reconcile at start instead."""
    command = container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "/opt/gpugov/venv/bin/gpugov"
    args = build_parser().parse_args(command[1:])
    assert args.command == "reset-clocks" and args.gpus == "all"
    env = {e["name"]: e.get("value") for e in container()["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    volumes = {v["name"]: v for v in find("DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    assert mounts["state"] == env["STATE_DIRECTORY"]
    assert volumes["state"]["hostPath"]["type"] == "DirectoryOrCreate"


def test_service_and_servicemonitor_select_the_pods() -> None:
    pod_labels = find("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    service = find("Service")
    assert service["metadata"]["namespace"] == find("DaemonSet")["metadata"]["namespace"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = find("ServiceMonitor")
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    # Without jobLabel the job is the Service's name: the alert rules match job="gpugov".
    assert "jobLabel" not in monitor["spec"] and service["metadata"]["name"] == "gpugov"


def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(item.split(" ", 1)[0].upper(), item.split(" ", 1)[1]) for item in logical]


def test_dockerfile_copies_what_exists_and_runs_the_real_cli() -> None:
    instructions = dockerfile_instructions()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for instruction, arguments in instructions:
        if instruction == "COPY" and not arguments.startswith("--from"):
            *sources, _ = shlex.split(arguments)
            for source in sources:
                assert (DEPLOY.parent / source).exists(), f"COPY {source}: not in the repository"
                assert source.rstrip("/") in allowed, f"COPY {source}: excluded by .dockerignore"
    entrypoint = json.loads(dict(instructions)["ENTRYPOINT"])
    command = json.loads(dict(instructions)["CMD"])
    assert entrypoint == ["/opt/gpugov/venv/bin/gpugov"]
    assert command == container()["args"]
    build_parser().parse_args(command)


# ------------------------------------------------------------------ split mode
def split_pod() -> dict[str, Any]:
    """The pod template of split/daemonset.yaml."""
    found = [d for f, d in documents() if f == "split/daemonset.yaml"]
    assert len(found) == 1 and found[0]["kind"] == "DaemonSet"
    pod: dict[str, Any] = found[0]["spec"]["template"]["spec"]
    return pod


def test_split_daemonset_privileges_only_the_actuator() -> None:
    containers = {c["name"]: c for c in split_pod()["containers"]}
    assert set(containers) == {"actuator", "governor"}
    actuator, governor = containers["actuator"], containers["governor"]
    assert actuator["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert governor["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert governor["securityContext"]["runAsNonRoot"] is True
    assert governor["securityContext"]["runAsUser"] != 0
    for container in (actuator, governor):
        security = container["securityContext"]
        assert security["privileged"] is False
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
    # The actuator serves exactly the governor's uid, on the socket the governor's
    # config names, in a volume the two containers (and only they) share.
    args = build_parser().parse_args(actuator["args"])
    assert args.command == "actuator"
    assert args.allow == str(governor["securityContext"]["runAsUser"])
    mounts = {
        c: {m["name"]: m["mountPath"] for m in containers[c]["volumeMounts"]} for c in containers
    }
    assert mounts["actuator"]["actuator-socket"] == mounts["governor"]["actuator-socket"]
    assert args.socket.rsplit("/", 1)[0] == mounts["actuator"]["actuator-socket"]
    assert list(mounts["actuator"]) == ["actuator-socket"]
    pod = split_pod()
    volumes = {v["name"]: v for v in pod["volumes"]}
    configmap = find_split_configmap(
        volumes[next(name for name, path in mounts["governor"].items() if path == "/etc/gpugov")][
            "configMap"
        ]["name"]
    )
    config = parse_config(tomllib.loads(configmap), "split/configmap.yaml:config.toml")
    assert config.daemon.backend == "actuator"
    assert str(config.daemon.actuator.socket) == args.socket
    governor_args = build_parser().parse_args(governor["args"])
    assert governor_args.command == "run" and not governor_args.dry_run
    command = actuator["lifecycle"]["preStop"]["exec"]["command"]
    assert build_parser().parse_args(command[1:]).command == "reset-clocks"
    assert "lifecycle" not in governor  # it could not reset; the lease does


def test_split_actuator_is_restarted_when_its_serving_loop_stops_answering() -> None:
    """Kubernetes has no WatchdogSec=: the actuator container's liveness probe is
    ``gpugov actuator --probe`` on the socket it serves, answered within the probe's
    timeout, and kills it after a stuck half minute at most."""
    actuator = next(c for c in split_pod()["containers"] if c["name"] == "actuator")
    served = build_parser().parse_args(actuator["args"])
    liveness = actuator["livenessProbe"]
    command = liveness["exec"]["command"]
    assert command[0] == "/opt/gpugov/venv/bin/gpugov"
    probe = build_parser().parse_args(command[1:])
    assert probe.command == "actuator" and probe.probe and probe.socket == served.socket
    assert probe.probe_timeout < liveness["timeoutSeconds"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] <= 30


def find_split_configmap(name: str) -> str:
    """config.toml of the split ConfigMap ``name``."""
    found = [
        d
        for f, d in documents()
        if f.startswith("split/") and d["kind"] == "ConfigMap" and d["metadata"]["name"] == name
    ]
    assert len(found) == 1, name
    text: str = found[0]["data"]["config.toml"]
    return text


# ------------------------------------------------------------ power budget example
POWER_BUDGET_EXAMPLE = "examples/power-budget-daemonset.yaml"
DYNAMO_ANNOTATION = "dynamo.nvidia.com/gpu-power-limit"


def test_power_budget_example_projects_the_annotation_the_config_reads() -> None:
    """The Downward API volume puts the pod's Dynamo annotation at the file the domain's
    ``power_budget_file`` names; the config passes gpugov's validation; the starting
    annotation is a budget gpugov accepts; the rest is the main DaemonSet's pod."""
    from gpugov.daemon.power_budget import parse_budget_watts

    found = {d["kind"]: d for f, d in documents() if f == POWER_BUDGET_EXAMPLE}
    assert set(found) == {"ConfigMap", "DaemonSet"}
    text = found["ConfigMap"]["data"]["config.toml"]
    config = parse_config(tomllib.loads(text), f"{POWER_BUDGET_EXAMPLE}:config.toml")
    domain = config.domains[0]
    assert domain.power_budget_file is not None and domain.power_budget_file_scope == "gpu"
    template = found["DaemonSet"]["spec"]["template"]
    pod = template["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (item,) = volumes["budget"]["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{DYNAMO_ANNOTATION}']"
    (gpugov,) = pod["containers"]
    mounts = {m["name"]: m for m in gpugov["volumeMounts"]}
    assert mounts["budget"]["readOnly"] is True
    assert Path(mounts["budget"]["mountPath"]) / item["path"] == domain.power_budget_file
    # Not below the config volume (a read-only ConfigMap mount).
    assert not str(domain.power_budget_file).startswith(mounts["config"]["mountPath"] + "/")
    assert parse_budget_watts(template["metadata"]["annotations"][DYNAMO_ANNOTATION]) > 0
    main = find("DaemonSet")["spec"]["template"]["spec"]
    assert gpugov["securityContext"] == main["containers"][0]["securityContext"]
    assert gpugov["args"] == main["containers"][0]["args"]
    assert {v["name"] for v in main["volumes"]} | {"budget"} == set(volumes)


# ------------------------------------------------- every DaemonSet, main, split, examples
def daemonsets() -> list[tuple[str, dict[str, Any]]]:
    """``(file, DaemonSet)`` for every DaemonSet under deploy/kubernetes/."""
    return [(f, d) for f, d in documents() if d["kind"] == "DaemonSet"]


def dockerfile_env() -> dict[str, str]:
    """The image's ENV (the Dockerfile's ``KEY=VALUE`` pairs)."""
    env: dict[str, str] = {}
    for instruction, arguments in dockerfile_instructions():
        if instruction == "ENV":
            for pair in shlex.split(arguments):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def mount_holding(container: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The container's volume mount whose directory holds ``path`` (the deepest one)."""
    holding = [
        m
        for m in container.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    return max(holding, key=lambda m: len(m["mountPath"]), default=None)


DAEMONSET_IDS = [f for f, _ in daemonsets()]


@pytest.mark.parametrize(("source", "daemonset"), daemonsets(), ids=DAEMONSET_IDS)
def test_every_container_requests_cpu_and_memory_and_caps_memory(
    source: str, daemonset: dict[str, Any]
) -> None:
    for container in daemonset["spec"]["template"]["spec"]["containers"]:
        resources = container.get("resources", {})
        for key in ("cpu", "memory"):
            assert resources.get("requests", {}).get(key), (
                f"{source}: container {container['name']} requests no {key}"
            )
        assert resources.get("limits", {}).get("memory"), (
            f"{source}: container {container['name']} has no memory limit"
        )


@pytest.mark.parametrize(("source", "daemonset"), daemonsets(), ids=DAEMONSET_IDS)
def test_every_governor_reads_a_config_the_pod_mounts_and_writes_where_it_can(
    source: str, daemonset: dict[str, Any]
) -> None:
    """``run --config FILE``: FILE is a key of the ConfigMap mounted at its directory; that
    config passes gpugov's validation, serves /metrics on the container's metrics port, and
    every path it or the environment writes (state directory, numba's cache, a record) is
    on a writable volume, the root file system being read-only."""
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    directory = source.rsplit("/", 1)[0] + "/" if "/" in source else ""
    governors = [
        c for c in pod["containers"] if build_parser().parse_args(c["args"]).command == "run"
    ]
    assert len(governors) == 1, f"{source}: expected one `gpugov run` container"
    (container,) = governors
    args = build_parser().parse_args(container["args"])
    mount = mount_holding(container, args.config)
    assert mount is not None, f"{source}: --config {args.config} is on no volume"
    configmap_name = volumes[mount["name"]]["configMap"]["name"]
    found = [
        d
        for f, d in documents()
        if d["kind"] == "ConfigMap"
        and d["metadata"]["name"] == configmap_name
        and f.startswith(directory)
        and (directory or "/" not in f)
    ]
    assert len(found) == 1, f"{source}: ConfigMap {configmap_name} not found beside it"
    key = args.config[len(mount["mountPath"]) :].lstrip("/")
    assert key in found[0]["data"], f"{source}: ConfigMap {configmap_name} has no {key!r}"
    config = parse_config(tomllib.loads(found[0]["data"][key]), f"{source}:{key}")
    _, port = parse_address(config.daemon.metrics_address)
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == port
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = dockerfile_env() | {e["name"]: e["value"] for e in container.get("env", [])}
    writes = {"NUMBA_CACHE_DIR": env["NUMBA_CACHE_DIR"], "STATE_DIRECTORY": env["STATE_DIRECTORY"]}
    if config.daemon.record is not None:
        writes["daemon.record"] = str(config.daemon.record)
    for what, path in writes.items():
        holder = mount_holding(container, path)
        assert holder is not None and not holder.get("readOnly", False), (
            f"{source}: {what} = {path} is on the read-only root file system"
        )


CONFIGMAPS = [(f, d) for f, d in documents() if d["kind"] == "ConfigMap"]


@pytest.mark.parametrize(
    ("source", "configmap"), CONFIGMAPS, ids=[f"{f}:{d['metadata']['name']}" for f, d in CONFIGMAPS]
)
def test_every_configmap_config_passes_check_config_without_a_warning(
    source: str, configmap: dict[str, Any], tmp_path: Path
) -> None:
    """Each ``*.toml`` of every ConfigMap, as ``gpugov check-config --offline`` reads it
    (the daemon prints the same warnings at every start): exit 0 and no warning line. The
    power budget example ran mpc-online every 1 s, which warned that it learns and reacts
    4 times slower than its recommended 0.25 s."""
    configs = {k: v for k, v in configmap["data"].items() if k.endswith(".toml")}
    assert configs, f"{source}: ConfigMap {configmap['metadata']['name']} holds no config"
    for key, text in configs.items():
        path = tmp_path / key
        path.write_text(text)
        code, lines = check_config(path)
        assert (code, lines) == (0, []), f"{source}:{key}: check-config exits {code}: {lines}"


# ---------------------------------------------------------------- the README's kubectl
def readme_kubectl_applies() -> list[list[list[str]]]:
    """The ``kubectl apply`` commands of deploy/README.md as argv, grouped by shell block
    (continuation lines joined, comments dropped)."""
    blocks = re.findall(r"```sh\n(.*?)```", (DEPLOY / "README.md").read_text(), re.DOTALL)
    out = []
    for block in blocks:
        commands = []
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:2] == ["kubectl", "apply"]:
                commands.append(argv)
        if commands:
            out.append(commands)
    return out


def kubectl_files(argv: list[str]) -> list[Path]:
    """The files ``kubectl apply`` reads, in its order: each ``-f`` in turn, a folder's
    .yaml/.yml/.json files in name order (not its subfolders: no ``-R`` here)."""
    assert "-R" not in argv and "--recursive" not in argv
    files = []
    for flag, target in itertools.pairwise(argv):
        if flag not in ("-f", "--filename"):
            continue
        path = REPO / target
        if path.is_dir():
            files += sorted(
                p for p in path.iterdir() if p.is_file() and p.suffix in {".yaml", ".yml", ".json"}
            )
        else:
            files.append(path)
    return files


def test_the_readmes_kubectl_apply_creates_the_namespace_before_what_it_holds() -> None:
    """``kubectl apply -f DIR`` applies DIR's files in name order and does not put a
    Namespace first: ``kubectl apply -f deploy/kubernetes/`` on a new cluster created
    configmap.yaml's and daemonset.yaml's objects before namespace.yaml's Namespace, and
    both failed (namespaces "gpugov" not found) until the command was run again."""
    applies = readme_kubectl_applies()
    assert applies, "deploy/README.md has no kubectl apply"
    for commands in applies:
        created: set[str] = set()
        for argv in commands:
            files = kubectl_files(argv)
            assert files, f"{' '.join(argv)}: applies no file"
            for path in files:
                for document in yaml.safe_load_all(path.read_text()):
                    if document is None:
                        continue
                    if document["kind"] == "Namespace":
                        created.add(document["metadata"]["name"])
                    namespace = document["metadata"].get("namespace")
                    assert namespace is None or namespace in created, (
                        f"deploy/README.md: `{' '.join(argv)}` applies "
                        f"{path.relative_to(REPO)} ({document['kind']}) before the Namespace "
                        f"{namespace!r}"
                    )


PROCESS_START_S = 2.0
"""Room for a gpugov command to start (the interpreter, its imports) before its budget
runs: the preStop hook's and the daemon's, each."""


@pytest.mark.parametrize(("source", "daemonset"), daemonsets(), ids=DAEMONSET_IDS)
def test_the_grace_period_holds_the_prestop_reset_and_the_daemons_exit(
    source: str, daemonset: dict[str, Any]
) -> None:
    """The kubelet counts a container's preStop hook in ``terminationGracePeriodSeconds``
    and SIGKILLs what is still running at its end: the hook's ``gpugov reset-clocks``
    budget, then the daemon's exit (every restore, the lock record's last write, the final
    model saves) must fit, as they do in the units' ``TimeoutStopSec=``; at 30 s a wedged
    driver had the daemon killed mid-exit, before the line naming the GPUs it left locked."""
    from gpugov.daemon.deadline import EXIT_WRITE_WAIT_S, WRITE_DEADLINE_S
    from gpugov.daemon.exit_restore import EXIT_RESTORE_BUDGET_S
    from gpugov.daemon.reset_clocks import RESET_BUDGET_S

    pod = daemonset["spec"]["template"]["spec"]
    grace = pod.get("terminationGracePeriodSeconds", 30)
    exit_s = PROCESS_START_S + EXIT_RESTORE_BUDGET_S + WRITE_DEADLINE_S + EXIT_WRITE_WAIT_S
    for container in pod["containers"]:
        command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        hook_s = 0.0
        if command and build_parser().parse_args(command[1:]).command == "reset-clocks":
            hook_s = PROCESS_START_S + RESET_BUDGET_S
        assert grace >= hook_s + exit_s, (
            f"{source}: container {container['name']}: terminationGracePeriodSeconds "
            f"{grace} < {hook_s + exit_s:g} s (its preStop reset, then its exit's restores "
            "and last writes)"
        )


@pytest.mark.parametrize(("source", "daemonset"), daemonsets(), ids=DAEMONSET_IDS)
def test_the_governors_liveness_probe_fails_when_its_control_loop_stalls(
    source: str, daemonset: dict[str, Any]
) -> None:
    """A pod has no systemd watchdog: the governor's liveness probe is what restarts a
    loop that stopped ticking. Its path, asked of a real exporter, answers 200 while the
    loop ticks (and while it starts) and an error once no tick came for minutes; /metrics
    answered 200 from the last snapshot however long the loop had stalled."""
    from urllib.error import HTTPError
    from urllib.request import urlopen

    from gpugov.daemon.exporter import Exporter, LoopSnapshot

    pod = daemonset["spec"]["template"]["spec"]
    (container,) = [
        c for c in pod["containers"] if build_parser().parse_args(c["args"]).command == "run"
    ]
    probe = container["livenessProbe"]["httpGet"]
    assert probe["port"] == "metrics"
    now = [1000.0]
    exporter = Exporter("127.0.0.1", 0, clock=lambda: now[0])

    def status() -> int:
        try:
            with urlopen(f"http://127.0.0.1:{exporter.port}{probe['path']}", timeout=10) as r:
                return int(r.status)
        except HTTPError as error:
            return int(error.code)

    try:
        now[0] += 60.0  # starting: NVML, the controller's compile
        assert status() == 200, f"{source}: the probe fails a governor that is starting"
        exporter.publish([], LoopSnapshot(ticks_total=1, period_s=0.25))
        now[0] += 0.25
        assert status() == 200, f"{source}: the probe fails a governor that ticks"
        now[0] += 300.0
        assert status() >= 500, f"{source}: {probe['path']} answers 200 with the loop stalled"
    finally:
        exporter.close()
