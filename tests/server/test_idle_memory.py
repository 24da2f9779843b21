"""Memory returns after serving: after a burst of large inferences on every shipped model, uncached 16 MiB tables
and 8 MiB check uploads, the idle server is back within 150 MB of its size before the burst, beside what its
table cache holds (`posenc_table_cache_bytes`, bounded by POSENC_CACHE_BYTES). The runs' buffers go back from
onnxruntime's arenas once a model is idle (`posenc.service.inference.runtime.arena`): 930-960 MB after this burst when
the
arenas kept everything, 375 MB after it with 232 MB of cached tables (131 MB before it)."""

from __future__ import annotations

import io
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from posenc.service.inference.runtime.arena import IDLE_SECONDS
from posenc.service.testing import ServerProcess, attention_inputs, http_request, kserve_request
from tests.onnx_models import REPOSITORY

MB = 1_000_000
RETURNS_WITHIN = 150 * MB


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _burst() -> list[tuple[str, str, bytes | None, dict[str, str]]]:
    """30 requests: B=2 S=512 and B=1 S=1024 on each shipped model, ten uncached 16 MiB ALiBi biases, four 8 MiB
    .npy checks, four uncached 16 MiB RoPE tables."""
    requests: list[tuple[str, str, bytes | None, dict[str, str]]] = []
    for index, folder in enumerate(sorted(p for p in REPOSITORY.iterdir() if (p / "config.json").exists())):
        attention = json.loads((folder / "config.json").read_text())["attention"]
        for batch, seq in ((2, 512), (1, 1024)):
            inputs = attention_inputs(attention["num_heads"], attention["num_kv_heads"], attention["head_dim"],
                                      batch, seq, seed=index)
            request = kserve_request(inputs, binary_output=True, content_type=True)
            requests.append(("POST", f"/v2/models/{folder.name}/infer", request.body, dict(request.headers)))
    for index in range(10):
        requests.append(("GET", "/v1/alibi/bias?num_heads=16&query_length=512&key_length=512&format=raw"
                                f"&alibi_bias_max={1 + index / 2}", None, {}))
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((8, 512, 512), np.float32))
    for index in range(4):
        requests.append(("POST", "/v1/check/alibi/bias?num_heads=8&query_length=512&key_length=512"
                                 f"&alibi_bias_max={4 if index % 2 else 8}", buffer.getvalue(),
                         {"Content-Type": "application/octet-stream"}))
    for index in range(4):
        requests.append(("GET", f"/v1/rope?max_position=32768&head_dim=128&offset={index}&format=raw&tensor=cos",
                         None, {}))
    return requests


def _cache_bytes(port: int) -> int:
    body = http_request(port, "/metrics")[2].decode()
    match = re.search(r"^posenc_table_cache_bytes (\S+)$", body, re.M)
    assert match, "no posenc_table_cache_bytes in /metrics"
    return int(float(match[1]))


def test_memory_returns_after_a_burst() -> None:
    with ServerProcess({"log_level": "warning", "access_log": False, "intra_op_num_threads": 2},
                       ready="/readyz") as server:
        time.sleep(1)
        before = _rss(server.pid)
        requests = _burst()
        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(
                lambda r: http_request(server.port, r[1], r[0], r[2], r[3], timeout=120)[0], requests))
        assert statuses == [200] * len(requests)
        time.sleep(IDLE_SECONDS + 2)  # the models idle: their arenas shrunk
        after, cached = _rss(server.pid), _cache_bytes(server.port)
    assert cached > 0  # the tables stay cached, as they should
    assert after - cached - before < RETURNS_WITHIN, (
        f"idle {before / MB:.0f} MB before, {after / MB:.0f} MB after ({cached / MB:.0f} MB of it cached tables)")
