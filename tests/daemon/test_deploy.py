"""The Kubernetes manifests in deploy/kubernetes/: valid against Kubernetes' own schemas
(offline: kubernetes-validate bundles them), probes that are real `edged` commands, a
configuration edged accepts, and a grace period that never cuts a drain short."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support import REPO_ROOT

from edged.cli.commands import build_parser
from edged.client.keys import write_key_pair
from edged.config.file import parse_config

MANIFESTS = REPO_ROOT / "deploy" / "kubernetes"
# A version kubernetes-validate bundles a schema for; strict: an unknown field is an error.
KUBERNETES_VERSION = "1.31.0"
PROBES = {"startupProbe": "started", "readinessProbe": "ready", "livenessProbe": "live"}


def documents() -> list[dict[str, Any]]:
    return [doc for path in sorted(MANIFESTS.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in documents() if doc["kind"] == kind]
    return found


def container() -> dict[str, Any]:
    (edged,) = one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return edged


def config_toml() -> dict[str, Any]:
    return tomllib.loads(one("ConfigMap")["data"]["edged.toml"])


@pytest.mark.parametrize("doc", documents(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_each_manifest_validates_against_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_kind_the_rollout_needs_is_there() -> None:
    kinds = sorted(doc["kind"] for doc in documents())
    assert kinds == ["ConfigMap", "DaemonSet", "PersistentVolumeClaim", "PodDisruptionBudget", "Service"]
    assert one("Service")["spec"]["clusterIP"] == "None"  # headless: clients see every daemon
    assert container()["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_probes_are_edged_health_commands_the_cli_accepts() -> None:
    ipc = next(e for e in config_toml()["server"]["endpoints"] if e.startswith("ipc://"))
    parser = build_parser()
    for key, mode in PROBES.items():
        probe = container()[key]
        program, *argv = probe["exec"]["command"]
        assert program == "edged", key
        args = parser.parse_args(argv)  # an option the CLI lacks exits here
        assert (args.command, args.probe, args.endpoint) == ("health", mode, ipc), key
        # The CLI gives up (exit 1) before Kubernetes times the probe out.
        assert args.timeout_ms < probe["timeoutSeconds"] * 1000, key


def test_the_configmap_is_a_configuration_edged_accepts(tmp_path: Path) -> None:
    text = one("ConfigMap")["data"]["edged.toml"]
    security = config_toml()["security"]
    secret, _ = write_key_pair(tmp_path / "keys", "server")
    (tmp_path / "clients").mkdir()
    text = text.replace(security["server_secret_key_file"], str(secret))
    text = text.replace(security["allowed_clients_dir"], str(tmp_path / "clients"))
    config = parse_config(tomllib.loads(text), tmp_path)
    mounts = {m["mountPath"] for m in container()["volumeMounts"]}
    assert config.model_repository.as_posix() in mounts
    assert str(Path(config.endpoints[0].removeprefix("ipc://")).parent) in mounts
    # Each tcp port the daemon binds (the shared one, each class's tcp_port) is the pod's and the Service's.
    bound = {int(e.rpartition(":")[2]) for e in config.endpoints if e.startswith("tcp://")}
    bound |= {c.tcp_port for c in config.classes if c.tcp_port is not None}
    assert bound == {port["containerPort"] for port in container()["ports"]}
    assert bound == {port["port"] for port in one("Service")["spec"]["ports"]}


def test_the_grace_period_outlasts_the_prestop_head_start_the_drain_and_the_stop_grace() -> None:
    server = config_toml()["server"]
    hook = container()["lifecycle"]["preStop"]["exec"]["command"]
    head_start_s = float(re.match(r"sleep (\d+(?:\.\d+)?);", hook[-1])[1])
    needed_s = head_start_s + (server["drain_timeout_ms"] + server["stop_grace_ms"]) / 1000
    grace_s = one("DaemonSet")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s > needed_s, f"terminationGracePeriodSeconds {grace_s} must exceed {needed_s:g} s"


def test_the_service_and_the_disruption_budget_select_the_daemons_pods() -> None:
    labels = one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    for selector in (one("Service")["spec"]["selector"], one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()


# --- the container definition the DaemonSet's image is built from -----------------------

CONTAINERFILE = REPO_ROOT / "deploy" / "container" / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def instruction(name: str) -> list[str]:
    return [args for key, args in instructions() if key == name]


def test_the_container_runs_a_cuda_13_runtime_with_the_gpu_extra() -> None:
    (base,) = instruction("FROM")
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-cudnn-runtime-ubuntu\d+\.\d+", base), base
    assert any('pip install --no-cache-dir "/src[gpu]"' in run for run in instruction("RUN"))


def test_the_container_agrees_with_the_daemonset_user_command_volumes_port_and_probe() -> None:
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    edged = container()
    (user,) = instruction("USER")
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    (command,) = instruction("CMD")
    assert json.loads(command) == edged["command"]
    (expose,) = instruction("EXPOSE")
    assert [int(port) for port in expose.split()] == [port["containerPort"] for port in edged["ports"]]
    (volumes,) = instruction("VOLUME")
    mounts = {Path(m["mountPath"]) for m in edged["volumeMounts"] if m["name"] != "tmp"}
    # Each mount of the pod (the config's files, the keys, the models, the socket) lies in a volume.
    assert all(any(mount == Path(v) or Path(v) in mount.parents for v in json.loads(volumes)) for mount in mounts)
    assert config_toml()["server"]["model_repository"] in json.loads(volumes)
    env = " ".join(instruction("ENV"))
    assert all(f"{e['name']}={e['value']}" in env for e in edged["env"])
    (health,) = instruction("HEALTHCHECK")
    options, probe = health.split(" CMD ", 1)
    assert json.loads(probe) == edged["livenessProbe"]["exec"]["command"]
    live, started = edged["livenessProbe"], edged["startupProbe"]
    assert options.split() == [
        f"--interval={live['periodSeconds']}s",
        f"--timeout={live['timeoutSeconds']}s",
        f"--retries={live['failureThreshold']}",
        f"--start-period={started['periodSeconds'] * started['failureThreshold']}s",
    ]


def test_the_image_tag_is_the_package_version_and_the_docs_build_it_so() -> None:
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    tag = f"edged:{version}"
    assert container()["image"] == tag
    build = f"docker build -f deploy/container/Containerfile -t {tag} ."
    assert build in CONTAINERFILE.read_text()
    for doc in ("README.md", "docs/operations.md"):
        text = (REPO_ROOT / doc).read_text()
        assert build in text and "not built" in text.lower(), doc
