"""The manifests' memory and calibration follow the service's own figures: each pod's memory request is the peak
its settings bound (`posenc.service.budget.memory_bound`, docs/operations.md "Memory"), under its limit with
headroom, and the calibrated overlay mounts the rules file where POSENC_CALIBRATION_RULES reads it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from posenc.service.budget import memory_bound
from posenc.service.inference.runtime.calibration_cache import parse_entries
from posenc.service.settings import Settings
from tests.deploy.test_deploy_manifests import OVERLAYS, REPO, render

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(text: str) -> int:
    """A Kubernetes memory quantity in bytes (binary suffixes, as the manifests write them)."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", text)
    assert match, f"unexpected quantity {text}"
    return int(match[1]) * UNITS.get(match[2] or "", 1)


def _settings(env: dict[str, str]) -> Settings:
    return Settings(**{key.removeprefix("POSENC_").lower(): value for key, value in env.items()
                       if key.startswith("POSENC_")})


def _pod(overlay: str) -> tuple[dict[str, Any], Settings, list[dict[str, Any]]]:
    resources = render(overlay)
    deployment = next(r for r in resources if r["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config = next(r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == "posenc-config")
    return container, _settings(config["data"]), resources


@pytest.mark.parametrize("overlay", ["cpu", "custom-models", "calibrated"])
def test_a_cpu_pod_requests_its_bound_and_is_limited_above_it(overlay: str) -> None:
    container, settings, _ = _pod(overlay)
    bound = memory_bound(settings)
    assert quantity(container["resources"]["requests"]["memory"]) == bound
    assert quantity(container["resources"]["limits"]["memory"]) >= 1.2 * bound


def test_the_gpu_pod_requests_at_least_its_bound() -> None:
    container, settings, _ = _pod("gpu")
    assert quantity(container["resources"]["requests"]["memory"]) >= memory_bound(settings)


@pytest.mark.parametrize("file", ["posenc.yaml", "posenc-grpc.yaml"])
def test_the_kserve_runtime_requests_its_bound(file: str) -> None:
    runtime = next(doc for doc in yaml.safe_load_all((REPO / "deploy" / "kserve" / file).read_text())
                   if doc["kind"] == "ServingRuntime")
    (container,) = runtime["spec"]["containers"]
    settings = _settings({env["name"]: env["value"] for env in container.get("env", []) if "value" in env})
    assert quantity(container["resources"]["requests"]["memory"]) == memory_bound(settings)
    assert quantity(container["resources"]["limits"]["memory"]) >= 1.2 * memory_bound(settings)


def test_the_calibrated_overlay_mounts_its_rules_where_the_setting_reads_them() -> None:
    container, settings, resources = _pod("calibrated")
    rules = next(r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] != "posenc-config")
    assert rules["metadata"]["name"].startswith("posenc-calibration-")  # kustomize's content hash: a new rollout
    volumes = resources[[r["kind"] for r in resources].index("Deployment")]["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if "configMap" in v]
    assert volume["configMap"]["name"] == rules["metadata"]["name"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    path = Path(settings.calibration_rules)
    assert path.parent == Path(mount["mountPath"]) and path.name in rules["data"]
    assert parse_entries(rules["data"][path.name].encode()) == {}  # the placeholder: every pod measures
    assert (OVERLAYS / "calibrated" / path.name).read_text() == rules["data"][path.name]


def test_the_base_pod_mounts_the_rules_optionally() -> None:
    _, settings, resources = _pod("cpu")
    deployment = next(r for r in resources if r["kind"] == "Deployment")
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert volume["configMap"] == {"name": "posenc-calibration", "optional": True}
    assert settings.calibration_rules.startswith("/etc/posenc/calibration/")
