"""Query fields several table families share (each declared once)."""

from typing import Annotated, Any

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from posenc.models.dtypes import FloatDType, IntDType

FloatDTypeField = Annotated[
    FloatDType, Field(description="Element type of the float tensors (bfloat16: safetensors and raw only).")
]
IntDTypeField = Annotated[IntDType, Field(description="Element type of the integer tensors.")]


def documented_within(query: type[BaseModel], name: str, maximum: int, rule: str) -> Any:
    """The field `name` as `query` declares it (bounds, default, description), its documented maximum lowered to
    `maximum`: for a limit that joins several parameters (a product, a sum), which JSON Schema cannot state, so
    that the values the OpenAPI document allows pass it. `rule` states the limit itself in the description. The
    server's own bound and check stay as they are: a request beyond the documented maximum that the rule allows
    is served."""
    field = query.model_fields[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return FieldInfo.merge_field_infos(field, json_schema_extra={**extra, "maximum": maximum},
                                       description=f"{field.description} {rule}")
