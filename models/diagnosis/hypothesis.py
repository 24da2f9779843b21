"""A hypothesis: one known porting mistake, and the table it would produce.

`build()` rebuilds the reference table under that mistake (the same tensor names as the reference;
None when the mistake cannot be told apart for these parameters, e.g. a theta estimate equal to the
requested one). Builds are lazy, so the caller can bound the work before any of them runs and keep
one hypothesis table in memory at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

Tables = dict[str, np.ndarray]


@dataclass(frozen=True)
class Hypothesis:
    """name: stable identifier (`layout`, `cos_sin_swapped`, ...); explanation: one sentence for the user;
    `found`: what `build` estimated from the upload (e.g. {"rope_theta": "500000"}), filled when it runs."""

    name: str
    explanation: str
    build: Callable[[], Tables | None]
    found: dict[str, str] = field(default_factory=dict)


REDUCED_STORAGE = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8}


def storage_hypotheses(reference: Callable[[], Mapping[str, np.ndarray]], dtype: np.dtype) -> list[Hypothesis]:
    """The float tensors stored in float16 or bfloat16 (and read back), when float32 or float64 was asked for."""
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return []
    requested = str(dtype)
    out = []
    for name, reduced in REDUCED_STORAGE.items():
        def build(reduced: np.dtype = reduced) -> Tables:
            return {key: (value.astype(reduced).astype(value.dtype) if value.dtype == dtype else value)
                    for key, value in reference().items()}
        out.append(Hypothesis(f"{name}_storage", f"your values went through {name} (rounded to its "
                                                 f"{SIGNIFICAND_BITS[name]}-bit significand) although {requested} "
                                                 "was asked for", build))
    return out
