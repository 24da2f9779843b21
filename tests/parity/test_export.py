"""The exported opset-23 graphs: fused ops, dynamic B/S, equal to the torch module; the shipped repository."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply

from posenc.models.export.exporter import (
    IR_VERSION,
    ExportError,
    ExportSpec,
    check_fused_graph,
    default_specs,
    export,
    op_counts,
)
from posenc.models.rope import make_rope_parameters
from posenc.service.cli.main import main as posenc_main
from tests.onnx_models import REPOSITORY, random_inputs, run, session

# Graphs built here by hand carry the exporter's IR version: helper.make_model would stamp the installed
# onnx's newest IR (14 with onnx 1.23), which onnxruntime 1.30/1.31 refuse ("max supported IR version: 13").
ORT_IR_VERSION = IR_VERSION

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}

# (name, Hq, Hkv, D, partial_rotary_factor, layout, causal, theta, scaling): MHA, GQA 2:1 and 3:1, MQA;
# both layouts; partial rotary; causal and bidirectional; default and llama3 frequencies.
GRID = [
    ("mha_half_causal", 4, 4, 16, 1.0, "half", True, 10000.0, None),
    ("gqa_interleaved_bidir_partial", 4, 2, 16, 0.5, "interleaved", False, 10000.0, None),
    ("mqa_half_causal_llama3", 4, 1, 32, 1.0, "half", True, 500000.0, LLAMA3),
    ("gqa3_half_bidir_partial_llama3", 6, 2, 16, 0.5, "half", False, 500000.0, LLAMA3),
    ("mha_interleaved_causal_llama3", 2, 2, 8, 1.0, "interleaved", True, 500000.0, LLAMA3),
]


# Rope types beyond default/llama3: exported and compared when posenc.models.rope supports them.
EXTRA_TYPES = [
    ("linear", {"rope_type": "linear", "factor": 4.0}),
    ("dynamic", {"rope_type": "dynamic", "factor": 2.0}),
    ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}),
    ("longrope", {"rope_type": "longrope", "original_max_position_embeddings": 4096,
                  "short_factor": tuple(1.0 + 0.1 * i for i in range(8)),
                  "long_factor": tuple(2.0 + 0.5 * i for i in range(8))}),
    ("proportional", {"rope_type": "proportional", "partial_rotary_factor": 0.5}),
]


def _spec(name: str, hq: int, hkv: int, dim: int, prf: float, layout: str, causal: bool, theta: float,
          scaling: dict | None) -> ExportSpec:
    rope = make_rope_parameters(head_dim=dim, rope_theta=theta, partial_rotary_factor=prf,
                                max_position_embeddings=131072, **(scaling or {}))
    return ExportSpec(name, rope, hq, hkv, layout=layout, causal=causal, max_batch_size=4,  # type: ignore[arg-type]
                      max_position=131072)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ExportSpec, Path]]:
    root = tmp_path_factory.mktemp("repo")
    out = {}
    for row in GRID:
        spec = _spec(*row)
        out[spec.name] = (spec, export(spec, root))
    return out


@pytest.mark.parametrize("name", [row[0] for row in GRID])
def test_graph_has_one_attention_and_rotary_nodes_only(exported: dict, name: str) -> None:
    _, folder = exported[name]
    model = onnx.load(folder / "model.onnx")
    counts = op_counts(model)
    assert counts["Attention"] == 1 and counts["RotaryEmbedding"] == 2
    assert not {"MatMul", "Softmax", "Neg", "Concat"} & set(counts), counts
    assert {imp.domain: imp.version for imp in model.opset_import}[""] == 23
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert dims["query"][0] == dims["position_ids"][0] and isinstance(dims["query"][0], str)
    assert dims["query"][2] == dims["position_ids"][1] and isinstance(dims["query"][2], str)
    assert (folder / "model.onnx").stat().st_size < 64 * 1024


@pytest.mark.parametrize("name", [row[0] for row in GRID])
@pytest.mark.parametrize(("batch", "seq", "start"), [(1, 1, 0), (2, 5, 0), (3, 17, 1000), (1, 33, 100000)])
def test_onnxruntime_equals_torch_module(exported: dict, name: str, batch: int, seq: int, start: int) -> None:
    spec, folder = exported[name]
    inputs = random_inputs(spec.num_heads, spec.num_kv_heads, spec.rope.head_dim, batch, seq, seed=seq, start=start)
    got = run(session(folder / "model.onnx"), inputs)
    with torch.no_grad():
        expected = spec.module()(*(torch.from_numpy(inputs[k]) for k in ("query", "key", "value", "position_ids")))
    assert got.shape == (batch, spec.num_heads, seq, spec.rope.head_dim)
    np.testing.assert_allclose(got, expected.numpy(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("rope_type", "scaling"), EXTRA_TYPES, ids=[t for t, _ in EXTRA_TYPES])
def test_other_rope_types_export_and_match(rope_type: str, scaling: dict, tmp_path: Path) -> None:
    scaling = dict(scaling)  # the parametrize dict is shared: popping from it would change a rerun
    prf = scaling.pop("partial_rotary_factor", 1.0) if rope_type == "proportional" else 1.0
    rope = make_rope_parameters(head_dim=16, rope_theta=10000.0, max_position_embeddings=16384,
                                partial_rotary_factor=prf, **scaling)
    frozen = 16384 if rope_type in ("dynamic", "longrope") else None
    spec = ExportSpec(rope_type, rope, 4, 2, max_position=16384, inv_freq_seq_len=frozen)
    folder = export(spec, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["rope"]["rope_type"] == rope_type and ("note" in config["rope"]) == (frozen is not None)
    inputs = random_inputs(4, 2, 16, 2, 7, start=9000)
    with torch.no_grad():
        expected = spec.module()(*(torch.from_numpy(inputs[k]) for k in ("query", "key", "value", "position_ids")))
    np.testing.assert_allclose(run(session(folder / "model.onnx"), inputs), expected.numpy(), atol=2e-5, rtol=1e-4)


def test_longrope_graph_switches_factor_sets_per_row(tmp_path: Path) -> None:
    """Not frozen, a longrope graph holds both sets: rows up to the switch use the short factors, rows past it the
    long ones, each by its own largest position, as the module does and as the frozen graphs cannot."""
    scaling = dict(EXTRA_TYPES[3][1])
    rope = make_rope_parameters(head_dim=16, rope_theta=10000.0, max_position_embeddings=16384, **scaling)
    spec = ExportSpec("longrope_switching", rope, 4, 2, max_position=16384)
    folder = export(spec, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["rope"]["switch_position"] == 4096 and config["rope"]["inv_freq_seq_len"] is None
    assert config["ops"]["GatherND"] == 1 and config["ops"]["ReduceMax"] == 1
    inputs = random_inputs(4, 2, 16, 4, 3, start=4090)  # rows end at 4092, 4095 (short), 4098, 4101 (long)
    got = run(session(folder / "model.onnx"), inputs)
    with torch.no_grad():
        expected = spec.module()(*(torch.from_numpy(inputs[k]) for k in ("query", "key", "value", "position_ids")))
        short = ExportSpec("short", rope, 4, 2, inv_freq_seq_len=None).module()
        short.inv_freq_sets = None
        short_out = short(*(torch.from_numpy(inputs[k]) for k in ("query", "key", "value", "position_ids")))
    np.testing.assert_allclose(got, expected.numpy(), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(got[:2], short_out.numpy()[:2], atol=2e-5, rtol=1e-4)
    assert not np.allclose(got[2:], short_out.numpy()[2:], atol=1e-3)


def test_config_json_describes_the_graph(exported: dict) -> None:
    _, folder = exported["gqa_interleaved_bidir_partial"]
    config = json.loads((folder / "config.json").read_text())
    assert config["max_batch_size"] == 4 and config["causal"] is False and config["opset"] == 23
    assert [i["name"] for i in config["inputs"]] == ["query", "key", "value", "position_ids"]
    assert config["inputs"][1] == {"name": "key", "datatype": "FP32", "shape": [-1, 2, -1, 16]}
    assert config["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 4, -1, 16]}]
    assert config["rope"]["layout"] == "interleaved" and config["rope"]["rotary_dim"] == 8
    assert config["ops"] == dict(sorted(op_counts(onnx.load(folder / "model.onnx")).items()))
    assert config["sha256"] == hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()


def test_check_fused_graph_refuses_a_decomposition() -> None:
    q = helper.make_tensor_value_info("query", TensorProto.FLOAT, ["batch", 2, "sequence", 8])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 2, "sequence", "sequence"])
    graph = helper.make_graph([helper.make_node("MatMul", ["query", "query"], ["output"])], "g", [q], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    with pytest.raises(ExportError, match="Attention"):
        check_fused_graph(model)


@pytest.mark.parametrize("spec", default_specs(), ids=lambda s: s.name)
def test_shipped_graphs_match_a_fresh_export(spec: ExportSpec, tmp_path: Path) -> None:
    fresh = export(spec, tmp_path)
    shipped = REPOSITORY / spec.name
    shipped_config = json.loads((shipped / "config.json").read_text())
    fresh_config = json.loads((fresh / "config.json").read_text())
    for key in ("inputs", "outputs", "max_batch_size", "causal", "max_position", "rope", "attention", "opset", "ops"):
        assert shipped_config[key] == fresh_config[key], key
    for batch, seq, start in [(1, 3, 0), (2, 9, 5000)]:
        inputs = random_inputs(spec.num_heads, spec.num_kv_heads, spec.rope.head_dim, batch, seq, start=start)
        got = run(session(shipped / "model.onnx"), inputs)
        np.testing.assert_allclose(got, run(session(fresh / "model.onnx"), inputs), atol=1e-6, rtol=1e-6)
        with torch.no_grad():
            expected = spec.module()(*(torch.from_numpy(inputs[k]) for k in ("query", "key", "value", "position_ids")))
        np.testing.assert_allclose(got, expected.numpy(), atol=2e-5, rtol=1e-4)


def test_shipped_repository_is_artefacts_only() -> None:
    folders = sorted(p.name for p in REPOSITORY.iterdir())
    assert {"rope_attention", "llama3_1_attention"} <= set(folders)
    for name in folders:
        forms = [entry["file"] for entry in json.loads((REPOSITORY / name / "config.json").read_text())["cpu_forms"]]
        assert sorted(p.name for p in (REPOSITORY / name).iterdir()) == sorted(["config.json", "model.onnx", *forms])
        for file in ("model.onnx", *forms):
            assert (REPOSITORY / name / file).stat().st_size < 64 * 1024
    assert not (REPOSITORY / "__init__.py").exists()
    assert Path(onnx.__file__).resolve().parent != REPOSITORY.resolve()


def test_shipped_llama31_geometry() -> None:
    config = json.loads((REPOSITORY / "llama3_1_attention" / "config.json").read_text())
    assert config["attention"]["num_heads"] == 4 * config["attention"]["num_kv_heads"]
    assert config["rope"]["rope_type"] == "llama3" and config["rope"]["rope_theta"] == 500000.0
    assert config["inputs"][0]["shape"] == [-1, 32, -1, 128]
    plain = json.loads((REPOSITORY / "rope_attention" / "config.json").read_text())
    assert plain["inputs"][0]["shape"][3] == 64 and plain["causal"] and plain["rope"]["layout"] == "half"


def test_posenc_export_from_hf_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 16384,
          "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    (tmp_path / "hf.json").write_text(json.dumps(hf))
    code = posenc_main(["export", "--from-config", str(tmp_path / "hf.json"), "--name", "tiny_llama",
                        "--repository", str(tmp_path / "repo")])
    assert code == 0 and "tiny_llama" in capsys.readouterr().out
    config = json.loads((tmp_path / "repo" / "tiny_llama" / "config.json").read_text())
    assert config["inputs"][0]["shape"] == [-1, 8, -1, 32] and config["inputs"][1]["shape"] == [-1, 2, -1, 32]
    assert config["rope"]["rope_type"] == "llama3" and config["max_position"] == 16384
    assert config["source"]["model_type"] == "llama"


def test_posenc_export_longrope_from_options(tmp_path: Path) -> None:
    factors = ",".join(["1.0"] * 4)
    code = posenc_main(["export", "--name", "lr", "--head-dim", "8", "--num-heads", "2", "--num-kv-heads", "1",
                        "--rope-type", "longrope", "--short-factor", factors, "--long-factor", factors,
                        "--original-max-position-embeddings", "1024", "--max-position", "4096",
                        "--bidirectional", "--layout", "interleaved", "--repository", str(tmp_path)])
    assert code == 0
    config = json.loads((tmp_path / "lr" / "config.json").read_text())
    assert config["rope"]["long_factor"] == [1.0] * 4 and config["rope"]["inv_freq_seq_len"] is None
    assert config["rope"]["switch_position"] == 1024 and len(config["rope"]["inv_freq_switched"]) == 4
    assert config["causal"] is False and config["rope"]["layout"] == "interleaved"


def test_posenc_export_reports_bad_geometry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = posenc_main(["export", "--name", "bad", "--num-heads", "6", "--num-kv-heads", "4",
                        "--repository", str(tmp_path)])
    assert code == 2 and "multiple" in capsys.readouterr().err


@pytest.mark.parametrize(("layout", "prf"), [("half", 1.0), ("half", 0.5), ("interleaved", 1.0), ("interleaved", 0.5)])
def test_onnxruntime_rotary_embedding_kernel_equals_transformers(layout: str, prf: float) -> None:
    """The RotaryEmbedding-23 kernel alone, fed the module's cos/sin, against transformers' rotation."""
    dim, heads = 16, 3
    spec = _spec("rot", heads, heads, dim, prf, layout, True, 500000.0, LLAMA3)
    module = spec.module()
    rd = module.rotary_dim
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], interleaved=int(layout == "interleaved"),
                            rotary_embedding_dim=rd if rd != dim else 0)
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [node], "rope",
        [helper.make_tensor_value_info("x", f32, ["B", heads, "S", dim]),
         helper.make_tensor_value_info("cos", f32, ["B", "S", rd // 2]),
         helper.make_tensor_value_info("sin", f32, ["B", "S", rd // 2])],
        [helper.make_tensor_value_info("y", f32, ["B", heads, "S", dim])],
    )
    model = helper.make_model(graph, ir_version=ORT_IR_VERSION, opset_imports=[helper.make_opsetid("", 23)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = torch.randn(2, heads, 9, dim)
    positions = torch.arange(9).repeat(2, 1) + torch.tensor([[0], [70000]])  # [B, S]
    cos, sin = module.cos_sin(positions)  # [B, S, R/2]
    got = sess.run(["y"], {"x": x.numpy(), "cos": cos.numpy(), "sin": sin.numpy()})[0]
    if layout == "half":  # GPT-NeoX: rotate_half on x[..., :rd], the rest passed through
        expected, _ = neox_apply(x, x, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    else:  # GPT-J: rotate_every_two on x[..., :rd] in [B, S, H, D]
        rotated = gptj_apply(x.transpose(1, 2)[..., :rd], sin, cos).transpose(1, 2)
        expected = torch.cat((rotated, x[..., rd:]), -1)
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-6, rtol=1e-6)
