"""The contract of every table endpoint: the query base class and the registry of routes.

A family is one `TableQuery` subclass (a pydantic model: its fields are the query parameters, with
bounds, defaults and descriptions) registered with `register_table`. The query declares its output
tensors (`specs`, from the parameters alone) and computes them (`compute`, calling `models/`); the
shared path in `posenc.service.tables.answer` does the rest: format negotiation, tensor selection, size
limits before anything is allocated, the canonical key (ETag and cache), 304, the LRU cache and the
wire encoding. That path's names are importable from here too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from posenc.service.codec.decode import decode_float_tensor, upload_request_body
from posenc.service.codec.encode import Bundle
from posenc.service.tables.png import Picture, picture_elements, table_picture
from posenc.service.tables.preset import PRESET_DESCRIPTION, expand_preset, preset_names


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one output tensor, known from the parameters before anything is computed."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        # Python ints: no overflow for absurd shapes.
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Body:
    """How a POST family reads its request body: `decode(bytes, content_type)` → the upload it binds.

    `limit` caps the body below POSENC_MAX_REQUEST_BYTES (None: that setting alone); `openapi` is
    the operation's requestBody document.
    """

    decode: Callable[[bytes, str | None], Any]
    openapi: Mapping[str, Any]
    limit: int | None = None


def float_upload(field: str, description: str) -> Body:
    """The body of a route that takes one uploaded float tensor (safetensors `weight` or the only tensor, or
    .npy), named `field` in its errors; `description` documents it."""
    return Body(decode=functools.partial(decode_float_tensor, field=field),
                openapi={"requestBody": upload_request_body(description)})


class TableQuery(BaseModel):
    """The query parameters of one table endpoint, and what it produces from them.

    Subclasses declare fields (FastAPI reads them as the query string; `posenc table` validates the
    same model from NAME=VALUE pairs) and implement `specs` and `compute`; `check` holds the
    cross-field rules (a `ParameterError` → 422 naming the parameter). POST families set `body` and
    read the decoded upload from `self.upload`.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    endpoint: ClassVar[str]  # the path without /v1/: names the table in the ETag and the metadata
    tensors: ClassVar[tuple[str, ...]]  # the names `specs` returns, in response order (for ?tensor= and docs)
    body: ClassVar[Body | None] = None
    # Tensors whose first axis is the table's rows and whose rows `compute_rows` computes in any range on
    # their own (the service computes large tables in row blocks on every core); empty: one piece.
    row_tensors: ClassVar[tuple[str, ...]] = ()
    preset_table: ClassVar[str | None] = None  # the table kind `?preset=` fills (posenc.models.presets.tables)
    _upload: Any = PrivateAttr(default=None)

    # not part of the parameters (excluded from params()): a preset request keys as its spelled-out equivalent
    # the OpenAPI document makes it an enum per route: the slugs that fill the route's table (`preset_names(kind)`);
    # public ids and any case are accepted too, as the description says
    preset: str | None = Field(None, max_length=200, exclude=True, description=PRESET_DESCRIPTION,
                               examples=preset_names()[:3])

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        return expand_preset(cls.preset_table, getattr(cls, "endpoint", cls.__name__), data, cls.model_fields)

    @property
    def upload(self) -> Any:
        return self._upload

    def bind(self, upload: Any) -> Self:
        """A copy of this query holding the decoded request body."""
        bound = self.model_copy()
        bound._upload = upload
        return bound

    def check(self) -> None:
        """Cross-field validation, before any work (the fields' own bounds are checked by pydantic)."""

    def params(self) -> dict[str, Any]:
        """The resolved parameters: canonical key (ETag, cache) and response metadata. None = not given."""
        return self.model_dump()

    def specs(self) -> dict[str, TensorSpec]:
        """The tensors `compute` returns, in response order."""
        raise NotImplementedError

    def compute(self) -> Bundle:
        """Every tensor of `specs` and the metadata (a family with `row_tensors`: `compute_rows` of all rows)."""
        if self.row_tensors:
            return self.compute_rows(None)
        raise NotImplementedError

    def compute_rows(self, rows: slice | None) -> Bundle:
        """`compute` with only `rows` of the `row_tensors` (None: all), bit for bit those rows of the whole
        table; the other tensors and the metadata as `compute` gives them."""
        raise NotImplementedError

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        """Memory held while computing and encoding, reserved before `compute` runs (`MemoryBudget`).

        The default covers the tensors, their encoded body and the server's send buffer (asyncio copies
        what the socket does not take at once); the relative-position families compute one value per
        offset and lay them out without a full-size temporary. A family that evaluates a full-size
        float64 temporary adds it (`FLOAT64_TEMPORARY`).
        """
        return sum(3 * spec.nbytes for spec in specs.values())

    def picture_tensors(self) -> tuple[str, ...]:
        """What `format=png` draws without `?tensor=`: a table's first tensor."""
        return self.tensors[:1]

    def picture_elements(self, specs: Mapping[str, TensorSpec], selected: list[str]) -> int:
        """Cells `picture` draws for these tensors (checked against POSENC_MAX_PNG_PIXELS before computing)."""
        return sum(picture_elements(specs[name].shape) for name in selected)

    def picture(self, tensors: Mapping[str, np.ndarray], params: Mapping[str, str]) -> Picture:
        """The `format=png` picture of the selected tensors: a table draws its one tensor."""
        ((name, array),) = tensors.items()
        return table_picture(self.endpoint, name, array, params)


FLOAT64_TEMPORARY = 8  # bytes per output element of a table evaluated in float64 and cast once


@dataclass(frozen=True)
class TableRoute:
    """One registered table endpoint."""

    path: str
    query: type[TableQuery]
    summary: str
    response_description: str

    @property
    def method(self) -> str:
        return "GET" if self.query.body is None else "POST"


TABLES: dict[str, TableRoute] = {}
# /v1/properties/...: measurements of a family's table, answered by the same path as the tables
# (formats, ETag, cache, limits) but not tables themselves (no fast path, no /v1/check route)
PROPERTIES: dict[str, TableRoute] = {}


def register_table(path: str, query: type[TableQuery], *, summary: str, response_description: str,
                   properties: bool = False) -> None:
    """Declare a table endpoint: the route, its OpenAPI entry and `posenc table` follow from it."""
    if path in TABLES or path in PROPERTIES:
        raise ValueError(f"table route {path} registered twice")
    (PROPERTIES if properties else TABLES)[path] = TableRoute(path, query, summary, response_description)


CURVES_AND_SCALARS = "Curves as tensors; scalars in the metadata."


def register_properties(path: str, query: type[TableQuery], *, summary: str,
                        response_description: str = CURVES_AND_SCALARS) -> None:
    """Declare a properties endpoint (`register_table` with properties=True)."""
    register_table(path, query, summary=summary, response_description=response_description, properties=True)


def table_routes() -> dict[str, TableRoute]:
    """Every route answered by `TableRequest`: the tables, then the properties."""
    return {**TABLES, **PROPERTIES}
