"""An infer refused after its bytes were reserved (a 400 from parsing or validation) gives them back: the memory
budget holds nothing afterwards, and the next valid infer is served, not kept waiting for bytes nobody holds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posenc.service.budget import MemoryBudget
from posenc.service.testing import attention_inputs, kserve_request
from tests.conftest import running_client

MODEL = "rope_attention"
MiB = 1 << 20


def _short_json() -> tuple[bytes, dict[str, str], str]:
    """A JSON infer whose `query` holds one value fewer than its declared shape."""
    header = kserve_request(attention_inputs(8, 8, 64, 1, 64), binary=False).header
    query = next(entry for entry in header["inputs"] if entry["name"] == "query")
    query["data"] = query["data"][:-1]
    return json.dumps(header).encode(), {}, "'data' has 32767 elements, shape [1, 8, 64, 64] needs 32768"


def _short_binary() -> tuple[bytes, dict[str, str], str]:
    """A binary infer whose last tensor lacks its last 8 bytes."""
    request = kserve_request(attention_inputs(8, 8, 64, 1, 64))
    return request.body[:-8], request.headers, "binary data is missing"


@pytest.mark.parametrize("bad", [_short_json, _short_binary], ids=["json-too-few-values", "binary-too-short"])
def test_a_400_infer_gives_its_reserved_bytes_back(bad: object) -> None:
    body, headers, message = bad()  # type: ignore[operator]
    # the bad body reserves 3x its length (over 1 MiB): the whole budget, which a leak would leave held
    assert 3 * len(body) >= MiB
    with running_client(memory_budget_bytes=MiB, memory_wait_seconds=0.5, max_queue_delay_us=0) as client:
        budget: MemoryBudget = client.app.state.process.memory_budget  # type: ignore[attr-defined]
        assert budget.reserved == 0
        r = client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
        assert r.status_code == 400 and message in r.json()["error"], r.text
        assert budget.reserved == 0, f"{budget.reserved} bytes still reserved after the 400"

        inputs = attention_inputs(8, 8, 64, 1, 4)
        good = kserve_request(inputs, binary_output=True)
        r = client.post(f"/v2/models/{MODEL}/infer", content=good.body, headers=good.headers)
        assert r.status_code == 200, r.text
        length = int(r.headers["Inference-Header-Content-Length"])
        assert np.frombuffer(r.content[length:], np.float32).size == 8 * 4 * 64
        assert budget.reserved == 0
