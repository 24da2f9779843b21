"""The searched RoPE hypotheses of Check my port (`models/diagnosis/rope_search.py`) beyond layout+theta at
offset 0: the theta estimate of the `theta+cos_sin_swapped` pair reads the angles of exchanged tables, and the
scaling search places the upload's rows at the request's offset (dynamic NTK's frequencies depend on it)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.test_check import check, fetch
from tests.conftest import running_client

ROPE = "max_position=256&head_dim=64"


@pytest.fixture(scope="module")
def client() -> Any:
    with running_client() as running:
        yield running


def _top(report: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    top = report["diagnosis"][0] if report["diagnosis"] else {}
    return report["likely_cause"], top.get("found", {})


@pytest.mark.parametrize("theta", ["500000", "1000"])
@pytest.mark.parametrize("offset", [0, 1000])
def test_another_theta_with_cos_and_sin_exchanged(client: TestClient, theta: str, offset: int) -> None:
    tables = fetch(client, f"/v1/rope?{ROPE}&offset={offset}&rope_theta={theta}&format=safetensors")
    report = check(client, f"/v1/check/rope?{ROPE}&offset={offset}", {"cos": tables["sin"], "sin": tables["cos"]})
    assert report["verdict"] == "mismatch", report["summary"]
    assert _top(report) == ("theta+cos_sin_swapped", {"rope_theta": f"{float(theta)!r}"}), report["summary"]
    assert report["diagnosis"][0]["residual"] == 0, report["diagnosis"][0]


@pytest.mark.parametrize("offset", [100, 4000])
def test_dynamic_scaling_found_at_an_offset(client: TestClient, offset: int) -> None:
    """Dynamic NTK stretches theta by the longest position, offset + rows: the search must reckon with it."""
    scaling = "rope_type=dynamic&factor=4&max_position_embeddings=128"
    tables = fetch(client, f"/v1/rope?{ROPE}&offset={offset}&{scaling}&format=safetensors")
    report = check(client, f"/v1/check/rope?{ROPE}&offset={offset}", {"cos": tables["cos"], "sin": tables["sin"]})
    found = {"rope_type": "dynamic", "factor": "4", "max_position_embeddings": "128"}
    assert _top(report) == ("scaling_applied_dynamic", found), report["summary"]
    assert report["diagnosis"][0]["residual"] == 0, report["diagnosis"][0]


@pytest.mark.parametrize("scaling, found", [
    ("rope_type=linear&factor=8", {"rope_type": "linear", "factor": "8"}),
    ("rope_type=yarn&factor=4&original_max_position_embeddings=32768",
     {"rope_type": "yarn", "factor": "4", "original_max_position_embeddings": "32768"}),
])
def test_scaling_found_at_an_offset(client: TestClient, scaling: str, found: dict[str, str]) -> None:
    tables = fetch(client, f"/v1/rope?{ROPE}&offset=3000&{scaling}&format=safetensors")
    report = check(client, f"/v1/check/rope?{ROPE}&offset=3000", {"cos": tables["cos"], "sin": tables["sin"]})
    assert _top(report) == (f"scaling_applied_{found['rope_type']}", found), report["summary"]
