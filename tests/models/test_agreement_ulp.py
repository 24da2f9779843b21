"""The agreement's unit in the last place: the spacing of the reference dtype in the binade of each reference
value (the exponent rounded down), so an upload k ulp off reports max_ulp k, and the cast-once tolerance
(`default_tolerance`, one ulp) admits 1 ulp and refuses 1.5.

The expected spacing is numpy's own `np.spacing` of the reference value: no code shared with the module."""

import numpy as np
import pytest

from posenc.models.diagnosis.agreement import compare, default_tolerance

# exact powers of two (the binade starts at the value), values inside a binade, negative values
MAGNITUDES = (1.0, 2.0, 0.25, 1024.0, -0.5, 1.5, 3.0, 0.7, 1000.3, 1e-3, -0.3, 6.1e4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("ulps", [0.5, 1.0, 1.5, 2.0])
def test_an_upload_k_ulp_off_reports_k_and_passes_only_within_one(dtype: type, ulps: float) -> None:
    reported, passed = {}, {}
    for magnitude in MAGNITUDES:
        reference = np.array([magnitude], dtype=dtype)
        spacing = np.spacing(np.abs(reference)).astype(np.float64)  # one ulp above |value|, in its binade
        candidate = reference.astype(np.float64) + np.sign(reference) * ulps * spacing  # away from zero: exact
        agreement = compare(candidate, reference, default_tolerance(reference))
        reported[magnitude], passed[magnitude] = agreement.max_ulp, agreement.within_contract
    assert reported == dict.fromkeys(MAGNITUDES, ulps)
    assert passed == dict.fromkeys(MAGNITUDES, ulps <= 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_max_ulp_is_the_largest_over_the_elements(dtype: type) -> None:
    reference = np.array([[1.5, 0.75], [3.0, 96.0]], dtype=dtype)  # [2, 2], one binade each
    ulps = np.array([[0.5, 2.0], [1.0, 0.0]])
    candidate = reference.astype(np.float64) + ulps * np.spacing(reference).astype(np.float64)
    agreement = compare(candidate, reference, default_tolerance(reference))
    assert agreement.max_ulp == 2.0
    assert agreement.first_failure == (0, 1) and not agreement.within_contract
