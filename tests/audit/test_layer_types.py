"""Models with RoPE per layer type (Gemma 3 and 4 as transformers 5 writes them: `rope_parameters` per layer type,
`layer_types`, Gemma-4's head size in `per_layer_config`): every layer type judged, one section each, the verdict the
worst; `--layer-type` (`?layer_type=`) judges one (issue 56: transformers 5 configs)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save_file

from posenc.models.audit.layers import LayeredAudit
from posenc.models.audit.reference import from_preset
from posenc.models.errors import ParameterError
from posenc.models.rope_config import rope_layer_types, rope_parameters_from_config
from posenc.models.rope_frequencies import default_inv_freq
from posenc.service.audit import extract
from posenc.service.audit.run import read_path
from posenc.service.cli.main import main
from posenc.service.settings import Settings
from tests.audit.conftest import audit_file
from tests.audit_files import GEMMA3_T5, GEMMA4_T5, gemma3_gguf_meta, gemma4_gguf, write_gguf


def _failing(result: Any) -> dict[str, set[str]]:
    """{layer type: its failing facts' mistakes}, the whole model's under ""."""
    out = {"": {f.mistake for f in result.facts if f.failing}}
    out.update({name: {f.mistake for f in layer.facts if f.failing} for name, layer in result.layers.items()})
    return {name: found for name, found in out.items() if found}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3_T5))
    return path


def test_the_reader_resolves_every_layer_type() -> None:
    assert rope_layer_types(GEMMA3_T5) == ("full_attention", "sliding_attention")
    full, _ = rope_parameters_from_config(GEMMA3_T5, layer_type="full_attention")
    sliding, _ = rope_parameters_from_config(GEMMA3_T5, layer_type="sliding_attention")
    assert (full.rope_theta, full.head_dim, sliding.rope_theta, sliding.head_dim) == (1e6, 128, 1e4, 128)
    # Gemma-4: the full layers' head size from per_layer_config, partial rotary of it
    full, _ = rope_parameters_from_config(GEMMA4_T5, layer_type="full_attention")
    sliding, _ = rope_parameters_from_config(GEMMA4_T5, layer_type="sliding_attention")
    assert (full.rope_type, full.head_dim, full.rotary_dim) == ("proportional", 128, 32)
    assert (sliding.rope_type, sliding.head_dim, sliding.rotary_dim) == ("default", 64, 64)
    # a NoPE layer type (None) has no RoPE to judge; a flat rope_parameters has no layer types
    assert rope_layer_types({**GEMMA3_T5, "rope_parameters": {**GEMMA3_T5["rope_parameters"],
                                                              "sliding_attention": None}}) == ("full_attention",)
    assert rope_layer_types({**GEMMA3_T5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == ()


def test_per_layer_config_is_read_as_transformers_reads_it() -> None:
    """Keys are layer indices (zero-padded as to_dict writes them); a layer type whose layers differ is refused, as
    transformers' per_layer_config[layer_type] refuses it; without per_layer_config, global_head_dim applies."""
    padded = {**GEMMA4_T5, "num_hidden_layers": 12, "layer_types": GEMMA4_T5["layer_types"] * 2,
              "per_layer_config": {"05": {"head_dim": 128}, "11": {"head_dim": 128}}}
    assert rope_parameters_from_config(padded, layer_type="full_attention")[0].head_dim == 128
    uneven = {**padded, "per_layer_config": {"05": {"head_dim": 128}, "11": {"head_dim": 256}}}
    with pytest.raises(ParameterError, match="not homogeneous across layers \\(layer 11 differs\\)"):
        rope_parameters_from_config(uneven, layer_type="full_attention")
    with pytest.raises(ParameterError, match="per_layer_config: keys must be layer indices"):
        rope_parameters_from_config({**GEMMA4_T5, "per_layer_config": {"x": {}}}, layer_type="full_attention")
    legacy = {key: value for key, value in GEMMA4_T5.items() if key != "per_layer_config"}
    assert rope_parameters_from_config({**legacy, "global_head_dim": 128}, layer_type="full_attention")[0] \
        .head_dim == 128
    # per_layer_config present: Gemma4TextConfig ignores global_head_dim
    assert rope_parameters_from_config({**GEMMA4_T5, "per_layer_config": {}, "global_head_dim": 512},
                                       layer_type="full_attention")[0].head_dim == 64


def test_a_gemma3_gguf_with_the_default_base_on_its_full_layers_is_wrong(tmp_path: Path, config_file: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Before: against its transformers-5 config.json, config_not_buildable in the reference and the file judged
    against itself: CONSISTENT, exit 0. The full-attention layers' base (freq_base) is 10000, the model's 1e6."""
    bad = write_gguf(tmp_path / "bad.gguf", "gemma3", gemma3_gguf_meta(10000.0))
    result = audit_file(bad, config=GEMMA3_T5)
    assert isinstance(result, LayeredAudit) and result.verdict == "wrong"
    assert _failing(result) == {"full_attention": {"wrong_freq_base"}}, result.document()
    assert result.layer_verdict("sliding_attention") == "correct"
    theta = {f.name: f for f in result.layers["full_attention"].facts}["rope_theta"]
    assert (theta.expected, theta.found) == (1e6, 10000.0)
    assert theta.explanation.startswith("full_attention layers: the file's base (freq_base / rope_theta) is 10000")
    assert main(["audit", str(bad), "--config", str(config_file)]) == 1
    out = capsys.readouterr().out
    assert "position handling: WRONG" in out and "layer type full_attention: WRONG" in out
    assert "layer type sliding_attention: CORRECT" in out and "-> wrong_freq_base: full_attention layers" in out
    doc = result.document()
    assert doc["mistakes"] == ["wrong_freq_base"] and doc["reference"]["layer_types"] == ["full_attention",
                                                                                          "sliding_attention"]
    assert [(s["layer_type"], s["verdict"]) for s in doc["layer_types"]] == [("full_attention", "wrong"),
                                                                             ("sliding_attention", "correct")]
    assert doc["layer_types"][0]["tables"]["first_divergent_position"] == 1
    assert doc["layer_types"][1]["tables"]["within_contract"]


def test_the_correct_gemma3_gguf_is_correct(tmp_path: Path, config_file: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    good = write_gguf(tmp_path / "good.gguf", "gemma3", gemma3_gguf_meta(1e6))
    result = audit_file(good, config=GEMMA3_T5)
    assert result.verdict == "correct" and not result.failing, result.document()
    assert main(["audit", str(good), "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert "position handling: CORRECT" in out and "layer type sliding_attention: CORRECT" in out


def test_one_layer_type_is_chosen_by_name(tmp_path: Path, config_file: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = write_gguf(tmp_path / "bad.gguf", "gemma3", gemma3_gguf_meta(10000.0))
    assert main(["audit", str(bad), "--config", str(config_file), "--layer-type", "sliding_attention"]) == 0
    out = capsys.readouterr().out
    assert "CORRECT" in out and "layer type full_attention" not in out
    assert main(["audit", str(bad), "--config", str(config_file), "--layer-type", "full_attention", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [s["layer_type"] for s in doc["layer_types"]] == ["full_attention"]
    assert doc["mistakes"] == ["wrong_freq_base"]
    assert main(["audit", str(bad), "--config", str(config_file), "--layer-type", "global"]) == 2
    err = capsys.readouterr().err
    assert "layer_type: unknown layer type 'global'" in err and "full_attention, sliding_attention" in err
    # a model with one RoPE for all its layers has no layer types to choose from
    assert main(["audit", str(bad), "--preset", "gemma-2-9b", "--layer-type", "full_attention"]) == 2
    assert "one RoPE for all its layers" in capsys.readouterr().err


def test_the_route_takes_layer_type(client: TestClient, tmp_path: Path) -> None:
    body = write_gguf(tmp_path / "bad.gguf", "gemma3", gemma3_gguf_meta(10000.0)).read_bytes()
    params = {"config": json.dumps(GEMMA3_T5)}
    every = client.post("/v1/audit", params=params, content=body)
    assert every.status_code == 200 and every.json() == audit_file(tmp_path / "bad.gguf", config=GEMMA3_T5).document()
    one = client.post("/v1/audit", params={**params, "layer_type": "sliding_attention"}, content=body).json()
    assert one["verdict"] == "correct" and [s["layer_type"] for s in one["layer_types"]] == ["sliding_attention"]
    unknown = client.post("/v1/audit", params={**params, "layer_type": "global"}, content=body)
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["error"].startswith("layer_type: unknown layer type 'global'")
    assert "full_attention, sliding_attention" in unknown.json()["error"]
    png = client.post("/v1/audit", params={**params, "format": "png"}, content=body)
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"


def test_the_extract_carries_the_layer_types(client: TestClient, tmp_path: Path) -> None:
    """`posenc audit --remote`: the sliding layers' facts travel with the extract, and give the same report."""
    path = write_gguf(tmp_path / "bad.gguf", "gemma3", gemma3_gguf_meta(10000.0))
    found = read_path(path, Settings())
    assert set(found.layers) == {"sliding_attention"}
    document = extract.dump(found)
    assert extract.load(json.loads(json.dumps(document))).layers["sliding_attention"].rope_theta == 10000.0
    doc = client.post("/v1/audit", params={"config": json.dumps(GEMMA3_T5)}, content=json.dumps(document)).json()
    assert doc == audit_file(path, config=GEMMA3_T5).document()
    nested = copy.deepcopy(document)
    nested["layers"]["sliding_attention"]["layers"] = {}
    assert client.post("/v1/audit", content=json.dumps(nested)).status_code == 400


def test_the_preset_judges_both_layer_types(tmp_path: Path) -> None:
    """gemma-3-4b-it carries its layer types: the full layers (linear x8, base 1e6) and the sliding ones (base 1e4)."""
    reference = from_preset("gemma-3-4b-it")
    assert [(layer.layer_type, layer.params.rope_type if layer.params else None) for layer in reference.layers] == \
        [("full_attention", "linear"), ("sliding_attention", "default")]
    meta = {"context_length": 131072, "embedding_length": 2560, "attention.head_count": 8, "attention.key_length": 256,
            "rope.freq_base": 1e6, "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}
    assert audit_file(write_gguf(tmp_path / "good.gguf", "gemma3", meta), preset="gemma-3-4b-it").verdict == "correct"
    default_base = audit_file(write_gguf(tmp_path / "bad.gguf", "gemma3", {**meta, "rope.freq_base": 10000.0}),
                              preset="gemma-3-4b-it")
    assert _failing(default_base) == {"full_attention": {"wrong_freq_base"}}


def test_a_gemma4_gguf_against_its_per_layer_config(tmp_path: Path) -> None:
    """The full-attention head size transformers 5 writes in per_layer_config (128 here) is the reference's: a file
    whose full layers have the sliding layers' head size is head_dim_wrong there; the right one is correct."""
    meta, mask = gemma4_gguf(128)
    good = audit_file(write_gguf(tmp_path / "good.gguf", "gemma4", meta, mask), config=GEMMA4_T5)
    assert good.verdict == "correct", good.document()
    assert all(layer.divergence is not None and layer.divergence.within_contract for layer in good.layers.values())
    meta, mask = gemma4_gguf(64)
    bad = audit_file(write_gguf(tmp_path / "bad.gguf", "gemma4", meta, mask), config=GEMMA4_T5)
    assert "head_dim_wrong" in _failing(bad)["full_attention"] and "sliding_attention" not in _failing(bad)
    # the sliding layers' base given to the full layers' value
    meta, mask = gemma4_gguf(128)
    swa = audit_file(write_gguf(tmp_path / "swa.gguf", "gemma4", {**meta, "rope.freq_base_swa": 1e6}, mask),
                     config=GEMMA4_T5)
    assert _failing(swa) == {"sliding_attention": {"wrong_freq_base"}}


def test_a_transformers5_config_json_is_read_per_layer_type(tmp_path: Path) -> None:
    """Before: config_not_buildable ("this config has per-layer RoPE; choose one of ...")."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3_T5))
    found = read_path(path, Settings())
    assert not found.facts and set(found.layers) == {"full_attention", "sliding_attention"}
    assert (found.rope_theta, found.layers["sliding_attention"].rope_theta) == (1e6, 1e4)
    assert audit_file(path, config=GEMMA3_T5).verdict == "correct"
    wrong = copy.deepcopy(GEMMA3_T5)
    wrong["rope_parameters"]["full_attention"]["rope_theta"] = 10000.0
    path.write_text(json.dumps(wrong))
    assert _failing(audit_file(path, config=GEMMA3_T5)) == {"full_attention": {"wrong_freq_base"}}


def _inv_freq(theta: float) -> np.ndarray:
    return default_inv_freq(theta, 128).astype(np.float32)


def test_a_transformers5_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """transformers 5 keeps a buffer per layer type (`rotary_emb.{layer_type}_inv_freq`), non-persistent: a checkpoint
    without them is judged from its config.json; one that stores them is judged buffer by buffer."""
    weights = {"model.embed_tokens.weight": np.zeros((16, 8), np.float32)}
    none = tmp_path / "none.safetensors"
    save_file(weights, str(none))
    result = audit_file(none, config=GEMMA3_T5)
    assert result.verdict == "consistent" and not result.failing, result.document()
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GEMMA3_T5))
    assert main(["audit", str(none), "--config", str(config)]) == 0
    assert "not in this file — judged from the given config.json" in capsys.readouterr().out

    def checkpoint(name: str, full: float) -> Path:
        path = tmp_path / name
        save_file({**weights, "model.rotary_emb.full_attention_inv_freq": _inv_freq(full),
                   "model.rotary_emb.full_attention_original_inv_freq": _inv_freq(full),
                   "model.rotary_emb.sliding_attention_inv_freq": _inv_freq(1e4)}, str(path))
        return path

    good = audit_file(checkpoint("good.safetensors", 1e6), config=GEMMA3_T5)
    assert good.verdict == "correct", good.document()
    bad = audit_file(checkpoint("bad.safetensors", 1e4), config=GEMMA3_T5)
    assert _failing(bad) == {"full_attention": {"wrong_theta"}}, bad.document()
    # transformers 4's Gemma 3: the global module's buffer, and the sliding layers' in rotary_emb_local
    old = tmp_path / "old.safetensors"
    save_file({**weights, "model.rotary_emb.inv_freq": _inv_freq(1e6), "model.rotary_emb_local.inv_freq":
               _inv_freq(1e6)}, str(old))
    assert _failing(audit_file(old, config=GEMMA3_T5)) == {"sliding_attention": {"wrong_theta"}}


def test_the_key_structures_are_those_transformers_writes(tmp_path: Path) -> None:
    """GEMMA3_T5 and GEMMA4_T5 hold what transformers 5.23's config classes write (where transformers is installed),
    and resolve to the same RoPE per layer type as the config object holds."""
    transformers = pytest.importorskip("transformers")
    for written, cls in ((GEMMA3_T5, transformers.Gemma3TextConfig), (GEMMA4_T5, transformers.Gemma4TextConfig)):
        sizes = {k: v for k, v in written.items() if k not in ("model_type", "per_layer_config", "rope_parameters")}
        kwargs: dict[str, Any] = {"rope_parameters": copy.deepcopy(written["rope_parameters"]), **sizes}
        if written is GEMMA4_T5:
            kwargs["global_head_dim"] = 128
        cls(**kwargs).save_pretrained(tmp_path)
        saved = json.loads((tmp_path / "config.json").read_text())
        for key, value in written.items():
            assert saved[key] == value, (cls.__name__, key, saved.get(key))
        for name in rope_layer_types(saved):
            ours, _ = rope_parameters_from_config(saved, layer_type=name)
            assert ours.rope_theta == saved["rope_parameters"][name]["rope_theta"]
            assert ours.rope_type == saved["rope_parameters"][name]["rope_type"]
