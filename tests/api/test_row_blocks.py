"""Large tables in row blocks on a thread pool: every family with row blocks answers byte for byte what the
one-piece computation answers (bodies, metadata, ETags), the memory budget reserves the blocks in flight,
and a block that fails fails its request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from posenc.service.budget import MemoryBudget
from posenc.service.tables import TABLES
from posenc.service.tables.blocks import RowBlocks
from posenc.service.tables.registry import TableQuery, table_routes
from posenc.service.tables.rope import RopeQuery
from posenc.service.tables.sinusoidal import SinusoidalQuery
from tests.conftest import running_client
from tests.traced_memory import traced_peak

SEQUENCE = {"segments": [{"type": "text", "length": 7}, {"type": "image", "grid_thw": [1, 8, 10]},
                         {"type": "text", "length": 11}]}
LLAMA_CONFIG = {"model_type": "llama", "head_dim": 16, "rope_theta": 500000.0, "max_position_embeddings": 256,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
PIXTRAL_CONFIG = {"model_type": "pixtral", "hidden_size": 256, "num_attention_heads": 8, "image_size": 240,
                  "patch_size": 16}
# Requests of every family with row blocks (path, query, JSON body or None), row counts not multiples of
# the block (the tiny block size below gives several blocks of a few rows each, and a short last one)
REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("/v1/rope", "max_position=301&head_dim=16&dtype=bfloat16", None),
    ("/v1/rope", "max_position=300&head_dim=10&rope_type=dynamic&factor=2&max_position_embeddings=64"
     "&layout=interleaved&offset=7", None),
    ("/v1/rope", "max_position=257&head_dim=16&rope_type=yarn&factor=4&original_max_position_embeddings=32"
     "&form=half&dtype=float16", None),
    ("/v1/rope/from-config", "max_position=333&dtype=bfloat16", LLAMA_CONFIG),
    ("/v1/rope/from-config", "tower=vision&form=half", PIXTRAL_CONFIG),
    ("/v1/rope/vision", "model=llama4&head_dim=16&image_size=176&patch_size=16&dtype=bfloat16", None),
    ("/v1/rope/vision", "head_dim=24&image_size=160&patch_size=16&height=7&dtype=float64", None),
    ("/v1/rope/vision/tower", "vision_tower=qwen2_5_vl&head_dim=24&window=2&grid_thw=2,10,18&dtype=bfloat16", None),
    ("/v1/rope/mrope", "model=qwen3_vl&head_dim=24&mrope_section=4,4,4&dtype=bfloat16", SEQUENCE),
    ("/v1/sinusoidal", "max_position=299&dim=22&variant=fairseq&padding_idx=150&dtype=bfloat16", None),
    ("/v1/sinusoidal", "max_position=299&dim=13&offset=5", None),
    ("/v1/relative/sinusoidal", "qlen=150&klen=151&d_model=16&bi_data=true&clamp_len=90&dtype=float16", None),
]
BLOCK_BYTES = 200  # a few rows per block


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[TestClient, TestClient]]:
    """The service computing tables in one piece, and in tiny blocks on 3 threads."""
    with running_client(table_block_bytes=0) as whole, \
            running_client(table_block_bytes=BLOCK_BYTES, table_threads=3) as blocked:
        yield whole, blocked


def _get(client: TestClient, path: str, query: str, body: dict[str, Any] | None) -> Any:
    if body is None:
        return client.get(f"{path}?{query}")
    return client.post(f"{path}?{query}", content=json.dumps(body), headers={"Content-Type": "application/json"})


def test_every_family_with_row_blocks_is_requested_here() -> None:
    with_rows = {path for path, route in table_routes().items() if route.query.row_tensors}
    assert with_rows == {path for path, _, _ in REQUESTS}
    assert with_rows <= set(TABLES)  # properties are measurements, computed in one piece


@pytest.mark.parametrize(("path", "query", "body"), REQUESTS, ids=[f"{p}?{q}" for p, q, _ in REQUESTS])
def test_blocks_answer_the_bytes_of_one_piece(clients: tuple[TestClient, TestClient], path: str, query: str,
                                               body: dict[str, Any] | None) -> None:
    whole, blocked = (_get(client, path, query, body) for client in clients)
    assert whole.status_code == blocked.status_code == 200, blocked.text
    assert whole.headers["etag"] == blocked.headers["etag"]
    assert whole.content == blocked.content


def _rope(rows: int = 5000) -> tuple[RopeQuery, dict[str, Any]]:
    query = RopeQuery(max_position=rows, head_dim=64, dtype="bfloat16")
    return query, query.specs()


def test_row_blocks_split_only_families_with_rows_above_one_block() -> None:
    blocks = RowBlocks(threads=2, block_bytes=64 * 1024)
    query, specs = _rope()  # cos and sin: 2 x 64 bf16 = 256 bytes a row: 256 rows a block
    assert blocks.blocks(query, specs) == [slice(i, min(i + 256, 5000)) for i in range(0, 5000, 256)]
    assert blocks.blocks(*_rope(256)) is None  # one block: one piece
    assert RowBlocks(threads=2, block_bytes=0).blocks(query, specs) is None  # splitting off
    bias = TABLES["/v1/alibi/bias"].query(num_heads=64, query_length=512, key_length=512)
    assert blocks.blocks(bias, bias.specs()) is None  # no row_tensors
    assert RowBlocks(threads=0, block_bytes=1).threads >= 1  # 0: the usable cores


def test_blocks_reserve_the_whole_output_and_each_block_in_flight() -> None:
    query, specs = _rope(1 << 16)
    one_piece = RowBlocks(threads=2, block_bytes=0).working_bytes(query, specs)
    assert one_piece == query.working_bytes(specs)
    reserved = {threads: RowBlocks(threads, 1 << 20).working_bytes(query, specs) for threads in (1, 2, 8)}
    block = TableQuery.working_bytes(query, specs) // 3 // 16  # 16 MiB of cos and sin in 1 MiB blocks
    base = TableQuery.working_bytes(query, specs)
    assert reserved[2] - reserved[1] == reserved[1] - base > 3 * block  # a block: its tensors and temporaries
    assert reserved[8] - base == 8 * (reserved[1] - base)
    assert reserved[2] < 0.7 * one_piece  # 2 blocks of temporaries instead of the whole table's


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_blocks_hold_no_more_than_they_reserve(threads: int) -> None:
    query = SinusoidalQuery(max_position=20_000, dim=128, dtype="bfloat16")
    specs = query.specs()
    blocks = RowBlocks(threads, block_bytes=64 * 1024)
    bundle, peak = traced_peak(lambda: blocks.compute(query, specs))  # tracemalloc sees every thread
    blocks.close()
    assert bundle.tensors["pe"].tobytes() == query.compute().tensors["pe"].tobytes()
    # the output and the blocks in flight; the encoded body is made after them, beside the output
    assert peak <= blocks.working_bytes(query, specs) - specs["pe"].nbytes
    _, one_piece = traced_peak(query.compute)
    assert peak < one_piece / 4  # a few blocks of float64 temporaries instead of the whole table's


def test_the_route_reserves_what_the_blocks_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    reserved: list[int] = []
    original = MemoryBudget.acquire

    async def recording(self: MemoryBudget, nbytes: int, what: str) -> Any:
        reserved.append(nbytes)
        return await original(self, nbytes, what)

    monkeypatch.setattr(MemoryBudget, "acquire", recording)
    with running_client(table_block_bytes=64 * 1024, table_threads=3, cache_bytes=0) as client:
        assert client.get("/v1/rope?max_position=5000&head_dim=64&dtype=bfloat16").status_code == 200
        query, specs = _rope()
        assert reserved == [RowBlocks(3, 64 * 1024).working_bytes(query, specs)]


def test_a_block_that_fails_fails_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    query, specs = _rope()
    calls: list[slice | None] = []

    def failing(self: RopeQuery, rows: slice | None) -> Any:
        calls.append(rows)
        if rows is not None and rows.start == 512:
            raise MemoryError("block 3")
        return original(self, rows)

    original = RopeQuery.compute_rows
    monkeypatch.setattr(RopeQuery, "compute_rows", failing)
    blocks = RowBlocks(threads=2, block_bytes=64 * 1024)
    with pytest.raises(MemoryError, match="block 3"):
        blocks.compute(query, specs)
    blocks.close()
    monkeypatch.setattr(RopeQuery, "compute_rows", original)
    again = RowBlocks(threads=2, block_bytes=64 * 1024)
    result = again.compute(query, specs)  # a fresh pool, every block
    again.close()
    expected = query.compute()
    assert all(np.array_equal(result.tensors[n].view(np.uint16), expected.tensors[n].view(np.uint16))
               for n in ("cos", "sin"))
    assert result.metadata == expected.metadata and list(result.tensors) == list(expected.tensors)
