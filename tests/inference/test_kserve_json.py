"""Large JSON tensor data read and written a chunk at a time (posenc.service.inference.codecs.kserve_json): the same
arrays, the same 400s and byte-identical JSON as the generic path, and memory within the reservation."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pydantic_core
import pytest

import posenc.service.inference.codecs.kserve_request as kserve
from posenc.models.dtypes import BFLOAT16
from posenc.service.codec.encode import json_values
from posenc.service.errors import BadRequest, ClientClosedRequest
from posenc.service.inference.codecs import kserve_json
from posenc.service.inference.codecs.kserve_json import json_data, lift_data
from posenc.service.inference.codecs.kserve_request import InferRequest, RequestedOutput, parse_infer_request
from posenc.service.inference.codecs.kserve_response import encode_infer_response_parts
from posenc.service.inference.dataplane import JSON_NUMBER_BYTES, OFFLOAD_WORK, memory_needed, offload
from posenc.service.inference.routes import HttpInferCall, PartsResponse
from posenc.service.inference.runtime.repository import LoadedModel
from posenc.service.request_kit.bodies import read_aligned_body
from posenc.service.testing import attention_inputs, kserve_request
from tests.conftest import running_client

RNG = np.random.default_rng(23)


def _values(dtype: Any, n: int) -> np.ndarray:
    x = RNG.standard_normal(n) * 10.0 ** RNG.integers(-12, 12, n)
    if np.dtype(dtype).kind == "b":
        return x > 0
    if np.dtype(dtype).kind in "iu":
        return np.clip(x * 1000, -1e6, 1e6).astype(np.int64).astype(dtype)
    with np.errstate(over="ignore"):
        a = x.astype(dtype)
    a[::97], a[::101], a[::103], a[5:6] = np.nan, np.inf, -np.inf, -0.0
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("n", [0, 1, kserve_json.CHUNK_NUMBERS, 2 * kserve_json.CHUNK_NUMBERS + 7])
def test_written_data_is_byte_identical_to_the_whole_list(dtype: Any, n: int) -> None:
    array = _values(dtype, n)
    assert bytes(json_data(array)) == pydantic_core.to_json(json_values(array))


def test_a_response_with_json_outputs_is_the_document_it_always_was() -> None:
    outputs = {"a": _values(np.float32, 70_000).reshape(7, 10_000), "b": _values(np.int64, 3),
               "c": _values(BFLOAT16, 5)}
    request = InferRequest("id-\"data\"", [], [RequestedOutput("a", False), RequestedOutput("b", True),
                                               RequestedOutput("c", False)], False)
    parts, headers = encode_infer_response_parts("m", "1", request, outputs, list(outputs))
    body = b"".join(parts)
    header = body[:int(headers["Inference-Header-Content-Length"])]
    expected = {"model_name": "m", "model_version": "1", "id": "id-\"data\"", "outputs": [
        {"name": "a", "datatype": "FP32", "shape": [7, 10_000], "data": json_values(outputs["a"])},
        {"name": "b", "datatype": "INT64", "shape": [3], "parameters": {"binary_data_size": 24}},
        {"name": "c", "datatype": "BF16", "shape": [5], "data": json_values(outputs["c"])}]}
    assert header == pydantic_core.to_json(expected)
    assert body[len(header):] == outputs["b"].tobytes()
    assert int(headers["Content-Length"]) == len(body)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Every body lifted, lists of 16 bytes and more, parsed 64 bytes at a time; counts the bodies parsed the
    generic way (after a fallback)."""
    monkeypatch.setattr(kserve, "LIFT_MIN_BYTES", 0)
    monkeypatch.setattr(kserve_json, "SPAN_MIN_BYTES", 16)
    monkeypatch.setattr(kserve_json, "CHUNK_BYTES", 64)
    calls = {"generic": 0}
    original = kserve._load_json_header

    def counting(raw: bytes | bytearray) -> dict[str, Any]:
        calls["generic"] += 1
        return original(raw)

    monkeypatch.setattr(kserve, "_load_json_header", counting)
    return calls


def _outcome(body: bytes) -> tuple[str, Any]:
    try:
        parsed = parse_infer_request(body, None)
    except BadRequest as error:
        return "400", str(error)
    return "ok", [(t.name, t.array.dtype.str, t.array.shape, t.array.tobytes()) for t in parsed.inputs]


def _generic(body: bytes) -> tuple[str, Any]:
    lift = kserve.LIFT_MIN_BYTES
    kserve.LIFT_MIN_BYTES = 1 << 62
    try:
        return _outcome(body)
    finally:
        kserve.LIFT_MIN_BYTES = lift


FLOATS = ",".join(repr(float(v)) for v in RNG.standard_normal(300))
INTS = ",".join(str(int(v)) for v in RNG.integers(-1000, 1000, 300))


def _request(data: str, datatype: str = "FP32", count: int | None = None, more: str = "") -> bytes:
    count = data.count(",") + 1 if count is None else count
    return (f'{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":[{count}],"data":[{data}]}}{more}]}}').encode()


# (body, answered by the lifted path: True, or by the generic path after a fallback: False)
CASES: list[tuple[str, bytes, bool]] = [
    ("fp32", _request(FLOATS), True), ("fp16", _request(FLOATS, "FP16"), True),
    ("bf16", _request(FLOATS, "BF16"), True), ("fp64", _request(FLOATS, "FP64"), True),
    ("ints as fp32", _request(INTS), True), ("int32", _request(INTS, "INT32"), True),
    ("mixed ints and floats", _request(INTS + ",0.5"), True), ("newlines", _request(FLOATS.replace(",", ",\n")), True),
    ("out of int8 range", _request(INTS, "INT8"), True), ("count", _request(FLOATS, count=5), True),
    ("floats for int32", _request(FLOATS, "INT32"), False), ("numbers for bool", _request(INTS, "BOOL"), False),
    ("trailing comma", _request(FLOATS + ",", count=301), False),
    ("empty element", _request(FLOATS.replace(",", ",,", 1)), False),
    ("no comma", _request(FLOATS.replace(",", " ", 1)), False), ("leading zero", _request("01," + FLOATS), False),
    ("bare dot", _request(".5," + FLOATS), False), ("lone minus", _request(FLOATS + ",-"), False),
    ("int over 2**24 in fp32", _request(INTS + ",33554433"), False),
    ("beyond uint64", _request(INTS + f",{2**64}", "UINT64"), False),
    ("an error elsewhere", _request(FLOATS).replace(b'"shape"', b'"shapes"'), True),
    ("truncated", _request(FLOATS)[:-3], False), ("trailing bytes", _request(FLOATS) + b"x", False),
    ("duplicate input", _request(FLOATS, more=',{"name":"x","datatype":"FP32","shape":[1],"data":[1]}'), True),
    ("a wrong count and a syntax error", _request(FLOATS.replace(",", ",,", 1), count=5), False),
    ("over uint8 range only above", _request(",".join(str(v) for v in range(200, 500)), "UINT8"), True),
]


@pytest.mark.parametrize(("body", "lifted"), [(body, lifted) for _, body, lifted in CASES],
                         ids=[name for name, *_ in CASES])
def test_lifted_lists_answer_as_the_generic_parser_does(body: bytes, lifted: bool,
                                                       small_chunks: dict[str, int]) -> None:
    answer = _outcome(body)
    assert small_chunks["generic"] == (0 if lifted else 1)
    assert answer == _generic(body)


def _traced(work: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def model() -> Iterator[LoadedModel]:
    with running_client(max_queue_delay_us=0) as client:
        loaded = client.app.state.process.engine.models["rope_attention"]  # type: ignore[attr-defined]
        assert isinstance(loaded, LoadedModel)
        yield loaded


def _inputs() -> dict[str, np.ndarray]:
    tensors = attention_inputs(8, 8, 64, 4, 256, seed=1)
    return {k: (np.round(v * 8) / 8).astype(v.dtype) if v.dtype == np.float32 else v for k, v in tensors.items()}


@pytest.mark.parametrize("kind", ["json in, json out", "binary in, json out", "json in, binary out"])
def test_a_request_holds_no_more_than_it_reserves(kind: str, model: LoadedModel) -> None:
    """Peak bytes allocated (tracemalloc) while parsing, making outputs and encoding the answer stay within the
    reservation beyond the body: 2 x the body reserved before reading it, grown to `memory_needed`."""
    request = kserve_request(_inputs(), binary=kind.startswith("binary"), binary_output=kind.endswith("binary out"))
    body = request.body
    parse = "Inference-Header-Content-Length" in request.headers

    def work() -> None:
        parsed = parse_infer_request(body, request.headers.get("Inference-Header-Content-Length") if parse else None)
        inputs = {t.name: t.array for t in parsed.inputs}
        outputs = {out.name: np.full(model.output_shape(out.name, inputs) or (0,), 0.123456789, np.float32)
                   for out in model.config.outputs}
        encode_infer_response_parts(model.name, "1", parsed, outputs, model.config.output_names)

    _, peak = _traced(work)
    parsed = parse_infer_request(body, request.headers.get("Inference-Header-Content-Length") if parse else None)
    inputs = {t.name: t.array for t in parsed.inputs}
    reserved = max(3 * len(body), memory_needed(body, model, parsed, inputs))
    assert peak <= reserved - len(body), (peak, reserved, len(body))


@pytest.mark.parametrize(("binary", "binary_output"), [(False, False), (True, False), (False, True), (True, True)])
def test_memory_needed_counts_the_body_the_decoded_inputs_the_outputs_and_their_json(
        model: LoadedModel, binary: bool, binary_output: bool) -> None:
    arrays = _inputs()
    request = kserve_request(arrays, binary=binary, binary_output=binary_output)
    header_length = request.headers.get("Inference-Header-Content-Length")

    async def sent() -> AsyncIterator[bytes]:
        yield request.body

    # read as the server reads it: the binary section on a boundary (an unaligned input would be copied)
    body = asyncio.run(read_aligned_body(str(len(request.body)), sent(), len(request.body), int(header_length or 0)))
    parsed = parse_infer_request(body, header_length)
    inputs = {t.name: t.array for t in parsed.inputs}
    elements = [math.prod(model.output_shape(out.name, inputs) or ()) for out in model.config.outputs]
    decoded = 0 if binary else sum(array.nbytes for array in arrays.values())  # binary inputs: views of the body
    text = 0 if binary_output else sum(elements) * JSON_NUMBER_BYTES
    assert memory_needed(body, model, parsed, inputs) == len(body) + decoded + 4 * sum(elements) + text


@pytest.mark.parametrize("binary_output", [False, True])
def test_only_outputs_encoded_as_json_are_answer_work(binary_output: bool) -> None:
    """What the offload rule weighs for an HTTP answer: JSON encoding grows with the outputs, binary outputs are sent
    as views."""
    arrays = _inputs()
    request = kserve_request(arrays, binary_output=binary_output)
    parsed = parse_infer_request(request.body, request.headers.get("Inference-Header-Content-Length"))
    outputs = {"output": np.zeros((4, 256, 64), np.float32)}
    call = HttpInferCall.__new__(HttpInferCall)
    assert call.encode_work(parsed, outputs) == (0 if binary_output else outputs["output"].nbytes)


def test_json_data_memory_before_and_after_the_chunks() -> None:
    """The generic path held 32 bytes per number in Python objects; a chunk at a time holds the text."""
    array = np.full(1 << 20, 0.1234567, np.float32)  # [1 Mi] numbers, about 20 bytes each as JSON
    text, peak = _traced(lambda: json_data(array))
    assert len(text) <= array.size * JSON_NUMBER_BYTES
    assert peak <= 1.3 * len(text) + (8 << 20), (peak, len(text))
    _, whole = _traced(lambda: pydantic_core.to_json(json_values(array)))
    assert whole > 2 * peak  # the measure can tell the two apart


def test_a_large_json_body_parses_within_its_reservation() -> None:
    """8 MiB of "0.5," (2 Mi numbers): the body, and at most 2 x its size more (3 x reserved in all)."""
    count = (8 << 20) // 4
    body = (b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d],"data":[' % count
            + b"0.5," * (count - 1) + b"0.5]}]}")
    parsed, peak = _traced(lambda: parse_infer_request(body, None))
    assert parsed.inputs[0].array.shape == (count,) and bool((parsed.inputs[0].array == 0.5).all())
    assert peak <= 2 * len(body), (peak, len(body))


# --- linear time, and no work for a client that left ---------------------------------------------------------------

PATHOLOGICAL = {  # bodies the scan for large data lists must get through in one pass
    "data lists never closed": b'"data":[' * (1 << 17),
    "numbers, then a string": (b'"data":[' + b"1," * 40_000 + b'"x",') * 13,
    "spaces after the key": (b'"data"' + b" " * 65_536) * 16,
}


@pytest.mark.parametrize("body", list(PATHOLOGICAL.values()), ids=list(PATHOLOGICAL))
def test_the_large_body_scan_is_linear(body: bytes) -> None:
    """The same body at 1x and 8x: the scan's CPU time grows at most about 8-fold (it grew 64-fold, quadratic)."""
    def cpu(text: bytes) -> float:
        start = time.process_time()
        for _ in range(3):
            lift_data(memoryview(text))
        return time.process_time() - start

    cpu(body)  # warm
    small, large = cpu(body), cpu(body * 8)
    assert large <= 16 * max(small, 0.002), (small, large)


LARGE_LIST = ",".join([FLOATS] * 400)  # one list of 2 MB: lifted, parsed a chunk at a time


@contextlib.contextmanager
def _client_gone(gone: Callable[[], bool]) -> Iterator[None]:
    """Parses in this block ask `gone` whether their client has left, as the infer route sets it; each must stop
    with a 499."""
    token = kserve_json.CLIENT_GONE.set(gone)
    try:
        with pytest.raises(ClientClosedRequest):
            yield
    finally:
        kserve_json.CLIENT_GONE.reset(token)


def test_the_scan_stops_between_lists_when_the_client_has_left() -> None:
    body = _request(LARGE_LIST, more=',{"name":"y","datatype":"FP32","shape":[1],"data":[1]}')
    with _client_gone(lambda: True):
        lift_data(memoryview(body))


def test_a_list_stops_being_parsed_when_its_client_leaves_during_it() -> None:
    """One list (one check in the scan, the client still there), then the client leaves: the list's chunks
    stop."""
    calls = 0

    def gone() -> bool:
        nonlocal calls
        calls += 1
        return calls > 1

    with _client_gone(gone):
        parse_infer_request(_request(LARGE_LIST), None)


def test_placeholders_cannot_be_guessed() -> None:
    """A lifted list's placeholder holds a random nonce, so no string a client sends can name another list."""
    body = memoryview(_request(LARGE_LIST))
    assert lift_data(body)[1].keys().isdisjoint(lift_data(body)[1].keys())


def test_a_parse_stops_when_its_client_has_left() -> None:
    body = _request(LARGE_LIST)
    with _client_gone(lambda: True):
        parse_infer_request(body, None)
    assert parse_infer_request(body, None).inputs[0].array.size == 300 * 400


@pytest.mark.parametrize(("size", "stopped"), [(OFFLOAD_WORK + 1, True), (OFFLOAD_WORK, False)])
def test_a_large_parse_stops_once_the_client_has_left(size: int, stopped: bool) -> None:
    """A parse of more than OFFLOAD_WORK runs in a worker thread, watched: the client's disconnect (the next ASGI
    message once the body is read) stops it with a 499. A small one runs on the event loop, unwatched."""
    async def scenario() -> str:
        messages: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        call = HttpInferCall.__new__(HttpInferCall)
        call.request = SimpleNamespace(receive=messages.get)  # type: ignore[assignment]
        asyncio.get_running_loop().call_later(0.05, messages.put_nowait, {"type": "http.disconnect"})

        def parse() -> str:
            deadline = time.monotonic() + (2 if stopped else 0.2)
            while time.monotonic() < deadline:
                kserve_json.stop_if_client_gone()
                time.sleep(0.005)
            return "parsed"

        try:
            return await offload(size, call, parse)
        except ClientClosedRequest:
            return "stopped"

    assert asyncio.run(scenario()) == ("stopped" if stopped else "parsed")


def test_an_answer_in_parts_ends_with_its_last_part() -> None:
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    parts = [b'{"outputs": []}', memoryview(b"abcd"), b"efgh"]
    response = PartsResponse(parts, {"content-length": "23"}, release=lambda: None)
    asyncio.run(response.send_body({"type": "http"}, None, send))  # type: ignore[arg-type]
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 3
    assert [m["more_body"] for m in sent[1:]] == [True, True, False]
    assert [bytes(m["body"]) for m in sent[1:]] == [bytes(part) for part in parts]  # type: ignore[call-overload]
