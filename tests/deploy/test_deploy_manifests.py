"""The deployment files under deploy/: Kubernetes overlays, the KServe resources and the load balancer example.

Every rendered Kubernetes manifest validates, in strict mode (no unknown field anywhere), against the
OpenAPI schemas of a current Kubernetes release bundled in `kubernetes-validate` (offline). The KServe
resources are checked against the fields KServe documents for them (schemas below), and their containers
against the Kubernetes Container schema.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from posenc.service.http.server import BACKSTOP_MARGIN_SECONDS
from posenc.service.settings import Settings
from tests.kustomize_lite import render

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "deploy" / "kubernetes" / "overlays"
KSERVE = REPO / "deploy" / "kserve" / "posenc.yaml"
KUBERNETES_VERSION = "1.37.0"
Resource = dict[str, Any]


def rendered(overlay: str) -> dict[str, Resource]:
    return {resource["kind"]: resource for resource in render(OVERLAYS / overlay)}


def container(resources: dict[str, Resource]) -> Resource:
    containers = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


@pytest.mark.parametrize("overlay", ["cpu", "gpu", "custom-models"])
def test_every_rendered_manifest_validates_strictly(overlay: str) -> None:
    resources = render(OVERLAYS / overlay)
    assert {r["kind"] for r in resources} == {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler",
                                              "PodDisruptionBudget"}
    for resource in resources:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field() -> None:
    deployment = rendered("cpu")["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its kustomize) is not installed")
@pytest.mark.parametrize("overlay", ["cpu", "gpu", "custom-models"])
def test_the_renderer_agrees_with_kubectl_kustomize(overlay: str) -> None:
    done = subprocess.run(["kubectl", "kustomize", str(OVERLAYS / overlay)], capture_output=True, text=True,
                          timeout=60, check=True)
    def key(r: Resource) -> tuple[str, str]:
        return r["kind"], r["metadata"]["name"]
    assert sorted(yaml.safe_load_all(done.stdout), key=key) == sorted(render(OVERLAYS / overlay), key=key)


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
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = resources["ConfigMap"]["data"]
    assert resources["Deployment"]["spec"]["template"]["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": resources["ConfigMap"]["metadata"]["name"]}}]
    pre_stop = main["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    budget = int(pre_stop[1]) + float(config["POSENC_GRACEFUL_SHUTDOWN_TIMEOUT"]) + BACKSTOP_MARGIN_SECONDS
    assert pod["terminationGracePeriodSeconds"] > budget
    port = int(config["POSENC_PORT"])
    assert main["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert resources["Service"]["spec"]["ports"][0]["targetPort"] == "http"
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
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert main[probe]["httpGet"]["path"] == deployment[probe]["httpGet"]["path"]
        assert main[probe]["httpGet"]["port"] == port
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
