"""The deployment files under deploy/: Kubernetes overlays, the KServe resources and the load balancer example.

The overlays are rendered by `kubectl kustomize` (kubectl 1.24 or newer, which embeds kustomize v4 or newer
and reports its version): the tests that need a rendering skip with the reason when no such kubectl is
installed, and fail instead when POSENC_REQUIRE_KUBECTL=1 (CI sets it: no rendering is silently left out).
Every rendered Kubernetes manifest validates, in strict mode (no unknown field anywhere), against the
OpenAPI schemas of a current Kubernetes release bundled in `kubernetes-validate` (offline). The KServe
resources are checked against the fields KServe documents for them (schemas below), and their containers
against the Kubernetes Container schema.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from posenc.service.serving.server import BACKSTOP_MARGIN_SECONDS
from posenc.service.settings import Settings

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "deploy" / "kubernetes" / "overlays"
KSERVE = REPO / "deploy" / "kserve" / "posenc.yaml"
KUBERNETES_VERSION = "1.37.0"
Resource = dict[str, Any]


# kustomize v4 reads `resources:` directories and `patches:` with a path; Debian bookworm's kubectl 1.20
# embeds kustomize v2.0.3, which reads neither.
KUSTOMIZE_MAJOR_NEEDED = 4


@functools.cache
def kubectl_problem() -> str | None:
    """Why `kubectl kustomize` cannot render the overlays here (None: it can)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return "kubectl is not installed (the overlays are rendered with `kubectl kustomize`)"
    done = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True,
                          timeout=60, check=False)
    try:
        version = json.loads(done.stdout).get("kustomizeVersion", "")
    except json.JSONDecodeError:
        version = ""
    match = re.fullmatch(r"v(\d+)\.\d+\.\d+.*", version)
    if match is None or int(match[1]) < KUSTOMIZE_MAJOR_NEEDED:
        return (f"{kubectl} embeds kustomize {version or '(version not reported: kubectl older than 1.24)'}; "
                f"the overlays need kubectl 1.24 or newer (kustomize v{KUSTOMIZE_MAJOR_NEEDED} or newer)")
    return None


@functools.cache
def _kustomize(overlay: str) -> str:
    problem = kubectl_problem()
    if problem is not None:
        if os.environ.get("POSENC_REQUIRE_KUBECTL") == "1":
            pytest.fail(f"POSENC_REQUIRE_KUBECTL=1 but {problem}")
        pytest.skip(problem)
    done = subprocess.run(["kubectl", "kustomize", str(OVERLAYS / overlay)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"kubectl kustomize {overlay}: {done.stderr}"
    return done.stdout


def render(overlay: str) -> list[Resource]:
    """The resources `kubectl kustomize` renders for an overlay, in its order (a fresh copy each call)."""
    return list(yaml.safe_load_all(_kustomize(overlay)))


def rendered(overlay: str) -> dict[str, Resource]:
    return {resource["kind"]: resource for resource in render(overlay)}


def container(resources: dict[str, Resource]) -> Resource:
    containers = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


@pytest.mark.parametrize("overlay", ["cpu", "gpu", "custom-models", "calibrated"])
def test_every_rendered_manifest_validates_strictly(overlay: str) -> None:
    resources = render(overlay)
    assert {r["kind"] for r in resources} == {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler",
                                              "PodDisruptionBudget"}
    for resource in resources:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field() -> None:
    deployment = rendered("cpu")["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def contains(whole: Any, part: Any) -> bool:
    """Whether `part` is in `whole`: maps key by key, lists item by item (each in some item), scalars equal."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and contains(whole[k], v) for k, v in part.items())
    if isinstance(part, list):
        return isinstance(whole, list) and all(any(contains(w, p) for w in whole) for p in part)
    return bool(whole == part)


@pytest.mark.parametrize("overlay", ["gpu", "custom-models"])
def test_overlay_patches_and_images_are_applied(overlay: str) -> None:
    """Every patch file of the overlay is in the rendering of its resource, and the overlay's image tag is set."""
    resources = render(overlay)
    assert container(rendered(overlay))["image"] == f"posenc:{'gpu' if overlay == 'gpu' else 'cpu'}"
    kustomization = yaml.safe_load((OVERLAYS / overlay / "kustomization.yaml").read_text())
    for entry in kustomization["patches"]:
        patch = yaml.safe_load((OVERLAYS / overlay / entry["path"]).read_text())
        (target,) = [r for r in resources
                     if r["kind"] == patch["kind"] and r["metadata"]["name"] == patch["metadata"]["name"]]
        assert contains(target, patch), f"{overlay}/{entry['path']} is not in the rendered {patch['kind']}"
    assert not contains(rendered("cpu")["Deployment"], {"spec": {"template": {"spec": {"volumes": [{"name": "x"}]}}}})


def test_a_missing_kubectl_is_a_skip_or_a_failure_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    kubectl_problem.cache_clear()
    _kustomize.cache_clear()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    try:
        monkeypatch.delenv("POSENC_REQUIRE_KUBECTL", raising=False)
        with pytest.raises(pytest.skip.Exception, match="kubectl is not installed"):
            render("cpu")
        monkeypatch.setenv("POSENC_REQUIRE_KUBECTL", "1")
        with pytest.raises(pytest.fail.Exception, match="POSENC_REQUIRE_KUBECTL=1 but kubectl is not installed"):
            render("cpu")
    finally:
        kubectl_problem.cache_clear()
        _kustomize.cache_clear()


@pytest.mark.parametrize("overlay", ["cpu", "gpu", "custom-models"])
def test_pods_are_locked_down_probed_and_drain(overlay: str) -> None:
    resources = rendered(overlay)
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    main = container(resources)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"]
    assert main["resources"]["requests"]["cpu"] and main["resources"]["limits"]["memory"]
    assert main["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    config = resources["ConfigMap"]["data"]
    # readiness over gRPC health (the service the server reports NOT_SERVING until ready and while draining)
    assert main["readinessProbe"]["grpc"] == {"port": int(config["POSENC_GRPC_PORT"]),
                                              "service": "inference.GRPCInferenceService"}
    assert resources["Deployment"]["spec"]["template"]["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": resources["ConfigMap"]["metadata"]["name"]}}]
    pre_stop = main["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    budget = int(pre_stop[1]) + float(config["POSENC_GRACEFUL_SHUTDOWN_TIMEOUT"]) + BACKSTOP_MARGIN_SECONDS
    assert pod["terminationGracePeriodSeconds"] > budget
    port = int(config["POSENC_PORT"])
    assert main["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"},
                             {"name": "grpc", "containerPort": int(config["POSENC_GRPC_PORT"]), "protocol": "TCP"}]
    assert [p["targetPort"] for p in resources["Service"]["spec"]["ports"]] == ["http", "grpc"]
    selector = resources["Deployment"]["spec"]["selector"]["matchLabels"]
    assert resources["Service"]["spec"]["selector"] == selector
    assert resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    assert resources["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == \
        resources["Deployment"]["metadata"]["name"]


@pytest.mark.parametrize("overlay", ["cpu", "gpu", "custom-models"])
def test_config_map_holds_valid_settings(overlay: str) -> None:
    data = rendered(overlay)["ConfigMap"]["data"]
    fields = {name.lower() for name in Settings.model_fields}
    names = {key.removeprefix("POSENC_").lower() for key in data}
    assert all(key.startswith("POSENC_") for key in data)
    assert names <= fields, f"not settings: {sorted(names - fields)}"
    settings = Settings(**{key.removeprefix("POSENC_").lower(): value for key, value in data.items()})
    assert settings.workers == 1 and settings.host == "0.0.0.0"


def test_gpu_overlay_requests_a_gpu_and_the_gpu_image() -> None:
    resources = rendered("gpu")
    main = container(resources)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert main["image"].endswith(":gpu")
    assert resources["ConfigMap"]["data"]["POSENC_PROVIDERS"] == "cuda"
    assert re.search(r"^ARG ONNXRUNTIME=onnxruntime$", (REPO / "Dockerfile").read_text(), re.M)
    assert "ONNXRUNTIME=onnxruntime-gpu" in (OVERLAYS / "gpu" / "kustomization.yaml").read_text()
    cpu = rendered("cpu")
    assert "nvidia.com/gpu" not in str(cpu) and cpu["ConfigMap"]["data"]["POSENC_PROVIDERS"] == "cpu"


def test_custom_models_overlay_mounts_another_repository() -> None:
    resources = rendered("custom-models")
    mounts = {m["mountPath"]: m for m in container(resources)["volumeMounts"]}
    repository = resources["ConfigMap"]["data"]["POSENC_MODEL_REPOSITORY"]
    assert mounts[repository]["readOnly"] is True
    volumes = {v["name"]: v for v in resources["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert "persistentVolumeClaim" in volumes[mounts[repository]["name"]]


# -- KServe: the fields of the KServe API reference (serving.kserve.io), unknown fields refused

OBJECT: dict[str, Any] = {"type": "object"}
METADATA = {"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                           "labels": OBJECT, "annotations": OBJECT}, "additionalProperties": False}
CONTAINERS = {"type": "array", "minItems": 1, "items": OBJECT}  # each checked against Kubernetes' Container
SERVING_RUNTIME = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1alpha1"}, "kind": {"const": "ServingRuntime"},
        "metadata": METADATA,
        "spec": {"type": "object", "required": ["containers", "supportedModelFormats"], "additionalProperties": False,
                 "properties": {
                     "supportedModelFormats": {"type": "array", "items": {
                         "type": "object", "required": ["name"], "additionalProperties": False,
                         "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                        "autoSelect": {"type": "boolean"}, "priority": {"type": "integer"}}}},
                     "protocolVersions": {"type": "array",
                                          "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
                     "multiModel": {"type": "boolean"}, "disabled": {"type": "boolean"},
                     "containers": CONTAINERS, "volumes": {"type": "array"}, "nodeSelector": OBJECT,
                     "tolerations": {"type": "array"}, "affinity": OBJECT, "labels": OBJECT,
                     "annotations": OBJECT, "imagePullSecrets": {"type": "array"}}}}}
INFERENCE_SERVICE = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"}, "kind": {"const": "InferenceService"},
        "metadata": METADATA,
        "spec": {"type": "object", "required": ["predictor"], "additionalProperties": False, "properties": {
            "predictor": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    # ComponentExtensionSpec
                    "minReplicas": {"type": "integer", "minimum": 0}, "maxReplicas": {"type": "integer"},
                    "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
                    "scaleTarget": {"type": "integer"}, "containerConcurrency": {"type": "integer"},
                    "timeout": {"type": "integer"}, "canaryTrafficPercent": {"type": "integer"},
                    # PodSpec fields used here (the pod spec is inlined in the predictor)
                    "terminationGracePeriodSeconds": {"type": "integer"}, "containers": CONTAINERS,
                    "nodeSelector": OBJECT, "tolerations": {"type": "array"}, "volumes": {"type": "array"},
                    # ModelSpec
                    "model": {"type": "object", "required": ["modelFormat"], "additionalProperties": False,
                              "properties": {
                                  "modelFormat": {"type": "object", "required": ["name"],
                                                  "additionalProperties": False,
                                                  "properties": {"name": {"type": "string"},
                                                                 "version": {"type": "string"}}},
                                  "runtime": {"type": "string"}, "storageUri": {"type": "string"},
                                  "protocolVersion": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]},
                                  "runtimeVersion": {"type": "string"}, "resources": OBJECT, "env": {
                                      "type": "array"}}}}}}}}}


def kserve_documents() -> dict[str, Resource]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(KSERVE.read_text())}


def test_kserve_resources_have_only_documented_fields() -> None:
    docs = kserve_documents()
    assert set(docs) == {"ServingRuntime", "InferenceService"}
    jsonschema.validate(docs["ServingRuntime"], SERVING_RUNTIME)
    jsonschema.validate(docs["InferenceService"], INFERENCE_SERVICE)
    broken = {**docs["InferenceService"], "spec": {"predictor": {"model": {"modelFormat": {"name": "posenc"},
                                                                          "protocol": "v2"}}}}
    with pytest.raises(jsonschema.ValidationError, match="protocol"):
        jsonschema.validate(broken, INFERENCE_SERVICE)


def test_kserve_runtime_speaks_v2_with_the_same_probes_and_a_valid_container() -> None:
    docs = kserve_documents()
    runtime, service = docs["ServingRuntime"]["spec"], docs["InferenceService"]["spec"]["predictor"]
    assert service["model"]["protocolVersion"] == "v2" and runtime["protocolVersions"] == ["v2"]
    assert service["model"]["runtime"] == docs["ServingRuntime"]["metadata"]["name"]
    assert service["model"]["modelFormat"]["name"] in {f["name"] for f in runtime["supportedModelFormats"]}
    (main,) = runtime["containers"]
    assert main["name"] == "kserve-container"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
           "spec": {"containers": runtime["containers"], "volumes": runtime["volumes"],
                    "terminationGracePeriodSeconds": service["terminationGracePeriodSeconds"]}}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    env = {e["name"]: e["value"] for e in main["env"]}
    port = int(env["POSENC_PORT"])
    assert main["ports"][0]["containerPort"] == port
    deployment = container(rendered("cpu"))
    for probe in ("startupProbe", "livenessProbe"):
        assert main[probe]["httpGet"]["path"] == deployment[probe]["httpGet"]["path"]
        assert main[probe]["httpGet"]["port"] == port
    # one HTTP port here (KServe routes to it): readiness is /readyz, what the gRPC health service reports
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    budget = int(main["lifecycle"]["preStop"]["exec"]["command"][1]) + \
        float(env["POSENC_GRACEFUL_SHUTDOWN_TIMEOUT"]) + BACKSTOP_MARGIN_SECONDS
    assert service["terminationGracePeriodSeconds"] > budget
    assert docs["InferenceService"]["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == \
        "RawDeployment"


def test_nginx_example_retries_on_refused_and_unavailable_replicas() -> None:
    text = (REPO / "deploy" / "nginx" / "posenc.conf").read_text()
    (retry,) = re.findall(r"^\s*proxy_next_upstream ([^;]+);", text, re.M)
    assert {"error", "timeout", "http_502", "http_503", "non_idempotent"} <= set(retry.split())
    assert int(re.findall(r"proxy_next_upstream_tries (\d+);", text)[0]) >= 2
    keepalive = float(re.findall(r"keepalive_timeout (\d+)s;", text)[0])
    assert keepalive < Settings().timeout_keep_alive  # nginx lets go of an idle connection before posenc does
