"""The gRPC side of the deployment files: the image exposes POSENC_GRPC_PORT's default, and the KServe variant with
protocolVersion grpc-v2 (deploy/kserve/posenc-grpc.yaml) is the HTTP one's twin with an h2c port and the kubelet's
gRPC readiness probe, validated as the HTTP one is."""

from __future__ import annotations

import re

import jsonschema
import kubernetes_validate
import yaml

from posenc.service.settings import Settings
from tests.deploy.test_deploy_manifests import (
    INFERENCE_SERVICE,
    KSERVE,
    KUBERNETES_VERSION,
    REPO,
    SERVING_RUNTIME,
    kserve_documents,
)

GRPC_KSERVE = KSERVE.with_name("posenc-grpc.yaml")


def test_image_exposes_the_grpc_port() -> None:
    (exposed,) = re.findall(r"^EXPOSE (.+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert str(Settings.model_fields["grpc_port"].default) in exposed.split()


def test_kserve_grpc_variant_is_the_http_one_over_grpc_v2() -> None:
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(GRPC_KSERVE.read_text())}
    jsonschema.validate(docs["ServingRuntime"], SERVING_RUNTIME)
    jsonschema.validate(docs["InferenceService"], INFERENCE_SERVICE)
    runtime, predictor = docs["ServingRuntime"]["spec"], docs["InferenceService"]["spec"]["predictor"]
    assert runtime["protocolVersions"] == ["grpc-v2"] and predictor["model"]["protocolVersion"] == "grpc-v2"
    assert predictor["model"]["runtime"] == docs["ServingRuntime"]["metadata"]["name"]
    (main,) = runtime["containers"]
    env = {e["name"]: e["value"] for e in main["env"]}
    grpc_port, http_port = int(env["POSENC_GRPC_PORT"]), int(env["POSENC_PORT"])
    assert main["ports"] == [{"name": "h2c", "containerPort": grpc_port, "protocol": "TCP"}]
    assert main["readinessProbe"]["grpc"] == {"port": grpc_port}
    for probe in ("startupProbe", "livenessProbe"):
        assert main[probe]["httpGet"] == {"path": "/healthz", "port": http_port}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
           "spec": {"containers": runtime["containers"], "volumes": runtime["volumes"]}}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    Settings(**{name.removeprefix("POSENC_").lower(): value for name, value in env.items()})
    # the rest is the HTTP variant's: same image, resources, security, drain and deployment mode
    http = kserve_documents()
    same = {**http["ServingRuntime"]["spec"]["containers"][0]}
    for key in ("ports", "env", "readinessProbe"):
        same.pop(key), main.pop(key)
    assert main == same
    assert docs["InferenceService"]["metadata"]["annotations"] == http["InferenceService"]["metadata"]["annotations"]
