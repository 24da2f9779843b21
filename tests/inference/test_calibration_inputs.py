"""`config_inputs` (`posenc.service.inference.runtime.calibration`): the sequence axis of each input calibration times,
the
first dynamic axis after the batch axis (axis 0 is the batch even though it is dynamic too)."""

from __future__ import annotations

import json
from pathlib import Path

from posenc.service.inference.runtime.calibration import config_inputs

ROOT = Path(__file__).resolve().parents[2]


def test_the_sequence_axis_is_the_first_dynamic_axis_after_the_batch() -> None:
    config = {"inputs": [{"name": "query", "datatype": "FP32", "shape": [-1, 8, -1, 64]},
                         {"name": "position_ids", "datatype": "INT64", "shape": [-1, -1]}]}
    # axis 0 (the batch) taken for the sequence would time B = length, S = 1
    assert config_inputs(config) == [("query", "FP32", [-1, 8, -1, 64], 2),
                                     ("position_ids", "INT64", [-1, -1], 1)]


def test_an_input_without_a_dynamic_axis_after_the_batch_has_no_sequence_axis() -> None:
    config = {"inputs": [{"name": "scale", "datatype": "FP32", "shape": [-1, 4]}]}
    assert config_inputs(config) == [("scale", "FP32", [-1, 4], None)]


def test_the_shipped_model_s_inputs_are_timed_along_their_sequence() -> None:
    config = json.loads((ROOT / "onnx" / "rope_attention" / "config.json").read_text())
    axes = {name: axis for name, _, _, axis in config_inputs(config)}
    assert axes == {"query": 2, "key": 2, "value": 2, "position_ids": 1}
