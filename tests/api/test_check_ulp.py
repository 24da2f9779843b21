"""`POST /v1/check/...` in units in the last place: an upload a known number of ulps off the golden table reports
exactly that `max_ulp`, and the cast-once contract (one ulp, ALiBi slopes) passes 1 ulp and refuses 1.5."""

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load, save

ST = {"Content-Type": "application/x-safetensors"}
SLOPES = "/v1/alibi/slopes?num_heads=12"  # heads 0-7: powers of two, 2^-1..2^-8; heads 8-11: 2^-0.5·2^-k


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_slopes_k_ulp_off_report_k_ulp(client: TestClient, dtype: str) -> None:
    golden = client.get(f"{SLOPES}&dtype={dtype}")
    assert golden.status_code == 200, golden.text
    slopes = load(golden.content)["slopes"]
    spacing = np.spacing(slopes).astype(np.float64)  # one ulp of each slope, in its binade
    inside = np.frexp(slopes)[0] != 0.5  # the slopes that are not powers of two (heads 8-11)
    assert inside.sum() == 4
    for ulps in (0.5, 1.0, 1.5, 2.0):
        for moved in (inside, ~inside):  # the slopes inside a binade, then the powers of two, moved k ulp up
            upload = slopes.astype(np.float64) + np.where(moved, ulps * spacing, 0.0)  # float64: k ulp exactly
            r = client.post(f"/v1/check/alibi/slopes?num_heads=12&dtype={dtype}",
                            content=save({"slopes": upload}), headers=ST)
            assert r.status_code == 200, r.text
            doc, what = r.json(), (ulps, "powers of two" if moved[0] else "inside a binade")
            agreement = doc["agreement"]["slopes"]
            assert agreement["max_ulp"] == ulps, what
            assert agreement["within_contract"] is (ulps <= 1.0), what
            assert doc["verdict"] == ("matches" if ulps <= 1.0 else "mismatch"), what
            assert agreement["first_failure"] == (None if ulps <= 1.0 else [int(np.argmax(moved))]), what
