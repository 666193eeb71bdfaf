"""The Kubernetes manifests in deploy/kubernetes/: valid against Kubernetes' own schemas
(offline: kubernetes-validate bundles them), probes that are real `edged` commands, a
configuration edged accepts, and a grace period that never cuts a drain short."""

from __future__ import annotations

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
