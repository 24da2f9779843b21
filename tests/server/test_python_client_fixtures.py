"""posenc.client against a live server, on the fixture cases every client passes (scripts/client_fixtures.py:
the numbers the Python side computes), byte for byte, sync and async; and the check, as the other clients run it."""

from __future__ import annotations

import asyncio
import base64
import sys
from typing import Any

import numpy as np
import pytest

from posenc.client import AsyncClient, Client, InvalidParameterError
from posenc.models.dtypes import np_dtype
from tests.onnx_models import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from client_fixtures import CASES, table_cases


@pytest.fixture(scope="module")
def fixtures() -> list[dict[str, Any]]:
    """The fixture documents of CASES, in order (SystemExit naming a case that does not answer 200 in-process)."""
    return table_cases()


def _expected(doc: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(doc["b64"]), np_dtype(doc["dtype"]).newbyteorder("<")).reshape(doc["shape"])


def _label(case: dict[str, Any]) -> str:
    return case["endpoint"] + "?" + "&".join(f"{k}={v}" for k, v in case["params"].items())


def _case_id(case: tuple[str, dict[str, Any]]) -> str:
    return _label({"endpoint": case[0], "params": case[1]})


def _same(tables: dict[str, np.ndarray], case: dict[str, Any]) -> None:
    assert list(tables) == list(case["tensors"])
    for name, doc in case["tensors"].items():
        want = _expected(doc)
        assert (tables[name].dtype, tables[name].shape) == (want.dtype, want.shape), name
        assert tables[name].tobytes() == want.tobytes(), f"{_label(case)} {name}"  # bf16 bits and -inf included


def test_every_case_is_served(fixtures: list[dict[str, Any]]) -> None:
    assert len(fixtures) == len(CASES) and len({_label(c) for c in fixtures}) == len(CASES)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[_case_id(c) for c in CASES])
def test_the_fixture_tables(server: str, fixtures: list[dict[str, Any]], index: int) -> None:
    case = fixtures[index]
    with Client(server) as client:
        table = client.table(case["endpoint"], **case["params"])
        _same(table, case)
        assert isinstance(table.metadata["posenc_version"], str)
        assert client.table(case["endpoint"], **case["params"]) is table  # 304: the client's own copy


def test_the_fixture_tables_async(server: str, fixtures: list[dict[str, Any]]) -> None:
    async def fetch_all() -> list[dict[str, np.ndarray]]:
        async with AsyncClient(server) as client:
            return list(await asyncio.gather(*(client.table(c["endpoint"], **c["params"]) for c in fixtures)))

    for table, case in zip(asyncio.run(fetch_all()), fixtures, strict=True):
        _same(table, case)


def test_a_bad_parameter_is_the_services_error(server: str) -> None:
    with Client(server) as client, pytest.raises(InvalidParameterError, match="max_position") as info:
        client.sinusoidal(max_position=0, dim=8)
    assert (info.value.status, info.value.type) == (422, "invalid_parameter")


def test_check_diagnoses_gptj_pairs(server: str) -> None:
    params = {"max_position": 32, "head_dim": 16}
    with Client(server) as client:
        golden = client.rope(**params)
        assert client.check("/v1/rope", {"cos": golden["cos"], "sin": golden["sin"]}, **params)["verdict"] == "matches"
        pairs = client.rope(**params, layout="interleaved")
        report = client.check("/v1/rope", {"cos": pairs["cos"], "sin": pairs["sin"]}, **params)
    assert (report["verdict"], report["likely_cause"], report["diagnosis"][0]["residual"]) == ("mismatch", "layout", 0)
    assert "GPT-J" in report["diagnosis"][0]["explanation"]
    assert report["golden_table"]["url"] == "/v1/rope?max_position=32&head_dim=16"
