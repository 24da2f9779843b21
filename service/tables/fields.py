"""Query fields several table families share (each declared once)."""

from typing import Annotated

from pydantic import Field

from posenc.models.dtypes import FloatDType, IntDType

FloatDTypeField = Annotated[
    FloatDType, Field(description="Element type of the float tensors (bfloat16: safetensors and raw only).")
]
IntDTypeField = Annotated[IntDType, Field(description="Element type of the integer tensors.")]
