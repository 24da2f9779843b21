"""The one path that answers a table request: checks, canonical key, 304, cache, compute, encode.

`TableRequest.prepare` runs every check on a query (`posenc.service.tables.registry.TableQuery`) before
anything is allocated: tensor selection, format, size limits; then the canonical key (ETag and
cache), a 304 or a cached body. `TableRequest.complete` computes, encodes and caches a miss.

Nothing here knows HTTP: an `Answer` is delivered by the routes (`posenc.service.tables.routes`) and by
`posenc table` (`posenc.service.cli.table`), byte for byte the same.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from posenc.models.dtypes import dtype_name
from posenc.service import __version__
from posenc.service.codec.encode import (
    FILE_SUFFIX,
    MEDIA_TYPES,
    SINGLE_TENSOR_FORMATS,
    Bundle,
    Format,
    encode_json,
    encode_npy,
    encode_raw,
    encode_safetensors,
    raw_headers,
)
from posenc.service.errors import BadRequest, InvalidParameter, PayloadTooLarge, PreconditionFailed, format_bytes
from posenc.service.request_kit import work
from posenc.service.settings import Settings
from posenc.service.tables.cache import ByteLRUCache, CachedBody
from posenc.service.tables.png import render

if TYPE_CHECKING:  # the registry re-exports this module: it is imported from there only for types
    from posenc.service.tables.blocks import RowBlocks
    from posenc.service.tables.registry import TableQuery, TensorSpec

CACHE_CONTROL = "public, max-age=86400"


def metadata_value(value: Any) -> str:
    """Metadata are strings (safetensors requires it): one canonical spelling per value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(metadata_value(v) for v in value)
    return str(value)


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    candidates = [c.strip() for c in if_none_match.split(",")]
    # If-None-Match uses the weak comparison (RFC 9110 13.1.2).
    return "*" in candidates or any(c.removeprefix("W/") == etag for c in candidates)


@dataclass
class Answer:
    """A table response: status (200 or 304), headers, body and media type; `cache_key` names the
    cache entry it came from or went into."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    media_type: str | None = None
    cache_key: str | None = None


def validator_headers(cache_key: str) -> dict[str, str]:
    """ETag (from the canonical key), Cache-Control and Vary: what a 304 carries."""
    return {"ETag": f'"{cache_key[:40]}"', "Cache-Control": CACHE_CONTROL, "Vary": "Accept"}


def answer_headers(cache_key: str, cached: CachedBody, cache_status: str) -> dict[str, str]:
    """Every header of a 200 table answer."""
    return {**validator_headers(cache_key), "X-Cache": cache_status, **dict(cached.headers)}


@dataclass
class Pending:
    """A table request that passed every check and missed the cache: what `TableRequest.complete` needs."""

    query: TableQuery
    specs: Mapping[str, TensorSpec]
    selected: list[str]
    canonical: dict[str, str]
    digest: str
    working_bytes: int


@dataclass
class TableRequest:
    """How a table is asked for (format, tensor, conditional request) and where it is answered from."""

    format: Format
    tensor: str | None
    settings: Settings
    cache: ByteLRUCache
    if_none_match: str | None = None
    method: str = "GET"
    blocks: RowBlocks | None = None  # where a miss is computed: None, in one piece on the calling thread

    def _select(self, specs: Mapping[str, TensorSpec], picture_tensors: tuple[str, ...]) -> list[str]:
        names = list(specs)
        if self.tensor is not None:
            if self.tensor not in specs:
                raise InvalidParameter(f"tensor: unknown tensor {self.tensor!r}; this endpoint returns "
                                       + ", ".join(names))
            return [self.tensor]
        if self.format == "png":  # one picture: of ?tensor=, else of what the endpoint draws by default
            return list(picture_tensors)
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

    def answer(self, query: TableQuery) -> Answer:
        """304, a cached body, or a freshly computed and encoded one (blocking: call from a worker thread)."""
        prepared = self.prepare(query)
        return prepared if isinstance(prepared, Answer) else self.complete(prepared)

    def prepare(self, query: TableQuery) -> Answer | Pending:
        """Every check, the canonical key, then 304 or a cached body; else what computing it needs."""
        query.check()
        specs = query.specs()
        if tuple(specs) != query.tensors:
            raise RuntimeError(f"{type(query).__name__}: specs {list(specs)} differ from tensors {query.tensors}")
        selected = self._select(specs, query.picture_tensors())
        if self.format == "npy" and any(dtype_name(specs[n].dtype) == "bfloat16" for n in selected):
            raise BadRequest("format=npy cannot represent bfloat16; use format=safetensors (BF16) or raw, "
                             "or another dtype")
        self._check_size(specs, selected)
        if self.format == "png":
            pixels = query.picture_elements(specs, selected)
            if pixels > self.settings.max_png_pixels:
                raise PayloadTooLarge(f"format=png draws one cell per element: {pixels} requested, the limit is "
                                      f"{self.settings.max_png_pixels} (POSENC_MAX_PNG_PIXELS); ask for fewer "
                                      "rows or columns, or a binary format")

        canonical = {name: metadata_value(v) for name, v in sorted(query.params().items()) if v is not None}
        key_doc = {"endpoint": query.endpoint, "params": canonical, "format": self.format,
                   "tensors": selected, "version": __version__}
        digest = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()
        headers = validator_headers(digest)
        etag = headers["ETag"]
        if etag_matches(self.if_none_match, etag):
            if self.method in ("GET", "HEAD"):
                return Answer(304, headers, cache_key=digest)
            # RFC 9110 13.1.2: a matching If-None-Match on other methods is a failed precondition.
            raise PreconditionFailed(f"If-None-Match matches the current representation {etag}")

        cached = self.cache.get(digest)
        if cached is None:
            working = query.working_bytes(specs) if self.blocks is None else self.blocks.working_bytes(query, specs)
            return Pending(query, specs, selected, canonical, digest, working)
        return _answer(digest, cached, "hit")

    def complete(self, pending: Pending) -> Answer:
        """Compute, encode and cache a table `prepare` found missing (blocking: call from a worker thread)."""
        query = pending.query
        work.check()  # (a request whose client left stops before each step)
        bundle = query.compute() if self.blocks is None else self.blocks.compute(query, pending.specs)
        _check_bundle(bundle, pending.specs)
        work.check()
        metadata = {"posenc_version": __version__, "endpoint": query.endpoint, **pending.canonical, **bundle.metadata}
        selected = {n: bundle.tensors[n] for n in pending.selected}
        if self.format == "png":
            cached = _encode_png(render(query.picture(selected, {**pending.canonical, **bundle.metadata})),
                                 query.endpoint, pending.selected)
        else:
            cached = _encode(self.format, selected, metadata, query.endpoint)
        del selected
        del bundle  # the arrays go before the answer is sent: only the encoded body stays
        self.cache.put(pending.digest, cached)
        return _answer(pending.digest, cached, "miss")


def _answer(cache_key: str, cached: CachedBody, cache_status: str) -> Answer:
    return Answer(200, answer_headers(cache_key, cached, cache_status), cached.body, cached.media_type, cache_key)


def _check_bundle(bundle: Bundle, specs: Mapping[str, TensorSpec]) -> None:
    # specs and tensors are the family's own declarations: a mismatch is a bug, not bad input
    for name, spec in specs.items():
        array = bundle.tensors.get(name)
        if array is None or array.shape != spec.shape or array.dtype != spec.dtype:
            got = None if array is None else (array.shape, array.dtype)
            raise RuntimeError(f"tensor {name!r}: declared {spec}, computed {got}")


def _file_stem(endpoint: str, tensor: str | None = None) -> str:
    """The download's file name without suffix: the endpoint, and the tensor when the body holds only it."""
    stem = endpoint.strip("/").replace("/", "-") or "table"
    return f"{stem}-{tensor}" if tensor is not None else stem


def _encode_png(body: bytes, endpoint: str, selected: list[str]) -> CachedBody:
    stem = _file_stem(endpoint, selected[0] if len(selected) == 1 else None)
    disposition = f'inline; filename="{stem}{FILE_SUFFIX["png"]}"'  # a picture is shown, not saved
    return CachedBody(body=body, media_type=MEDIA_TYPES["png"], headers=(("Content-Disposition", disposition),))


def _encode(fmt: Format, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str],
            endpoint: str) -> CachedBody:
    stem = _file_stem(endpoint)
    headers: dict[str, str] = {}
    if fmt == "safetensors":
        body = encode_safetensors(tensors, metadata)
    elif fmt == "json":
        body = encode_json(tensors, metadata)
    else:
        ((name, array),) = tensors.items()
        stem = _file_stem(endpoint, name)
        body = encode_npy(array) if fmt == "npy" else encode_raw(array)
        if fmt == "raw":
            headers.update(raw_headers(name, array))
    headers["Content-Disposition"] = f'attachment; filename="{stem}{FILE_SUFFIX[fmt]}"'
    if MISSING_ROWS in metadata:  # said in every format, npy and raw included, which carry no metadata
        headers[MISSING_ROWS_HEADER] = metadata[MISSING_ROWS].encode("ascii", "replace").decode()
    return CachedBody(body=body, media_type=MEDIA_TYPES[fmt], headers=tuple(headers.items()))


# A table served without some of its rows (a vision tower's learned CLS row whose values the request did not give):
# the metadata entry that says which and how to get them, and the header that says it in every format
MISSING_ROWS, MISSING_ROWS_HEADER = "missing_rows", "Posenc-Missing-Rows"
