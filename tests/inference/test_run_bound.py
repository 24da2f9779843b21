"""The bound on one onnxruntime run's memory: 413 before running, chunked requests, batches and concurrent runs
under the bound, allocation failures as 507 with the session still usable, provider options, I/O binding."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from posenc.service.budget import MemoryBudget
from posenc.service.inference.runtime.batcher import Batcher
from posenc.service.inference.runtime.devices import CPU, CUDA, cuda_memory_info, process_memory_bytes
from posenc.service.inference.runtime.engine import Engine, run_model
from posenc.service.inference.runtime.repository import LoadedModel, _with_options
from posenc.service.inference.runtime.run_bound import AttentionCost, default_run_bytes
from posenc.service.settings import Settings
from posenc.service.testing import kserve_request
from tests.conftest import running_client
from tests.onnx_models import REPOSITORY, random_inputs, run, session

HEADS = {"rope_attention": (8, 8, 64), "llama3_1_attention": (32, 8, 128)}


def _binary(inputs: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    request = kserve_request(inputs, binary_output=True)
    return request.body, request.headers


def test_attention_cost_matches_onnxruntime_cuda_request() -> None:
    # onnxruntime's CUDA Attention asked its arena for exactly this much for llama3_1 B=1 S=8192
    assert AttentionCost(32).run_bytes(1, 8192) == 17_179_869_184


@pytest.mark.parametrize("heads", [1, 8, 32])
@pytest.mark.parametrize("limit", [1, 4096, 262_144, 6_442_450_944, 17_179_869_183])
def test_largest_seq_is_the_longest_that_fits(heads: int, limit: int) -> None:
    cost = AttentionCost(heads)
    seq = cost.largest_seq(limit)
    assert cost.run_bytes(1, seq) <= limit < cost.run_bytes(1, seq + 1)
    assert cost.largest_rows(seq + 1, limit) == 0


def test_default_bound_follows_this_process_memory() -> None:
    assert process_memory_bytes() > 0
    assert default_run_bytes(on_cuda=False) == process_memory_bytes() // 4
    assert Engine(Settings(model_repository=REPOSITORY)).run_budget.capacity == process_memory_bytes() // 4


@pytest.mark.parametrize("model", sorted(HEADS))
def test_over_the_bound_is_413_naming_the_longest_sequence_that_fits(model: str) -> None:
    hq, hkv, dim = HEADS[model]
    fits = 24
    limit = AttentionCost(hq).run_bytes(1, fits)
    with running_client(max_run_bytes=limit) as client:
        body, headers = _binary(random_inputs(hq, hkv, dim, 1, fits + 1))
        r = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
        assert r.status_code == 413, r.text
        message = r.json()["error"]
        assert r.json()["type"] == "too_large"
        assert "POSENC_MAX_RUN_BYTES" in message and f"{limit:,}" in message
        assert f"the longest sequence that fits is {fits}" in message
        assert client.get(f"/v2/models/{model}/stats").json()["model_stats"][0]["execution_count"] == 0
        inputs = random_inputs(hq, hkv, dim, 3, fits)  # three rows of the longest length: one row per run
        body, headers = _binary(inputs)
        r = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
        assert r.status_code == 200, r.text
        stats = client.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (3, 3)
        head = int(r.headers["Inference-Header-Content-Length"])
        expected = run(session(REPOSITORY / model / "model.onnx"), inputs)
        output = np.frombuffer(r.content[head:], dtype=np.float32).reshape(expected.shape)
        np.testing.assert_allclose(output, expected, atol=1e-5, rtol=1e-5)


def test_llama3_1_at_8192_is_413_under_the_default_bound_never_500(monkeypatch: pytest.MonkeyPatch) -> None:
    """One row needs 17 GB of scores: with the default bound (a quarter of RAM) on a machine of 32 GiB it is
    refused before running. The RAM figure is set, so the 413 path runs on machines of any size."""
    ram = 32 << 30
    monkeypatch.setattr("posenc.service.inference.runtime.run_bound.process_memory_bytes", lambda: ram)
    limit = default_run_bytes(on_cuda=False)
    assert limit == ram // 4 < AttentionCost(32).run_bytes(1, 8192)
    inputs = random_inputs(32, 8, 128, 1, 8192)  # 201 MB of binary tensors
    body, headers = _binary(inputs)
    with running_client(providers="cpu", max_request_bytes=256 << 20) as client:
        r = client.post("/v2/models/llama3_1_attention/infer", content=body, headers=headers)
        stats = client.get("/v2/models/llama3_1_attention/stats").json()["model_stats"][0]
    assert r.status_code == 413, r.text[:300]
    assert "longest sequence that fits" in r.json()["error"]
    assert f"one run may hold {limit:,} bytes (POSENC_MAX_RUN_BYTES, derived from the provider's memory)" in \
        r.json()["error"]
    assert stats["execution_count"] == 0


class Active:
    """A fake model run costing rows·seq bytes; records the most bytes in flight at once and every batch shape."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, seq = inputs["x"].shape[:2]
        with self.lock:
            self.now += rows * seq
            self.peak = max(self.peak, self.now)
            self.shapes.append(inputs["x"].shape)
        time.sleep(0.02)
        with self.lock:
            self.now -= rows * seq
        return {"output": inputs["x"] * 2}


@pytest.mark.parametrize("batching", [True, False])
def test_batches_and_concurrent_runs_stay_under_the_bound(batching: bool) -> None:
    """Cost = rows·seq bytes, capacity 8: at S=4 at most two rows per run, and the runs of two models together
    never hold more than 8 (they queue instead)."""
    budget = MemoryBudget(8, max_waiters=1 << 20, wait_seconds=None, setting="POSENC_MAX_RUN_BYTES")
    fake = Active()
    executor = ThreadPoolExecutor(4)
    batchers = [Batcher(fake, executor, max_batch_size=8, max_queue_delay_us=0, max_queue_size=64,
                        batching=batching, seq_axes={"x": 1, "output": 1}, pad=True, name=f"m{i}",
                        run_bytes=lambda rows, seq: rows * seq, run_budget=budget) for i in range(2)]
    requests = [np.full((rows, 4, 1), float(i), dtype=np.float32) for i, rows in enumerate([1, 3, 2, 1, 5, 1])]

    async def scenario() -> list:
        results = await asyncio.gather(*(batchers[i % 2].submit({"x": x}) for i, x in enumerate(requests)))
        await asyncio.gather(*(b.close() for b in batchers))
        return results

    results = asyncio.run(scenario())
    for x, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result["output"], x * 2)
    assert max(shape[0] for shape in fake.shapes) == 2  # 5 rows → 2 + 2 + 1; never 3 rows of length 4
    assert 4 <= fake.peak <= 8
    assert budget.reserved == 0


def test_an_allocation_failure_is_507_and_the_model_keeps_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ort.InferenceSession.run
    failures = [ort.capi.onnxruntime_pybind11_state.RuntimeException(
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Attention node. "
        "Failed to allocate memory for requested buffer of size 17179869184")]

    def flaky_run(self: ort.InferenceSession, *args: object, **kwargs: object) -> object:
        if failures:
            raise failures.pop()
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ort.InferenceSession, "run", flaky_run)
    inputs = random_inputs(8, 8, 64, 1, 6)
    body, headers = _binary(inputs)
    with running_client() as client:
        failed = client.post("/v2/models/rope_attention/infer", content=body, headers=headers)
        again = client.post("/v2/models/rope_attention/infer", content=body, headers=headers)
    assert failed.status_code == 507, failed.text
    assert failed.json()["type"] == "insufficient_storage"
    assert "ran out of memory" in failed.json()["error"] and "POSENC_MAX_RUN_BYTES" in failed.json()["error"]
    assert again.status_code == 200


def test_cuda_arena_is_capped_and_grows_only_as_requested() -> None:
    providers = _with_options([CUDA, CPU], Settings(cuda_arena_bytes=123_456))
    assert providers == [(CUDA, {"arena_extend_strategy": "kSameAsRequested", "gpu_mem_limit": "123456"}), CPU]
    assert _with_options([CPU], Settings()) == [CPU]


@pytest.mark.parametrize("model", sorted(HEADS))
def test_io_binding_gives_the_same_outputs_as_a_plain_run(model: str) -> None:
    engine = Engine(Settings(model_repository=REPOSITORY, intra_op_num_threads=1))
    assert engine.load() == []
    loaded = engine.models[model]
    assert isinstance(loaded, LoadedModel) and loaded.io_binding is None  # CPU: plain runs by default
    bound = LoadedModel(loaded.name, loaded.config, loaded.session, loaded.providers, io_binding=True)
    hq, hkv, dim = HEADS[model]
    inputs = random_inputs(hq, hkv, dim, 2, 9, start=5)
    inputs["query"] = inputs["query"][:, :, ::-1]  # a non-contiguous view is bound correctly too
    np.testing.assert_array_equal(run_model(bound, inputs)["output"], run_model(loaded, inputs)["output"])


def test_on_cuda_io_binding_agrees_with_cpu_and_llama3_1_at_8192_is_never_500() -> None:
    """GPU only (skips cleanly without one): the CUDA session binds its I/O by default and agrees with the CPU
    session; the 17 GB request either runs (the device is big enough) or gets the 413, never a 500."""
    from tests.inference.test_engine import require_cuda_device

    require_cuda_device()
    engine = Engine(Settings(model_repository=REPOSITORY, providers="cuda"))
    assert engine.load() == []
    model = engine.models["rope_attention"]
    assert isinstance(model, LoadedModel) and CUDA in model.providers
    inputs = random_inputs(8, 8, 64, 2, 33, start=7)
    np.testing.assert_allclose(run_model(model, inputs)["output"],
                               run(session(REPOSITORY / "rope_attention" / "model.onnx"), inputs), atol=1e-5, rtol=1e-5)
    body, headers = _binary(random_inputs(32, 8, 128, 1, 8192))
    with running_client(providers="cuda", max_request_bytes=256 << 20) as client:
        r = client.post("/v2/models/llama3_1_attention/infer", content=body, headers=headers)
        assert r.status_code in (200, 413), r.text[:300]
        again = client.post("/v2/models/llama3_1_attention/infer", content=body, headers=headers)
        assert again.status_code == r.status_code  # the arena did not grow into a failure


# (model, B, S) of the mixed large requests: each model's 413 (one row over the run bound), runs split into chunks
# under it, and runs that fit whole
MIXED_LARGE = [("llama3_1_attention", 1, 8192), ("llama3_1_attention", 8, 2048), ("rope_attention", 8, 2048),
               ("llama3_1_attention", 2, 4096), ("rope_attention", 4, 4080), ("rope_attention", 16, 1024),
               ("llama3_1_attention", 4, 1024)]


def test_on_cuda_device_memory_stays_within_the_arena_caps_after_mixed_large_requests(tmp_path: Path) -> None:
    """GPU only: after 20 mixed large requests (200 or 413, never a 5xx), the device memory the process took after
    its warm-up (CUDA context, libraries, both models on the device) grew by at most POSENC_CUDA_ARENA_BYTES per
    session. Device memory is read for the whole device (cudaMemGetInfo), so nothing else may run on it."""
    from tests.inference.test_engine import require_cuda_device

    require_cuda_device()
    for model in HEADS:
        shutil.copytree(REPOSITORY / model, tmp_path / model)
    cap = 8 << 30
    before = _device_bytes_used()
    with running_client(model_repository=tmp_path, providers="cuda", cuda_arena_bytes=cap, max_run_bytes=4 << 30,
                        max_request_bytes=512 << 20, memory_budget_bytes=4 << 30) as client:
        for model, (hq, hkv, dim) in HEADS.items():  # warm-up: one small run per model
            body, headers = _binary(random_inputs(hq, hkv, dim, 1, 16))
            assert client.post(f"/v2/models/{model}/infer", content=body, headers=headers).status_code == 200
        warm = _device_bytes_used()
        statuses, peak = [], warm
        for index in range(20):
            model, batch, seq = MIXED_LARGE[index % len(MIXED_LARGE)]
            hq, hkv, dim = HEADS[model]
            body, headers = _binary(random_inputs(hq, hkv, dim, batch, seq))
            answer = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
            assert answer.status_code in (200, 413), f"{model} B={batch} S={seq}: {answer.text[:300]}"
            statuses.append(answer.status_code)
            peak = max(peak, _device_bytes_used())
        end = _device_bytes_used()
    sessions = len(HEADS)
    print(f"device memory used: before {before / 2**30:.2f} GiB, after warm-up {warm / 2**30:.2f}, peak "
          f"{peak / 2**30:.2f}, after 20 requests {end / 2**30:.2f} (cap {cap / 2**30:.0f} GiB x {sessions} sessions); "
          f"statuses {statuses}")
    assert statuses.count(413) >= 2 and statuses.count(200) >= 10
    assert peak - warm <= sessions * cap


def _device_bytes_used() -> int:
    info = cuda_memory_info()
    assert info is not None
    free, total = info
    return total - free
