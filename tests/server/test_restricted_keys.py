"""One rule per protocol group on both protocols (issue 55, item 10), against a real `posenc serve`: the gRPC
health Check of a model follows the `health` group's restriction as ModelReady does, while the server's names
(what the kubelet's probe asks, without metadata) stay open; a restriction's key sent twice is refused on both
protocols (HTTP 400, gRPC INVALID_ARGUMENT) naming the header, whichever copy holds the right value."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from posenc.service.testing import ServerProcess

SERVICE = "/inference.GRPCInferenceService/"
MODEL = "rope_attention"
KEY, SECRET = "x-health-key", "right"
GOOD, BAD = (KEY, SECRET), (KEY, "wrong")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    settings = {"log_level": "warning", "restricted_api": f"health:{KEY}={SECRET}"}
    with ServerProcess(settings, grpc=True) as process:
        yield process


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield channel


def check(channel: grpc.Channel, service: str, *metadata: tuple[str, str]) -> tuple[grpc.StatusCode, str, int]:
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), metadata=metadata, timeout=10)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", -1
    return grpc.StatusCode.OK, "", answer.status


def model_ready(channel: grpc.Channel, *metadata: tuple[str, str]) -> grpc.StatusCode:
    call = channel.unary_unary(SERVICE + "ModelReady")
    try:
        call(pb.ModelReadyRequest(name=MODEL).SerializeToString(), metadata=metadata, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_a_models_health_check_follows_the_health_group(channel: grpc.Channel) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    assert model_ready(channel) == grpc.StatusCode.PERMISSION_DENIED
    code, message, _ = check(channel, MODEL)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert f"/grpc.health.v1.Health/Check (service '{MODEL}') is in the restricted protocol group 'health'" in message
    assert KEY in message and SECRET not in message
    assert check(channel, "no_such_model")[0] == grpc.StatusCode.PERMISSION_DENIED  # not even whether it exists
    assert check(channel, MODEL, BAD)[0] == grpc.StatusCode.PERMISSION_DENIED
    assert check(channel, MODEL, GOOD) == (grpc.StatusCode.OK, "", serving)
    assert check(channel, "no_such_model", GOOD)[0] == grpc.StatusCode.NOT_FOUND
    assert model_ready(channel, GOOD) == grpc.StatusCode.OK


def test_the_servers_health_stays_open_to_probes(channel: grpc.Channel) -> None:
    """The kubelet's gRPC probe sends no metadata: the server's names answer without the key."""
    serving = health_pb2.HealthCheckResponse.SERVING
    assert check(channel, "") == (grpc.StatusCode.OK, "", serving)
    assert check(channel, "inference.GRPCInferenceService") == (grpc.StatusCode.OK, "", serving)


def test_a_models_health_watch_follows_the_health_group(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        next(stub.Watch(health_pb2.HealthCheckRequest(service=MODEL), timeout=10))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=MODEL), metadata=(GOOD,), timeout=10)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


@pytest.mark.parametrize("pair", [(GOOD, BAD), (BAD, GOOD), (GOOD, GOOD)], ids=["right-first", "right-last", "same"])
def test_a_key_twice_is_invalid_argument_over_grpc(channel: grpc.Channel, pair: tuple[tuple[str, str], ...]) -> None:
    for method in ("ServerLive", "ModelReady"):
        call = channel.unary_unary(SERVICE + method)
        request = pb.ModelReadyRequest(name=MODEL).SerializeToString() if method == "ModelReady" else b""
        with pytest.raises(grpc.RpcError) as refused:
            call(request, metadata=pair, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert f"the header '{KEY}' (a key of POSENC_RESTRICTED_API) is sent more than once" in refused.value.details()
    code, message, _ = check(channel, MODEL, *pair)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and KEY in message


def http_get(server: ServerProcess, path: str, *headers: tuple[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest("GET", path)
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("pair", [(GOOD, BAD), (BAD, GOOD), (GOOD, GOOD)], ids=["right-first", "right-last", "same"])
def test_a_key_twice_is_400_over_http(server: ServerProcess, pair: tuple[tuple[str, str], ...]) -> None:
    assert http_get(server, "/v2/health/live", GOOD)[0] == 200
    assert http_get(server, "/v2/health/live", BAD)[0] == 403
    for path in ("/v2/health/live", f"/v2/models/{MODEL}/ready"):
        status, body = http_get(server, path, *pair)
        assert status == 400, (path, body)
        answer = json.loads(body)
        assert answer["type"] == "bad_request"
        assert answer["error"].startswith(f"the header '{KEY}' (a key of POSENC_RESTRICTED_API) is sent more than once")
        assert SECRET not in answer["error"]
    # a path outside every protocol group reads no key: its duplicates are no matter
    assert http_get(server, "/healthz", *pair)[0] == 200
