"""Properties of uploaded tables: `POST /v1/properties/learned` (a learned absolute position table,
e.g. BERT's or GPT-2's `position_embeddings`) and `POST /v1/properties/t5/bias` (the bias each head of
a learned T5 table adds against key − query). Uploads follow the rules of `POST /v1/t5/bias`.
"""

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from posenc.models.dtypes import dtype_name
from posenc.models.errors import ParameterError
from posenc.models.properties.bias import t5_bias_by_offset
from posenc.models.properties.learned import check_learned_shape, learned_properties
from posenc.models.t5 import check_t5_weight_shape
from posenc.service.codec.encode import Bundle, byte_view
from posenc.service.properties.families import PropertiesQuery, T5PropertiesQuery, head_curves, summary
from posenc.service.tables.png import Curve, Heatmap, Panel
from posenc.service.tables.registry import TensorSpec, float_upload, register_properties
from posenc.service.tables.t5 import WEIGHT_BODY

F64, I64 = np.dtype(np.float64), np.dtype(np.int64)


def upload_digest(array: np.ndarray) -> dict[str, Any]:
    """Shape, dtype and sha256 of an upload: what names it in the cache key."""
    return {"upload_shape": list(array.shape), "upload_dtype": dtype_name(array.dtype),
            "upload_sha256": hashlib.sha256(byte_view(array)).hexdigest()}


TABLE_BODY = float_upload("table", "A learned absolute position table [positions, dim] (F64/F32/F16/BF16), e.g. "
                          "BERT's or GPT-2's position_embeddings, as safetensors (tensor `weight`, or the only "
                          "tensor) or .npy (no pickle).")


class LearnedPropertiesQuery(PropertiesQuery):
    """Cosine similarity between positions, the spectrum over positions (which frequencies the table
    learned), each position's nearest neighbour offset, and the same for the paper sinusoidal table of
    the same shape."""

    endpoint = "properties/learned"
    body = TABLE_BODY
    tensors = ("frequency", "cosine_similarity", "spectrum", "dominant_frequency", "nearest_offset",
               "similarity_by_distance", "sinusoidal_cosine_similarity", "sinusoidal_spectrum",
               "sinusoidal_dominant_frequency", "sinusoidal_nearest_offset", "sinusoidal_similarity_by_distance")

    @property
    def table(self) -> np.ndarray:
        upload: np.ndarray = self.upload
        return upload

    def check(self) -> None:
        if self.upload is not None:
            check_learned_shape(self.table.shape)

    def params(self) -> dict[str, Any]:
        return upload_digest(self.table)

    def specs(self) -> dict[str, TensorSpec]:
        positions, dim = self.table.shape
        freqs = positions // 2 + 1
        shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {"frequency": ((freqs,), F64)}
        for prefix in ("", "sinusoidal_"):
            shapes |= {f"{prefix}cosine_similarity": ((positions, positions), F64),
                       f"{prefix}spectrum": ((freqs,), F64),
                       f"{prefix}dominant_frequency": ((dim,), F64), f"{prefix}nearest_offset": ((positions,), I64),
                       f"{prefix}similarity_by_distance": ((positions,), F64)}
        return {name: TensorSpec(*shapes[name]) for name in self.tensors}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        positions, dim = self.table.shape
        return super().working_bytes(specs) + 8 * positions * positions + 48 * positions * dim

    def compute(self) -> Bundle:
        curves, scalars = learned_properties(self.table)
        return Bundle(curves, summary(scalars))

    def picture_elements(self, specs: Mapping[str, TensorSpec], selected: list[str]) -> int:
        return sum(specs[name].size for name in selected)

    def described(self, params: Mapping[str, str]) -> dict[str, str]:
        return {"table": params["upload_shape"] + " " + params["upload_dtype"]}

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        distance = np.arange(t["similarity_by_distance"].size)
        return (
            Heatmap("learned: cosine similarity", t["cosine_similarity"], "position", "position", "cos"),
            Heatmap("sinusoidal: cosine similarity", t["sinusoidal_cosine_similarity"], "position", "position", "cos"),
            Panel("mean similarity against distance", "distance", "mean cosine similarity",
                  (Curve(distance, t["similarity_by_distance"], "learned"),
                   Curve(distance, t["sinusoidal_similarity_by_distance"], "sinusoidal"))),
            Panel("spectrum over positions", "cycles per position", "mean amplitude",
                  (Curve(t["frequency"][1:], t["spectrum"][1:], "learned"),  # without the removed mean
                   Curve(t["frequency"][1:], t["sinusoidal_spectrum"][1:], "sinusoidal")), logy=True),
        )



class T5BiasPropertiesQuery(T5PropertiesQuery):
    """The bias each head of the uploaded learned table adds against key − query, with the bucket
    boundaries (the curves of `GET /v1/properties/t5` plus `bias_by_offset`)."""

    endpoint = "properties/t5/bias"
    body = WEIGHT_BODY
    tensors = ("relative_position", "bucket", "boundaries", "bias_by_offset")  # type: ignore[assignment]  # curves, not the table's

    def check(self) -> None:
        super().check()
        if self.upload is not None:
            check_t5_weight_shape(self.upload.shape, self.num_buckets)

    def params(self) -> dict[str, Any]:
        return {**super().params(), **upload_digest(self.upload)}

    def specs(self) -> dict[str, TensorSpec]:
        if self.upload is None:
            raise ParameterError("weight", "a learned table [num_buckets, num_heads] is required")
        offsets = self.curve[0]
        return {**super().specs(),
                "bias_by_offset": TensorSpec((self.upload.shape[1], offsets.size), self.upload.dtype)}

    def compute(self) -> Bundle:
        bundle = super().compute()
        bundle.tensors["bias_by_offset"] = t5_bias_by_offset(self.upload, self.curve[1])
        return bundle

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        marks = tuple(float(b) for b in t["boundaries"])
        return (*super().panels(t, params),
                Panel("T5 learned bias against key − query", "key − query", "bias added to the logit",
                      head_curves(t["relative_position"], t["bias_by_offset"]), marks=marks,
                      mark_label="bucket boundaries"))


register_properties("/v1/properties/learned", LearnedPropertiesQuery,
                    summary="Properties of an uploaded learned position table, against sinusoidal",
                    response_description="Curves and matrices as tensors; scalars in the metadata.")
register_properties("/v1/properties/t5/bias", T5BiasPropertiesQuery,
                    summary="T5: the bias each head of an uploaded learned table adds against key − query")
