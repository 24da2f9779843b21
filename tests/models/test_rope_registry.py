"""The rope_type registry: every entry is coherent, resolves from the API's names and from a config.json
alike, gives a table of the width it declares, and a new entry needs no code outside the registry."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from posenc.models.diagnosis.rope import RopeTable, rope_hypotheses
from posenc.models.errors import ParameterError
from posenc.models.rope import inv_freq_and_attention_factor, inv_freq_switch, rope_cos_sin
from posenc.models.rope_config import rope_parameters_from_config
from posenc.models.rope_frequencies import linear_inv_freq
from posenc.models.rope_params import RopeParameters, make_rope_parameters
from posenc.models.rope_types import ROPE_TYPES, RopeTypeSpec, rope_type_spec

HEAD_DIM = 16  # 8 frequencies
ROWS = 300  # past MAX_POSITION_EMBEDDINGS: the batch-dependent types switch to their long-context form
MAX_POSITION_EMBEDDINGS = 128
# A value for every scaling field some rope_type reads (lengths: original < max < ROWS)
VALUES: dict[str, Any] = {
    "factor": 4.0, "original_max_position_embeddings": 32, "attention_factor": 1.5, "beta_fast": 16.0,
    "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "short_factor": [1.0 + i / 8 for i in range(8)],
    "long_factor": [2.0 + i / 8 for i in range(8)], "alpha": 3.0,
}
GEOMETRY = {"head_dim", "rotary_dim", "rope_theta", "rope_type", "partial_rotary_factor"}


def _values(spec: RopeTypeSpec) -> dict[str, Any]:
    return {name: VALUES[name] for name in spec.reads if name in VALUES}


@pytest.mark.parametrize("name", list(ROPE_TYPES))
def test_entry_names_only_fields_it_reads(name: str) -> None:
    spec = ROPE_TYPES[name]
    fields = {f.name for f in dataclasses.fields(RopeParameters)}
    assert spec.reads <= fields - GEOMETRY
    assert set(spec.required) <= spec.reads
    assert spec.config_keys - {"rope_type", "rope_theta"} <= spec.reads
    assert set(spec.query_defaults) <= spec.reads
    assert set(VALUES) | {"max_position_embeddings"} >= spec.reads, "give the new field a value in VALUES"


@pytest.mark.parametrize("name", list(ROPE_TYPES))
def test_every_rope_type_gives_the_table_it_declares(name: str) -> None:
    spec = ROPE_TYPES[name]
    params = make_rope_parameters(head_dim=HEAD_DIM, rope_type=name, max_position_embeddings=MAX_POSITION_EMBEDDINGS,
                                  **_values(spec))
    cos, sin, info = rope_cos_sin(params, ROWS, dtype=np.float64)
    width = spec.table_width(params.head_dim, params.rotary_dim)
    assert cos.shape == sin.shape == (ROWS, width) and info.inv_freq.shape == (width // 2,)
    assert np.isfinite(cos).all() and np.isfinite(sin).all()
    np.testing.assert_allclose(cos**2 + sin**2, info.attention_factor**2, rtol=1e-12)
    # a table that depends on the batch says what it was computed with
    reported = {k for k in ("factor_set", "dynamic_rope_theta") if getattr(info, k) is not None}
    assert bool(reported) == spec.runtime_dependent


@pytest.mark.parametrize("name", list(ROPE_TYPES))
def test_a_switch_splits_the_batch_lengths_into_two_frequency_sets(name: str) -> None:
    """What a static graph holds for a batch-dependent type (`inv_freq_switch`): up to L one set, past L the other,
    at every length up to ROWS; the types without a switch either never change or change at every length."""
    spec = ROPE_TYPES[name]
    params = make_rope_parameters(head_dim=HEAD_DIM, rope_type=name, max_position_embeddings=MAX_POSITION_EMBEDDINGS,
                                  **_values(spec))
    switch = inv_freq_switch(params)
    at = {seq_len: inv_freq_and_attention_factor(params, seq_len)[0] for seq_len in range(1, ROWS + 1)}
    first = inv_freq_and_attention_factor(params)[0]
    if switch is None:
        assert spec.switch_length is None
        changed = [seq_len for seq_len, freqs in at.items() if not np.array_equal(freqs, first)]
        assert bool(changed) == spec.runtime_dependent
        return
    length, second = switch
    assert spec.runtime_dependent and 1 <= length < ROWS and not np.array_equal(first, second)
    for seq_len, freqs in at.items():
        np.testing.assert_array_equal(freqs, first if seq_len <= length else second, err_msg=f"seq_len {seq_len}")


@pytest.mark.parametrize("name", list(ROPE_TYPES))
def test_config_json_reads_the_fields_the_type_reads(name: str) -> None:
    spec = ROPE_TYPES[name]
    values = _values(spec)
    truncate = values.pop("truncate", None)
    rope: dict[str, Any] = {"rope_type": name, "rope_theta": 10000.0, **values}
    if truncate is not None:
        rope["truncate"] = truncate
    config = {"head_dim": HEAD_DIM, "max_position_embeddings": MAX_POSITION_EMBEDDINGS, "rope_parameters": rope}
    from_config, _ = rope_parameters_from_config(config)
    direct = make_rope_parameters(head_dim=HEAD_DIM, rope_type=name, max_position_embeddings=MAX_POSITION_EMBEDDINGS,
                                  **_values(spec))
    assert from_config == direct


@pytest.mark.parametrize("name", list(ROPE_TYPES))
def test_scaling_hypotheses_apply_to_the_scaled_types(name: str) -> None:
    spec = ROPE_TYPES[name]
    params = make_rope_parameters(head_dim=HEAD_DIM, rope_type=name, max_position_embeddings=MAX_POSITION_EMBEDDINGS,
                                  **_values(spec))
    table = RopeTable(params, 16, 0, "half", "full", np.dtype(np.float32))
    names = {h.name for h in rope_hypotheses(table, table.reference())}
    assert ("scaling_not_applied" in names) == spec.scaled


def test_a_new_entry_needs_no_code_outside_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry with its formula is validated, resolved from a config.json, computed and diagnosed."""
    name = "halved"
    entry = RopeTypeSpec(reads=frozenset({"factor"}), required=("factor",),
                         config_keys=frozenset({"rope_type", "factor"}), inv_freq=linear_inv_freq, scaled=True)
    monkeypatch.setitem(ROPE_TYPES, name, entry)
    assert rope_type_spec(name) is entry
    params = make_rope_parameters(head_dim=HEAD_DIM, rope_type=name, factor=2.0, low_freq_factor=9.0)
    assert params.factor == 2.0 and params.low_freq_factor is None  # fields it does not read are dropped
    config = {"head_dim": HEAD_DIM, "rope_parameters": {"rope_type": name, "factor": 2.0}}
    assert rope_parameters_from_config(config)[0] == params
    with pytest.raises(ParameterError, match="factor"):
        make_rope_parameters(head_dim=HEAD_DIM, rope_type=name)
    cos, _, _ = rope_cos_sin(params, 8)
    linear, _, _ = rope_cos_sin(dataclasses.replace(params, rope_type="linear"), 8)
    np.testing.assert_array_equal(cos, linear)
    table = RopeTable(params, 8, 0, "half", "full", np.dtype(np.float32))
    assert "scaling_not_applied" in {h.name for h in rope_hypotheses(table, table.reference())}
