"""XLNet relative sinusoid: equal to transformers 5.23 `XLNetModel.relative_positional_encoding` within the
precision contract for qlen/klen up to 512, both attn types, with and without clamp_len and bi_data; and the
`GET /v1/relative/sinusoidal` route.
"""

import itertools
import json
import types
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load as load_safetensors
from transformers.models.xlnet.modeling_xlnet import XLNetModel

from posenc.models.errors import ParameterError
from posenc.models.rope_types import default_inv_freq
from posenc.models.xlnet import xlnet_distances, xlnet_relative_sinusoid
from tests.rope_reference import cos_sin_tolerance


def reference(qlen: int, klen: int, d_model: int, attn_type: str, bi_data: bool, clamp_len: int) -> np.ndarray:
    owner: Any = types.SimpleNamespace(d_model=d_model, attn_type=attn_type, bi_data=bi_data, clamp_len=clamp_len,
                                  positional_embedding=XLNetModel.positional_embedding)
    out: np.ndarray = XLNetModel.relative_positional_encoding(owner, qlen, klen).numpy()
    return out


def assert_matches(qlen: int, klen: int, d_model: int, attn_type: Any, bi_data: bool, clamp_len: int) -> None:
    ref = reference(qlen, klen, d_model, attn_type, bi_data, clamp_len)
    ours = xlnet_relative_sinusoid(qlen, klen, d_model, attn_type, bi_data, clamp_len)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    distances = xlnet_distances(qlen, klen, attn_type, bi_data, clamp_len)  # [rows, n]
    inv_freq = default_inv_freq(10000.0, d_model)
    bound = cos_sin_tolerance(np.abs(distances).max(axis=1), inv_freq, 1.0)  # [rows, d/2]
    bound = np.tile(bound, 2)[:, None, :]  # [rows, 1, d]: sin and cos halves
    assert np.all(np.abs(ours - ref) <= bound)


@pytest.mark.parametrize(("attn_type", "bi_data", "clamp_len"),
                         list(itertools.product(["bi", "uni"], [False, True], [-1, 0, 7, 200])))
@pytest.mark.parametrize(("qlen", "klen"), [(1, 1), (5, 12), (64, 64), (300, 512), (512, 512), (512, 100)])
def test_matches_reference(qlen: int, klen: int, attn_type: str, bi_data: bool, clamp_len: int) -> None:
    assert_matches(qlen, klen, 64, attn_type, bi_data, clamp_len)


@pytest.mark.parametrize("d_model", [2, 6, 1024])
def test_matches_reference_widths(d_model: int) -> None:
    assert_matches(512, 512, d_model, "bi", True, -1)


def test_row_order_and_clamp() -> None:
    """Row r is distance klen − r; the backward table is its negation; clamping caps both."""
    d = xlnet_distances(2, 3, "bi", True, -1)
    assert d[:, 0].tolist() == [3, 2, 1, 0, -1] and d[:, 1].tolist() == [-3, -2, -1, 0, 1]
    assert xlnet_distances(2, 3, "uni", False, 2)[:, 0].tolist() == [2, 2, 1, 0]
    table = xlnet_relative_sinusoid(2, 3, 4, "bi")
    np.testing.assert_allclose(table[3, 0], [0, 0, 1, 1], atol=0)  # distance 0: sin 0, cos 1


def test_odd_width_refused() -> None:
    with pytest.raises(ParameterError) as info:
        xlnet_relative_sinusoid(2, 2, 5)
    assert info.value.parameter == "d_model"


def test_route(client: Any) -> None:
    r = client.get("/v1/relative/sinusoidal?qlen=16&klen=40&d_model=32&attn_type=uni&bi_data=true&clamp_len=20")
    assert r.status_code == 200, r.text
    pos_emb = load_safetensors(r.content)["pos_emb"]
    np.testing.assert_array_equal(pos_emb, xlnet_relative_sinusoid(16, 40, 32, "uni", True, 20))
    header = json.loads(r.content[8:8 + int.from_bytes(r.content[:8], "little")])
    assert header["__metadata__"]["row_order"] == "relative distance klen - row: 40 ... 0"
    as_f64 = client.get("/v1/relative/sinusoidal?qlen=16&klen=40&d_model=32&dtype=float64&format=npy")
    assert as_f64.status_code == 200
    bad = client.get("/v1/relative/sinusoidal?qlen=16&klen=40&d_model=33")
    assert bad.status_code == 422 and "d_model" in bad.json()["error"]
    zero = client.get("/v1/relative/sinusoidal?qlen=0&klen=40&d_model=32")
    assert zero.status_code == 422 and "qlen" in zero.json()["error"]
