"""The cluster configs name the resources and entry points the code uses."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from train.common import INGEST_RESOURCE, TRAINER_RESOURCE, Job, load_config

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "cluster"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def start_resources(params: dict[str, Any]) -> dict[str, float]:
    """The ``resources`` rayStartParam of a KubeRay group (a quoted JSON string)."""
    raw = params.get("resources")
    return json.loads(json.loads(raw)) if raw else {}


def groups(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in spec["workerGroupSpecs"]}


def test_every_yaml_parses() -> None:
    files = sorted(CLUSTER.rglob("*.yaml"))
    assert len(files) == 4
    for path in files:
        assert load(path), path


def test_launcher_declares_the_resources_the_code_asks_for() -> None:
    types = load(CLUSTER / "ray-cluster.yaml")["available_node_types"]
    assert INGEST_RESOURCE in types["ingest-cpu"]["resources"]
    assert TRAINER_RESOURCE in types["trainer-gpu"]["resources"]
    assert "GPU" in types["trainer-gpu"]["resources"]
    assert INGEST_RESOURCE not in types["trainer-gpu"]["resources"]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_groups_declare_the_resources(name: str) -> None:
    doc = load(CLUSTER / "kuberay" / name)
    spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
    by_name = groups(spec)
    assert INGEST_RESOURCE in start_resources(by_name["ingest"]["rayStartParams"])
    assert TRAINER_RESOURCE in start_resources(by_name["trainer"]["rayStartParams"])
    gpu = by_name["trainer"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" in gpu


def test_rayjob_entrypoint_runs_an_existing_job_with_valid_overrides() -> None:
    entry = shlex.split(load(CLUSTER / "kuberay" / "rayjob.yaml")["spec"]["entrypoint"])
    assert entry[:3] == ["python", "-m", "train.lm"]
    module = importlib.import_module(entry[2])
    assert isinstance(module.JOB, Job)
    config_path = entry[entry.index("--config") + 1]
    assert (ROOT / config_path).exists()
    overrides = [a for a in entry[entry.index("--config") + 2 :] if "=" in a]
    base = load_config(str(ROOT / config_path), [])
    for item in overrides:
        node = base
        *parents, leaf = item.split("=", 1)[0].split(".")
        for part in parents:
            node = node[part]
        assert leaf in node, f"{item} overrides nothing in {config_path}"
    config = load_config(str(ROOT / config_path), overrides)
    assert config["placement"] == {"ingest_nodes": True, "trainer_nodes": True}


def test_runtime_env_keeps_the_local_environment_out() -> None:
    env = load(CLUSTER / "runtime_env.yaml")
    assert ".venv" in env["excludes"]
    assert any("ingest" in p for p in env["pip"])
