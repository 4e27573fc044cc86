"""The cluster configs name the resources and entry points the code uses."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.train_jobs import harness

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the backport mypy and pytest already depend on
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "cluster"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_script(path: Path) -> Any:
    """A job script loaded as a module (its ``if __name__ == "__main__"`` part not run)."""
    spec = importlib.util.spec_from_file_location(f"job_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    assert harness.INGEST_RESOURCE in types["ingest-cpu"]["resources"]
    assert harness.TRAINER_RESOURCE in types["trainer-gpu"]["resources"]
    assert "GPU" in types["trainer-gpu"]["resources"]
    assert harness.INGEST_RESOURCE not in types["trainer-gpu"]["resources"]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_groups_declare_the_resources(name: str) -> None:
    doc = load(CLUSTER / "kuberay" / name)
    spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
    by_name = groups(spec)
    assert harness.INGEST_RESOURCE in start_resources(by_name["ingest"]["rayStartParams"])
    assert harness.TRAINER_RESOURCE in start_resources(by_name["trainer"]["rayStartParams"])
    gpu = by_name["trainer"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" in gpu


def test_rayjob_entrypoint_runs_an_existing_job_with_valid_overrides() -> None:
    entry = shlex.split(load(CLUSTER / "kuberay" / "rayjob.yaml")["spec"]["entrypoint"])
    assert entry[:2] == ["python", "train/lm.py"]
    assert "--config" not in entry, "the job's config lies next to the script"
    module = load_script(ROOT / entry[1])
    assert isinstance(module.JOB, harness.Job)
    config_path = module.CONFIG
    assert config_path == ROOT / "train" / "configs" / "lm.yaml"
    overrides = entry[2:]
    base = harness.load_config(config_path, [])
    for item in overrides:
        assert "=" in item, f"{item!r} in the entrypoint is not KEY=VALUE"
        node = base
        *parents, leaf = item.split("=", 1)[0].split(".")
        for part in parents:
            node = node[part]
        assert leaf in node, f"{item} overrides nothing in {config_path}"
    config = harness.load_config(config_path, overrides)
    assert config["placement"] == {"ingest_nodes": True, "trainer_nodes": True}


def test_the_training_jobs_are_scripts_left_out_of_the_package() -> None:
    """train/ runs from the checkout or the uploaded working dir; the wheel holds the library."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = setuptools["packages"]["find"]["include"]

    def packaged(name: str) -> bool:  # setuptools matches package names with fnmatchcase
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in include)

    assert packaged("ingest") and packaged("ingest.integrations")
    assert not any(packaged(d) for d in ("train", "tests", "benchmarks", "scripts", "cluster"))
    assert "package-data" not in setuptools
    # The three jobs and the harness they share, all left out of the wheel.
    scripts = sorted(p.name for p in (ROOT / "train").glob("*.py"))
    assert scripts == ["harness.py", "image.py", "lm.py", "pretrain.py"]
    assert not (ROOT / "ingest" / "integrations" / "jobs.py").exists()


def project_dependencies_but_ray_and_torch() -> list[str]:
    """pyproject.toml's dependencies that the cluster image does not carry."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps: list[str] = project["dependencies"]
    return [d for d in deps if re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0] not in ("ray", "torch")]


def test_runtime_env_uploads_the_code_and_pips_the_other_dependencies() -> None:
    env = load(CLUSTER / "runtime_env.yaml")
    assert env["working_dir"] == "."
    assert ".venv" in env["excludes"]
    # No `ingest @ file://.`: pip cannot take a relative file URI (the job would fail before
    # it starts); the code comes with the working dir instead.
    assert env["pip"] == project_dependencies_but_ray_and_torch()
    assert not any(p.split("[")[0].startswith(("ray", "torch", "ingest")) for p in env["pip"])


def test_rayjob_runtime_env_matches_the_shipped_one() -> None:
    shipped = load(CLUSTER / "runtime_env.yaml")
    job_env = yaml.safe_load(load(CLUSTER / "kuberay" / "rayjob.yaml")["spec"]["runtimeEnvYAML"])
    assert job_env["pip"] == shipped["pip"]
    assert job_env["env_vars"] == shipped["env_vars"]
    # A RayJob has no local directory to upload: its working dir is a zip the cluster reads.
    assert job_env["working_dir"].endswith(".zip")


def test_rayjob_and_raycluster_run_one_image_per_group_kind() -> None:
    """Both manifests name the same images: one with Ray and torch for CPU, one for GPU."""
    cluster = load(CLUSTER / "kuberay" / "raycluster.yaml")["spec"]
    job = load(CLUSTER / "kuberay" / "rayjob.yaml")["spec"]["rayClusterSpec"]

    def images(spec: dict[str, Any]) -> dict[str, str]:
        out = {"head": spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]}
        for name, group in groups(spec).items():
            out[name] = group["template"]["spec"]["containers"][0]["image"]
        return out

    assert images(cluster) == images(job)
    assert images(job)["trainer"].endswith("-gpu")
    assert not images(job)["ingest"].endswith("-gpu")
