"""Check my port beyond single mistakes: two at once, scaling the request does not ask for (its factor
estimated), a match that no hypothesis claims, and a sinusoidal base estimated as RoPE's theta is."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.api.test_check import check, fetch
from tests.conftest import running_client

ROPE = "max_position=256&head_dim=64"


@pytest.fixture(scope="module")
def client() -> Any:
    with running_client() as running:
        yield running


def _cos_sin(client: TestClient, query: str) -> dict[str, np.ndarray]:
    tables = fetch(client, f"/v1/rope?{query}&format=safetensors")
    return {"cos": tables["cos"], "sin": tables["sin"]}


def _cause(report: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    top = report["diagnosis"][0] if report["diagnosis"] else {}
    return report["likely_cause"], top.get("found", {})


def test_interleaved_layout_and_another_theta_together(client: TestClient) -> None:
    upload = _cos_sin(client, f"{ROPE}&layout=interleaved&rope_theta=500000")
    report = check(client, f"/v1/check/rope?{ROPE}", upload)
    cause, found = _cause(report)
    assert report["verdict"] == "mismatch" and cause == "layout+theta", report["summary"]
    assert found == {"rope_theta": "500000.0"}
    assert "two mistakes at once" in report["summary"]


@pytest.mark.parametrize(("scaling", "cause", "found"), [
    ("rope_type=linear&factor=2", "scaling_applied_linear", {"rope_type": "linear", "factor": "2"}),
    ("rope_type=linear&factor=8", "scaling_applied_linear", {"rope_type": "linear", "factor": "8"}),
    ("rope_type=llama3&factor=8&low_freq_factor=1&high_freq_factor=4&original_max_position_embeddings=8192",
     "scaling_applied_llama3", {"rope_type": "llama3", "factor": "8", "original_max_position_embeddings": "8192",
                                "low_freq_factor": "1", "high_freq_factor": "4"}),
    ("rope_type=yarn&factor=4&original_max_position_embeddings=32768", "scaling_applied_yarn",
     {"rope_type": "yarn", "factor": "4", "original_max_position_embeddings": "32768"}),
    ("rope_type=dynamic&factor=4&max_position_embeddings=128", "scaling_applied_dynamic",
     {"rope_type": "dynamic", "factor": "4", "max_position_embeddings": "128"}),
])
def test_scaling_where_the_request_has_none(client: TestClient, scaling: str, cause: str,
                                            found: dict[str, str]) -> None:
    upload = _cos_sin(client, f"{ROPE}&{scaling}")
    report = check(client, f"/v1/check/rope?{ROPE}", upload)
    assert _cause(report) == (cause, found), report["summary"]


def test_a_match_claims_no_hypothesis(client: TestClient) -> None:
    report = check(client, f"/v1/check/rope?{ROPE}", _cos_sin(client, ROPE))
    assert report["verdict"] == "matches" and report["likely_cause"] is None
    assert report["diagnosis"] == [] and "no known mistake applies" in report["summary"]


@pytest.mark.parametrize("variant", ["paper", "tensor2tensor", "fairseq"])
def test_a_sinusoidal_base_is_estimated(client: TestClient, variant: str) -> None:
    query = f"max_position=128&dim=64&variant={variant}"
    upload = fetch(client, f"/v1/sinusoidal?{query}&base=500&format=safetensors")
    report = check(client, f"/v1/check/sinusoidal?{query}", {"pe": upload["pe"]})
    assert _cause(report) == ("base", {"base": "500.0"}), report["summary"]
