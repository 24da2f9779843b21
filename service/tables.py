"""The shared path of every table endpoint: negotiate, size-check, ETag/304, cache, compute, encode.

A route declares what it will produce (`TensorSpec`s computed from its parameters) and hands over a
`compute` callable; nothing is allocated before the size check has passed.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, Header, Query, Request
from fastapi.responses import Response

from models.dtypes import FloatDType, IntDType, dtype_name
from service import __version__
from service.arrays import (
    FILE_SUFFIX,
    FORMATS,
    MEDIA_TYPES,
    SINGLE_TENSOR_FORMATS,
    Bundle,
    Format,
    encode_json,
    encode_npy,
    encode_raw,
    encode_safetensors,
    negotiate_format,
    raw_headers,
)
from service.cache import ByteLRUCache, CachedBody
from service.errors import BadRequest, InvalidParameter, PayloadTooLarge, PreconditionFailed
from service.settings import Settings

CACHE_CONTROL = "public, max-age=86400"

FloatDTypeQuery = Annotated[
    FloatDType, Query(description="Element type of the float tensors (bfloat16: safetensors and raw only).")
]
IntDTypeQuery = Annotated[IntDType, Query(description="Element type of the integer tensors.")]


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


def metadata_value(value: Any) -> str:
    """Metadata are strings (safetensors requires it): one canonical spelling per value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(metadata_value(v) for v in value)
    return str(value)


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    candidates = [c.strip() for c in if_none_match.split(",")]
    # If-None-Match uses the weak comparison (RFC 9110 13.1.2).
    return "*" in candidates or any(c.removeprefix("W/") == etag for c in candidates)


def format_bytes(n: int) -> str:
    return f"{n} bytes ({n / 2**20:.1f} MiB)"


@dataclass
class TableRequest:
    """What a table route needs besides its own parameters (a FastAPI dependency)."""

    format: Format
    tensor: str | None
    if_none_match: str | None
    method: str
    settings: Settings
    cache: ByteLRUCache

    def _select(self, specs: Mapping[str, TensorSpec]) -> list[str]:
        names = list(specs)
        if self.tensor is not None:
            if self.tensor not in specs:
                raise InvalidParameter(f"tensor: unknown tensor {self.tensor!r}; this endpoint returns "
                                       + ", ".join(names))
            return [self.tensor]
        if self.format in SINGLE_TENSOR_FORMATS and len(names) > 1:
            raise BadRequest(f"format={self.format} carries one tensor: choose it with ?tensor= "
                             f"(one of {', '.join(names)}), or use format=safetensors for all of them")
        return names

    def _check_size(self, specs: Mapping[str, TensorSpec], selected: list[str]) -> None:
        total = sum(spec.nbytes for spec in specs.values())
        limit = self.settings.max_table_bytes
        if total > limit:
            raise PayloadTooLarge(f"the requested table would be {format_bytes(total)}; the limit is "
                                  f"{format_bytes(limit)} (POSENC_MAX_TABLE_BYTES): ask for fewer rows, "
                                  "a smaller dtype, or use offset to fetch it in slices")
        if self.format == "json":
            elements = sum(specs[name].size for name in selected)
            if elements > self.settings.max_json_elements:
                raise PayloadTooLarge(f"format=json is for small tables: {elements} elements requested, the "
                                      f"limit is {self.settings.max_json_elements} (POSENC_MAX_JSON_ELEMENTS); "
                                      "use format=safetensors, npy or raw")

    def serve(self, *, endpoint: str, params: Mapping[str, Any], specs: Mapping[str, TensorSpec],
              compute: Callable[[], Bundle]) -> Response:
        """Answer a table request: 304, a cached body, or a freshly computed and encoded one.

        `params` are the resolved parameters (they go into the ETag and the metadata); `specs` the
        tensors `compute` will return, in response order.
        """
        selected = self._select(specs)
        if self.format == "npy" and any(dtype_name(specs[n].dtype) == "bfloat16" for n in selected):
            raise BadRequest("format=npy cannot represent bfloat16; use format=safetensors (BF16) or raw, "
                             "or another dtype")
        self._check_size(specs, selected)

        canonical = {name: metadata_value(v) for name, v in sorted(params.items()) if v is not None}
        key_doc = {"endpoint": endpoint, "params": canonical, "format": self.format,
                   "tensors": selected, "version": __version__}
        digest = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()
        etag = f'"{digest[:40]}"'
        headers = {"ETag": etag, "Cache-Control": CACHE_CONTROL, "Vary": "Accept"}
        if _etag_matches(self.if_none_match, etag):
            if self.method in ("GET", "HEAD"):
                return Response(status_code=304, headers=headers)
            # RFC 9110 13.1.2: a matching If-None-Match on other methods is a failed precondition.
            raise PreconditionFailed(f"If-None-Match matches the current representation {etag}")

        cached = self.cache.get(digest)
        if cached is None:
            bundle = compute()
            _check_bundle(bundle, specs)
            metadata = {"posenc_version": __version__, "endpoint": endpoint, **canonical, **bundle.metadata}
            cached = _encode(self.format, {n: bundle.tensors[n] for n in selected}, metadata, endpoint)
            self.cache.put(digest, cached)
            headers["X-Cache"] = "miss"
        else:
            headers["X-Cache"] = "hit"
        headers.update(dict(cached.headers))
        return Response(content=cached.body, media_type=cached.media_type, headers=headers)


def _check_bundle(bundle: Bundle, specs: Mapping[str, TensorSpec]) -> None:
    for name, spec in specs.items():
        array = bundle.tensors.get(name)
        if array is None or array.shape != spec.shape or array.dtype != spec.dtype:
            got = None if array is None else (array.shape, array.dtype)
            raise RuntimeError(f"tensor {name!r}: declared {spec}, computed {got}")


def _encode(fmt: Format, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str],
            endpoint: str) -> CachedBody:
    stem = endpoint.strip("/").replace("/", "-") or "table"
    headers: dict[str, str] = {}
    if fmt == "safetensors":
        body = encode_safetensors(tensors, metadata)
    elif fmt == "json":
        body = encode_json(tensors, metadata)
    else:
        ((name, array),) = tensors.items()
        stem = f"{stem}-{name}"
        body = encode_npy(array) if fmt == "npy" else encode_raw(array)
        if fmt == "raw":
            headers.update(raw_headers(name, array))
    headers["Content-Disposition"] = f'attachment; filename="{stem}{FILE_SUFFIX[fmt]}"'
    return CachedBody(body=body, media_type=MEDIA_TYPES[fmt], headers=tuple(headers.items()))


def table_request(
    request: Request,
    format: Annotated[
        str | None,
        Query(description="Response format: " + ", ".join(FORMATS) + ". Wins over the Accept header; "
              "default safetensors."),
    ] = None,
    tensor: Annotated[
        str | None, Query(description="Name of the one tensor to return (required for npy/raw when the "
                                      "endpoint returns several).")
    ] = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
    if_none_match: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> TableRequest:
    return TableRequest(
        format=negotiate_format(format, accept),
        tensor=tensor,
        if_none_match=if_none_match,
        method=request.method,
        settings=request.app.state.settings,
        cache=request.app.state.table_cache,
    )


TableDep = Annotated[TableRequest, Depends(table_request)]
