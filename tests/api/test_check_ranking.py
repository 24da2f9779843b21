"""The check's ranking: hypotheses that explain the upload come first in their family's order (the more specific
explanation first), whatever their residuals; those that do not follow by residual."""

import numpy as np
from fastapi.testclient import TestClient
from safetensors.numpy import load, save

from posenc.models.diagnosis.hypothesis import Hypothesis, Tables
from posenc.service.check.table_check import rank

ST = {"Content-Type": "application/x-safetensors"}


def test_partial_rotary_is_the_likely_cause_although_theta_fits_closer(client: TestClient) -> None:
    """A head_dim-48 table of base 1000 checked as head_dim 64, rotary_dim 48 (base 10000): 1000^(2i/48) =
    10000^(2i/64), so both mistakes explain it; theta's rebuilt table is exact (residual 0), partial_rotary's
    differs by float32 rounding. partial_rotary comes first in the family's order and stays the likely cause."""
    golden = client.get("/v1/rope?max_position=8&head_dim=48&rope_theta=1000")
    assert golden.status_code == 200, golden.text
    tensors = load(golden.content)
    upload = save({"cos": tensors["cos"], "sin": tensors["sin"]})
    r = client.post("/v1/check/rope?max_position=8&head_dim=64&rotary_dim=48", content=upload, headers=ST)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["verdict"] == "mismatch" and doc["likely_cause"] == "partial_rotary"
    explaining = [h for h in doc["diagnosis"] if h["explains"]]
    assert [h["name"] for h in explaining] == ["partial_rotary", "theta"]
    partial, theta = explaining
    assert theta["residual"] == 0.0 < partial["residual"] < 1e-6
    assert theta["found"] == {"rope_theta": "1000.0"}
    others = [h["residual"] for h in doc["diagnosis"][2:]]
    assert not any(h["explains"] for h in doc["diagnosis"][2:]) and others == sorted(others)


def _hypothesis(name: str, offset: float) -> Hypothesis:
    def build() -> Tables:
        return {"x": np.full(4, 1.0 + offset, dtype=np.float32)}

    return Hypothesis(name, f"{name} explained", build)


def test_rank_keeps_the_family_order_among_explanations_and_sorts_the_rest_by_residual() -> None:
    observed = {"x": np.ones(4, dtype=np.float32)}
    hypotheses = [_hypothesis("far", 0.5), _hypothesis("specific", 1e-3), _hypothesis("near", 0.25),
                  _hypothesis("general", 1e-4), _hypothesis("exact", 0.0)]
    ranked = rank(hypotheses, observed, {"x": 2e-3})
    assert [(r.name, r.explains) for r in ranked] == [
        ("specific", True), ("general", True), ("exact", True), ("near", False), ("far", False)]
    residuals = [r.residual for r in ranked]
    assert residuals[0] > residuals[1] > residuals[2] == 0.0 and residuals[3:] == [0.25, 0.5]
