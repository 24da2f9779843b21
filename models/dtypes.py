"""Names of the dtypes the API serves and their numpy equivalents (bfloat16 via ml_dtypes)."""

from typing import Literal

import ml_dtypes
import numpy as np

FloatDType = Literal["float32", "float16", "bfloat16", "float64"]
IntDType = Literal["int64", "int32"]

FLOAT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
INT_DTYPES: tuple[str, ...] = ("int64", "int32")

_BY_NAME: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype for an API dtype name (`bfloat16` is ml_dtypes' extension type)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(_BY_NAME)}") from None


def dtype_name(dtype: np.dtype) -> str:
    """The API name of a numpy dtype; inverse of `np_dtype`."""
    for name, candidate in _BY_NAME.items():
        if candidate == dtype:
            return name
    raise ValueError(f"dtype {dtype} has no API name")
