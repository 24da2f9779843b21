"""Dynamic batching of requests with different sequence lengths: padding only where it is exact.

Right-padding the sequence axis is exact for a causal model (padded keys come after every valid query and
are masked out) but not for a bidirectional one (every query would also attend the padded keys). The engine
must therefore only pad-and-batch sequences of different lengths when the model's config.json says
`causal: true`; a bidirectional model runs them separately.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from posenc.service.cli.main import main as posenc_main
from tests.conftest import running_client
from tests.onnx_models import random_inputs, run, session

HEADS, HEAD_DIM = 2, 16
SEQ_LENGTHS = (3, 5)  # one batch of both is 10 padded elements for 8 valid ones: within the padding limit


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny causal and a tiny bidirectional RoPE-attention model, exported with `posenc export`."""
    repo = tmp_path_factory.mktemp("repo")
    common = ["--head-dim", str(HEAD_DIM), "--num-heads", str(HEADS), "--num-kv-heads", str(HEADS),
              "--max-position", "64", "--max-batch-size", "4", "--repository", str(repo)]
    assert posenc_main(["export", "--name", "causal", *common]) == 0
    assert posenc_main(["export", "--name", "bidirectional", "--bidirectional", *common]) == 0
    assert json.loads((repo / "bidirectional" / "config.json").read_text())["causal"] is False
    assert json.loads((repo / "causal" / "config.json").read_text())["causal"] is True
    return repo


@pytest.fixture(scope="module")
def client(repository: Path) -> Iterator[TestClient]:
    # Batches of up to 2 rows; the first request waits (up to 2 s) for the second one to arrive.
    with running_client(model_repository=repository, providers="cpu", max_batch_size=2,
                        max_queue_delay_us=2_000_000, intra_op_num_threads=1) as c:
        assert c.get("/v2/health/ready").status_code == 200
        yield c


def _body(inputs: dict[str, np.ndarray]) -> bytes:
    datatype = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
    return json.dumps({"inputs": [{"name": n, "datatype": datatype[a.dtype], "shape": list(a.shape),
                                   "data": a.ravel().tolist()} for n, a in inputs.items()]}).encode()


def _output(response_json: dict) -> np.ndarray:
    (entry,) = response_json["outputs"]
    return np.asarray(entry["data"], dtype=np.float32).reshape(entry["shape"])


def _infer_concurrently(client: TestClient, model: str, requests: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """POST every request at the same moment from its own thread; the outputs in request order."""
    barrier = threading.Barrier(len(requests))
    outputs: list[np.ndarray | None] = [None] * len(requests)
    errors: list[str] = []

    def send(index: int) -> None:
        barrier.wait(10)
        r = client.post(f"/v2/models/{model}/infer", content=_body(requests[index]))
        if r.status_code != 200:
            errors.append(f"{r.status_code} {r.text}")
            return
        outputs[index] = _output(r.json())

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert all(out is not None for out in outputs)
    return outputs  # type: ignore[return-value]


def _executions(client: TestClient, model: str) -> int:
    return int(client.get(f"/v2/models/{model}/stats").json()["model_stats"][0]["execution_count"])


@pytest.mark.parametrize("model", ["causal", "bidirectional"])
def test_concurrent_requests_of_different_lengths_equal_their_unbatched_outputs(
    client: TestClient, repository: Path, model: str
) -> None:
    """Guards against padding a bidirectional model like a causal one (`pad` true regardless of config.json's
    `causal`): its padded keys would change every output row of the shorter request."""
    requests = [random_inputs(HEADS, HEADS, HEAD_DIM, 1, seq, seed=seq, start=7 * seq) for seq in SEQ_LENGTHS]
    before = _executions(client, model)
    outputs = _infer_concurrently(client, model, requests)
    executions = _executions(client, model) - before

    sess = session(repository / model / "model.onnx")
    for request, output in zip(requests, outputs, strict=True):
        alone = run(sess, request)  # [1, H, S, D]: this request through onnxruntime on its own
        assert output.shape == alone.shape
        np.testing.assert_allclose(output, alone, atol=1e-5, rtol=1e-5)
    if model == "causal":
        # the control: the two requests did share one padded run, so the setup does make them meet in a batch
        assert executions == 1
