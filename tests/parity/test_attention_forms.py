"""The attention forms of `posenc.models.export.attention_forms`: every form of every shipped model answers what
model.onnx answers, within the parity tests' tolerances, at sequence lengths that blocks do not divide."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

from posenc.models.export.attention_forms import FORMS, build_form
from tests.onnx_models import REPOSITORY, SHIPPED, geometry, random_inputs, run, session
from tests.parity.test_cpu_form import _attention_graph

SEQUENCES = (1, 7, 33)  # one row, fewer rows than blocks, rows that no block count divides


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("model", SHIPPED)
def test_every_form_answers_what_model_onnx_answers(model: str, form: str) -> None:
    built = build_form(onnx.load(REPOSITORY / model / "model.onnx"), form, *geometry(model))
    assert built is not None
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    derived = ort.InferenceSession(built.SerializeToString(), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    standard = session(REPOSITORY / model / "model.onnx")
    for seq in SEQUENCES:
        inputs = random_inputs(*geometry(model), batch=2, seq=seq)
        got, expected = run(derived, inputs), run(standard, inputs)
        assert got.shape == expected.shape
        assert abs(got - expected).max() <= 2e-5 + 1e-4 * abs(expected).max(), (model, form, seq)


@pytest.mark.parametrize("form", [f for f in FORMS if f != "gqa"])
@pytest.mark.parametrize("graph", [_attention_graph(is_causal=0), _attention_graph(is_causal=1, softcap=30.0),
                                   _attention_graph(mask=True, is_causal=1)], ids=["bidirectional", "softcap", "mask"])
def test_an_attention_the_forms_do_not_express_has_none(graph: onnx.ModelProto, form: str) -> None:
    assert build_form(graph, form, 4, 2, 8) is None


@pytest.mark.parametrize("form", ["flash", "blocked1", "blockedx"])
def test_an_unknown_form_is_named(form: str) -> None:
    with pytest.raises(ValueError, match=f"unknown form '{form}'; one of unfused"):
        build_form(_attention_graph(is_causal=1), form, 4, 2, 8)
