"""Every text model of the rotary sweep (tests/parity/rotary_sweep.py: each `*RotaryEmbedding` of the installed
transformers that is not a vision tower nor excluded, its config class's defaults, the published values where the
defaults describe no model) audited as `posenc audit config.json --config config.json` audits it: the whole default
config (`to_dict()`, written as config.json) against itself is `correct`; a copy with another base, changed where
the config states it (the top level, its rope_parameters, or one layer type's entry of them), names `wrong_freq_base`;
a copy with another head size, changed in the key that gives it (`head_dim`, or the family's own: GPT-J's n_embd,
JetMoE's kv_channels, ...), names `head_dim_wrong`. Issue 61: "a config.json of every architecture audits correct
against itself and names a planted mistake"."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from posenc.models.architectures import HEAD_SIZE_KEYS, family, model_section, model_type_of, positive_int
from posenc.models.audit import divergence
from posenc.models.errors import ParameterError
from posenc.models.rope_config import rope_layer_types, rope_parameters_from_config
from posenc.service.audit import config_reader
from posenc.service.audit.run import parse_config, run
from tests.parity.rotary_sweep import EXCLUDED, build_text_module, is_vision, rotary_classes

Config = dict[str, Any]


# Modules that are not the text model of their composite config (the model the audit finds in the whole config.json,
# as the RoPE resolver does): each is audited through the config it is built from, its own config.json
NOT_THE_TEXT_MODEL = {"Nemotron3DiarizationRotaryEmbedding": "audio_config (the diarization's audio encoder)",
                      "PI05RotaryEmbedding": "dit_config (PI0.5's action expert)",
                      "Qwen3OmniMoeRotaryEmbedding": "code2wav_config (Qwen3-Omni's vocoder)"}


def _json(config: Any) -> Config:
    out: Config = json.loads(json.dumps(config.to_dict(), default=str))
    return out


@pytest.fixture(scope="module", autouse=True)
def short_scans() -> Iterator[None]:
    """The tables of a planted mistake compared over their first 2^18 values rather than the audit's 2^26: the facts
    name the mistake, and 190 full scans would take minutes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(divergence, "MAX_SCAN_ELEMENTS", 1 << 18)
        yield


@pytest.fixture(scope="module")
def configs() -> Iterator[dict[str, Config]]:
    """{module class: its model's whole default config.json (or, for NOT_THE_TEXT_MODEL, the sub-config it is built
    from)}, one per text model of the sweep."""
    out: dict[str, Config] = {}
    for rotary in rotary_classes():
        if rotary.name in EXCLUDED or is_vision(rotary):
            continue
        _, config, whole, path = build_text_module(rotary)
        whole_json = _json(whole)
        if rotary.name in NOT_THE_TEXT_MODEL:  # still so: the audit finds another model in the whole config
            assert model_section(whole_json)[0] != path, f"{rotary.name}: the audit finds its model now"
            whole_json = _json(config)
        _, section = model_section(whole_json)
        switch = family(model_type_of(whole_json, section)).rope_switch
        if switch is not None and isinstance(section, dict):  # a model that uses its rotary module only when on
            section[switch[0]] = switch[1]
        out[rotary.name] = whole_json
    assert len(out) > 150, sorted(out)
    yield out


def audit(file: Config, reference: Config) -> tuple[str, set[str], str]:
    """(verdict, mistakes named, the failing facts) of `file` written as config.json, audited against `reference`
    given as --config: the bytes each command reads, through the audit's own readers."""
    found = config_reader.document_found(json.dumps(file).encode())
    result = run(found, None, parse_config(json.dumps(reference)))
    doc = result.document()
    facts = [f"{f['name']}: {f['verdict']} {f['mistake']} {f['explanation'][:160]}"
             for section in (doc, *doc.get("layer_types", [])) for f in section["facts"]
             if f["verdict"] in ("wrong", "missing")]
    return doc["verdict"], set(doc["mistakes"]), "; ".join(facts)


def _rope_dict(section: Mapping[str, Any]) -> Any:
    return section.get("rope_scaling") or section.get("rope_parameters")


def with_other_base(config: Config) -> Config:
    """`config` with its text model's base doubled where the config states it: one layer type's entry of a
    rope_parameters per layer type, else the rope dict's rope_theta, else the top-level key (the family's spelling:
    GPT-NeoX's rotary_emb_base), else a top-level rope_theta over the default."""
    out = copy.deepcopy(config)
    _, section = model_section(out)
    assert isinstance(section, dict)
    rope = _rope_dict(section)
    names = rope_layer_types(out)
    if names:
        entry = rope[names[0]]
        entry["rope_theta"] = 2 * float(entry.get("rope_theta") or section.get("rope_theta") or 10000.0)
        return out
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        rope["rope_theta"] = 2 * float(rope["rope_theta"])
        return out
    renamed = [old for old, new in family(model_type_of(out, section)).renamed.items() if new == "rope_theta"]
    key = next((k for k in ("rope_theta", *renamed) if section.get(k) is not None), "rope_theta")
    section[key] = 2 * float(section.get(key) or 10000.0)
    return out


def _head_dims(config: Config) -> set[int]:
    names = rope_layer_types(config) or (None,)
    return {rope_parameters_from_config(config, layer_type=name)[0].head_dim for name in names}


def with_other_head(config: Config) -> Config:
    """`config` with another head size in the key that gives it (the family's own key, else head_dim or
    qk_rope_head_dim, else head_dim written over hidden // heads): the first size that still builds. An M-RoPE model's
    sections split its frequencies: they are scaled with the head (its config states them, or they are written)."""
    _, section = model_section(config)
    model_type = model_type_of(config, section)
    keys = family(model_type).head_size + HEAD_SIZE_KEYS
    key = next((k for k in keys if positive_int(section.get(k))), "head_dim")
    before = _head_dims(config)
    head = min(before)
    sections = None if rope_layer_types(config) else rope_parameters_from_config(config)[1].get("mrope_section")
    for size in (2 * head, head // 2, head + 2, head + 16):
        out = copy.deepcopy(config)
        _, planted = model_section(out)
        assert isinstance(planted, dict)
        planted[key] = size
        if sections is not None:
            rope = _rope_dict(planted)
            if not isinstance(rope, dict) or size % head:
                continue
            rope["mrope_section"] = [part * size // head for part in sections]
        try:
            if _head_dims(out) != before:
                return out
        except ParameterError:
            continue
    raise AssertionError(f"no other head size in {key!r} builds")


def _each(configs: dict[str, Config], check: Callable[[str, Config], str | None]) -> None:
    def checked(name: str, config: Config) -> str | None:
        try:
            return check(name, config)
        except (ParameterError, AssertionError) as exc:
            return f"{type(exc).__name__}: {exc}"

    failing = [f"{name}: {problem}" for name, config in configs.items() if (problem := checked(name, config))]
    assert not failing, f"{len(failing)} of {len(configs)}:\n" + "\n".join(failing)


def test_every_config_audits_correct_against_itself(configs: dict[str, Config]) -> None:
    def check(name: str, config: Config) -> str | None:
        verdict, named, facts = audit(config, config)
        return None if verdict == "correct" and not named else f"{verdict} {sorted(named)} {facts}"

    _each(configs, check)


def test_another_base_is_named_wrong_freq_base(configs: dict[str, Config]) -> None:
    def check(name: str, config: Config) -> str | None:
        verdict, named, facts = audit(with_other_base(config), config)
        return None if verdict == "wrong" and "wrong_freq_base" in named else f"{verdict} {sorted(named)} {facts}"

    _each(configs, check)


def test_another_head_size_is_named_head_dim_wrong(configs: dict[str, Config]) -> None:
    def check(name: str, config: Config) -> str | None:
        verdict, named, facts = audit(with_other_head(config), config)
        return None if verdict == "wrong" and "head_dim_wrong" in named else f"{verdict} {sorted(named)} {facts}"

    _each(configs, check)
