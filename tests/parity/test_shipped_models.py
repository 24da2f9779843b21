"""The shipped public-model graphs against the model's own transformers attention class, built from the same
config.json fields (`posenc.models.export.shipped_models`), on random hidden states.

The transformers layer projects random hidden states with its own random weights; its pre-rotation q and k
(the arguments of its module's `apply_rotary_pos_emb`), v and attention output (of its `eager_attention_forward`)
are recorded, and the shipped graph must turn the same q, k, v and positions into the same output. transformers
is called one row at a time (it picks longrope's factor set per batch) and the graph once for all rows
(it picks per row), so the test also shows that a row's result does not depend on its batch.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoConfig

from posenc.models.export.exporter import default_specs
from posenc.models.export.shipped_models import SHIPPED_MODELS, ShippedModel
from tests.onnx_models import REPOSITORY, run, session

SEQ = 6
# atol/rtol of the other parity tests (tests/parity/test_export.py)
ATOL, RTOL = 2e-5, 1e-4


def _row_starts(model: ShippedModel) -> list[int]:
    """First positions of the rows: the start, the end of the graph's range, and both sides of a switch."""
    config = json.loads((REPOSITORY / model.name / "config.json").read_text())
    starts = [0, 1000, config["max_position"] - SEQ]
    if (switch := config["rope"].get("switch_position")) is not None:
        starts += [switch - SEQ, switch - SEQ + 1]  # last row on the first set, first row on the switched one
    return starts


@contextmanager
def _recorded(modeling: ModuleType) -> Iterator[dict[str, torch.Tensor]]:
    """Record q and k before the rotation, v and the attention output [B, S, Hq, D] of one forward."""
    seen: dict[str, torch.Tensor] = {}
    apply_rope, attend = modeling.apply_rotary_pos_emb, modeling.eager_attention_forward

    def recording_rope(q: torch.Tensor, k: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["query"], seen["key"] = q.detach().clone(), k.detach().clone()
        return apply_rope(q, k, *args, **kwargs)

    def recording_attention(module: Any, query: Any, key: Any, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["value"] = value.detach().clone()
        output, weights = attend(module, query, key, value, *args, **kwargs)
        seen["output"] = output.detach().clone()
        return output, weights

    modeling.apply_rotary_pos_emb, modeling.eager_attention_forward = recording_rope, recording_attention
    try:
        yield seen
    finally:
        modeling.apply_rotary_pos_emb, modeling.eager_attention_forward = apply_rope, attend


def _transformers_row(model: ShippedModel, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """One row [1, S] through the model's attention layer: its q, k, v [1, H, S, D] and output [1, Hq, S, D]."""
    config = AutoConfig.for_model(**dict(model.config))
    config._attn_implementation = "eager"
    modeling = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    prefix = model.attention_class.removesuffix("Attention")
    torch.manual_seed(int(positions[0, 0]))
    attention = getattr(modeling, model.attention_class)(config, layer_idx=0).eval()
    rotary = getattr(modeling, f"{prefix}RotaryEmbedding")(config)
    hidden = torch.randn(1, positions.shape[1], config.hidden_size)
    causal = torch.full((SEQ, SEQ), torch.finfo(torch.float32).min).triu(1)[None, None]  # [1, 1, S, S] additive
    with torch.no_grad(), _recorded(modeling) as seen:
        attention(hidden, position_embeddings=rotary(hidden, positions), attention_mask=causal)
    return {**seen, "output": seen["output"].transpose(1, 2)}


@pytest.mark.parametrize("graph", ["model.onnx", "model.cpu.onnx"])
@pytest.mark.parametrize("model", SHIPPED_MODELS, ids=lambda m: m.name)
def test_shipped_graph_equals_the_models_transformers_attention(model: ShippedModel, graph: str) -> None:
    rows = [torch.arange(start, start + SEQ)[None] for start in _row_starts(model)]  # each [1, S]
    reference = [_transformers_row(model, positions) for positions in rows]
    inputs = {name: torch.cat([row[name] for row in reference]).numpy() for name in ("query", "key", "value")}
    inputs["position_ids"] = torch.cat(rows).numpy()
    got = run(session(REPOSITORY / model.name / graph), inputs)  # the standard graph and the CPU form
    expected = torch.cat([row["output"] for row in reference]).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


def test_longrope_rows_on_either_side_of_the_switch_differ() -> None:
    """The switch is visible: the long factors give another output than the short ones would."""
    model = next(m for m in SHIPPED_MODELS if m.name == "phi3_5_mini_attention")
    config = json.loads((REPOSITORY / model.name / "config.json").read_text())
    switch = config["rope"]["switch_position"]
    assert switch == model.config["original_max_position_embeddings"]
    assert config["rope"]["inv_freq"] != config["rope"]["inv_freq_switched"]
    positions = torch.arange(switch - SEQ + 1, switch + 1)[None]  # reaches the switch: long factors
    row = _transformers_row(model, positions)
    inputs = {name: row[name].numpy() for name in ("query", "key", "value")}
    long_output = run(session(REPOSITORY / model.name / "model.onnx"), {**inputs, "position_ids": positions.numpy()})
    np.testing.assert_allclose(long_output, row["output"].numpy(), atol=ATOL, rtol=RTOL)
    spec = next(s for s in default_specs() if s.name == model.name)
    short = spec.module()
    short.inv_freq_sets = None  # the first (short-factor) set for every row
    with torch.no_grad():
        short_output = short(*(row[name] for name in ("query", "key", "value")), positions).numpy()
    assert not np.allclose(long_output, short_output, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("model", SHIPPED_MODELS, ids=lambda m: m.name)
def test_shipped_config_json_names_its_source(model: ShippedModel) -> None:
    config = json.loads((REPOSITORY / model.name / "config.json").read_text())
    hf = AutoConfig.for_model(**dict(model.config))
    assert config["source"]["model_id"] == model.model_id and config["source"]["read_from"] == model.read_from
    assert config["attention"]["num_heads"] == hf.num_attention_heads
    assert config["attention"]["num_kv_heads"] == hf.num_key_value_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert config["attention"]["head_dim"] == head_dim
    assert config["max_position"] == (model.max_position or hf.max_position_embeddings)
