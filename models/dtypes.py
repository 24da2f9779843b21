"""The one table of element types: API name, numpy, safetensors, KServe v2, .npy and ONNX spellings.

Every other module looks dtypes up here (wire formats, uploads, the KServe codec, the model
repository checks); none keeps its own mapping. bfloat16 is ml_dtypes' numpy extension type; .npy
cannot describe it.
"""

from dataclasses import dataclass
from typing import Literal, get_args

import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

FloatDType = Literal["float32", "float16", "bfloat16", "float64"]
IntDType = Literal["int64", "int32"]

# What the float tables serve (`dtype=`); integer index tables take `IntDType`.
FLOAT_DTYPES: tuple[str, ...] = get_args(FloatDType)


@dataclass(frozen=True)
class DType:
    """One element type in every spelling the service meets.

    numpy: native byte order; safetensors: the header's dtype code; kserve: the v2 `datatype`;
    npy: the .npy `descr` without its byte-order character (None: not representable);
    onnx: the type string onnxruntime reports for a tensor input or output.
    """

    name: str
    numpy: np.dtype
    safetensors: str
    kserve: str
    npy: str | None
    onnx: str

    @property
    def triton(self) -> str:
        """Triton's model-configuration `data_type` (`TYPE_FP32`, ...): the KServe name with a prefix."""
        return f"TYPE_{self.kserve}"


DTYPES: tuple[DType, ...] = (
    DType("float64", np.dtype(np.float64), "F64", "FP64", "f8", "tensor(double)"),
    DType("float32", np.dtype(np.float32), "F32", "FP32", "f4", "tensor(float)"),
    DType("float16", np.dtype(np.float16), "F16", "FP16", "f2", "tensor(float16)"),
    DType("bfloat16", np.dtype(ml_dtypes.bfloat16), "BF16", "BF16", None, "tensor(bfloat16)"),
    DType("int64", np.dtype(np.int64), "I64", "INT64", "i8", "tensor(int64)"),
    DType("int32", np.dtype(np.int32), "I32", "INT32", "i4", "tensor(int32)"),
    DType("int16", np.dtype(np.int16), "I16", "INT16", "i2", "tensor(int16)"),
    DType("int8", np.dtype(np.int8), "I8", "INT8", "i1", "tensor(int8)"),
    DType("uint64", np.dtype(np.uint64), "U64", "UINT64", "u8", "tensor(uint64)"),
    DType("uint32", np.dtype(np.uint32), "U32", "UINT32", "u4", "tensor(uint32)"),
    DType("uint16", np.dtype(np.uint16), "U16", "UINT16", "u2", "tensor(uint16)"),
    DType("uint8", np.dtype(np.uint8), "U8", "UINT8", "u1", "tensor(uint8)"),
    DType("bool", np.dtype(np.bool_), "BOOL", "BOOL", "b1", "tensor(bool)"),
)

BY_NAME: dict[str, DType] = {d.name: d for d in DTYPES}
BY_SAFETENSORS: dict[str, DType] = {d.safetensors: d for d in DTYPES}
BY_KSERVE: dict[str, DType] = {d.kserve: d for d in DTYPES}
BY_NPY: dict[str, DType] = {d.npy: d for d in DTYPES if d.npy is not None}
BY_ONNX: dict[str, DType] = {d.onnx: d for d in DTYPES}


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype for an API dtype name (`bfloat16` is ml_dtypes' extension type)."""
    try:
        return BY_NAME[name].numpy
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(BY_NAME)}") from None


def lookup(dtype: np.dtype) -> DType:
    """The table row of a numpy dtype (either byte order)."""
    native = dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype
    for row in DTYPES:
        if row.numpy == native:
            return row
    raise ValueError(f"dtype {dtype} has no API name")


def dtype_name(dtype: np.dtype) -> str:
    """The API name of a numpy dtype; inverse of `np_dtype`."""
    return lookup(dtype).name


BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _float32_rounded_to_odd(values: np.ndarray) -> np.ndarray:
    """float64 [...] -> float32 [...] rounded to odd: exact values stay, inexact ones get the neighbour (of the
    two float32s around them) whose last mantissa bit is 1. Rounding that to a format at least two bits
    narrower, to nearest-even, equals rounding the float64 value there directly (Boldo & Melquiond, "When
    double rounding is odd", 2005): float32 has 16 bits more than bfloat16."""
    with np.errstate(over="ignore"):  # beyond float32's range: inf, the right answer for bfloat16 too
        nearest = values.astype(np.float32)  # [...] to nearest-even: may be one step above |value|
    above = np.abs(nearest.astype(np.float64)) > np.abs(values)
    toward_zero = np.where(above, np.nextafter(nearest, np.float32(0)), nearest)  # [...] truncated
    inexact = (toward_zero.astype(np.float64) != values) & np.isfinite(values)
    bits = toward_zero.view(np.uint32) | inexact.astype(np.uint32)  # the odd neighbour where inexact
    return bits.view(np.float32)


def cast(values: np.ndarray, dtype: DTypeLike) -> np.ndarray:
    """`values` as `dtype`, every element rounded once from its own precision (to nearest, ties to even).

    numpy rounds float64 to float32 and float16 once; ml_dtypes' float64 -> bfloat16 goes through float32
    and so rounds twice (a value within half a float32 ulp of a bfloat16 midpoint goes the wrong way).
    Every cast of computed values to a served dtype goes through here."""
    target = np.dtype(dtype)
    if target == BFLOAT16 and values.dtype == np.float64:
        return _float32_rounded_to_odd(values).astype(BFLOAT16)
    return values.astype(target)
