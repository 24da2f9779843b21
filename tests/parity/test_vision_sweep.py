"""The sweep over every vision tower of the installed transformers (tests/parity/vision_sweep.py): every vision rotary
class classified, every described tower served exactly (where its CLS angles are a learned weight: the full table
given the module's own weight values, the patch rows without them), every listed gap and reason still true,
posenc's per-tower config facts (defaults, aliases, wrappers) those of transformers' config classes, and
docs/vision-coverage.md as the sweep generates it."""

import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import transformers
from fastapi.testclient import TestClient

from posenc.models.vision_towers import TOWERS, TowerScheme
from tests.conftest import running_client
from tests.parity import vision_sweep
from tests.parity.rotary_sweep import Rotary, _sub_configs
from tests.parity.vision_sweep import GAPS, NOT_A_TOWER, VisionRow


@pytest.fixture(scope="module")
def rows() -> Iterator[list[VisionRow]]:
    with running_client() as client:
        assert isinstance(client, TestClient)
        yield vision_sweep.sweep(client)


@pytest.fixture(scope="module")
def classes() -> dict[str, Rotary]:
    return {rotary.name: rotary for rotary in vision_sweep.vision_classes()}


def test_every_vision_class_is_classified(rows: list[VisionRow]) -> None:
    unknown = [r for r in rows if r.kind == "unclassified"]
    assert not unknown, "\n".join(f"{r.folder} {r.cls}: {r.note}" for r in unknown)


def test_every_tower_is_served_exactly(rows: list[VisionRow]) -> None:
    failing = [r for r in rows if r.kind == "tower" and r.status != "exact"]
    assert not failing, "\n".join(f"{r.folder} {r.cls} ({r.tower}): {r.status} {r.note}" for r in failing)
    for r in rows:
        if r.kind == "tower":
            assert r.max_error is not None and (r.max_error <= vision_sweep.EXACT or "float32 angle" in r.note), r


def test_learned_cls_towers_are_checked_with_their_weight(rows: list[VisionRow]) -> None:
    learned = {s.name for s in TOWERS if s.cls is not None and s.cls.angles == "learned"}
    checked = {r.tower for r in rows if r.status == "exact" and "class_pos_emb" in r.note}
    assert checked == learned & {r.tower for r in rows}


def test_every_described_tower_is_found(classes: dict[str, Rotary]) -> None:
    """A tower posenc describes whose rotary class is gone (renamed, removed) must leave TOWERS."""
    missing = [s.name for s in TOWERS if s.module not in classes]
    assert not missing, f"towers described but not found in transformers {transformers.__version__}: {missing}"


def test_every_gap_still_fails_as_listed(classes: dict[str, Rotary]) -> None:
    with running_client() as client:
        for name, (status, reason) in GAPS.items():
            assert name in classes, f"{name} is a listed gap but no longer found"
            assert vision_sweep.gap_holds(client, classes[name]), f"{name} no longer answers {status}: {reason}"


def test_every_not_a_tower_reason_still_holds(classes: dict[str, Rotary]) -> None:
    for name, reason in NOT_A_TOWER.items():
        assert name in classes, f"{name} is listed but no longer found"
        assert vision_sweep.not_a_tower_holds(classes[name]), f"{name}: {reason} no longer holds"


def _config_class(scheme: TowerScheme, classes: dict[str, Rotary]) -> type:
    """The config class the rotary module is built from (DeepSeek-OCR-2's annotates the vision config, but the
    encoder config inside it builds it)."""
    return type(vision_sweep.vision_config(classes[scheme.module]))


@pytest.mark.parametrize("scheme", TOWERS, ids=lambda s: s.name)
def test_config_facts_are_the_config_classes(scheme: TowerScheme, classes: dict[str, Rotary]) -> None:
    """posenc's defaults, theta default, key aliases and model_type of each tower are its config class's: a
    config.json that leaves a key out, or spells it by its alias, reads as transformers reads it."""
    if scheme.module not in classes:
        pytest.skip(f"{scheme.module} not in transformers {transformers.__version__}")
    cls = _config_class(scheme, classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = cls()
    assert default.model_type in scheme.model_types
    assert float(getattr(cls, "default_theta", 10000.0)) == scheme.default_theta
    assert getattr(cls, "default_rope_type", "default") == scheme.rope_types[0]  # what "default" standardizes to
    for key, value in scheme.defaults.items():
        theirs = getattr(default, key)
        assert theirs == value, f"{scheme.name}.{key}: posenc {value}, transformers {theirs}"
    attribute_map = getattr(cls, "attribute_map", {})
    for key, aliases in scheme.aliases.items():
        for alias in aliases:
            assert attribute_map.get(alias) == key, f"{scheme.name}: {alias} is no alias of {key}"
    for alias, key in attribute_map.items():
        if key in scheme.defaults:
            assert alias in scheme.aliases.get(key, ()), f"{scheme.name}: config.json may spell {key} as {alias}"


@pytest.mark.parametrize("scheme", [s for s in TOWERS if s.wrappers], ids=lambda s: s.name)
def test_wrappers_hold_the_vision_config_there(scheme: TowerScheme, classes: dict[str, Rotary]) -> None:
    """Each (whole config, path) posenc looks in is one transformers builds, with the tower's vision config there."""
    if scheme.module not in classes:
        pytest.skip(f"{scheme.module} not in transformers {transformers.__version__}")
    vision = _config_class(scheme, classes)
    for wrapper, path in scheme.wrappers:
        assert wrapper in transformers.CONFIG_MAPPING, f"{scheme.name}: no config {wrapper}"
        whole_cls = transformers.CONFIG_MAPPING[wrapper]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            whole = whole_cls(**_nested(path, vision().to_dict()))
        found = dict(_sub_configs(whole)).get(path)
        assert isinstance(found, vision), f"{scheme.name}: {wrapper}.{path} is {type(found).__name__}"


def _nested(path: str, value: dict[str, Any]) -> dict[str, Any]:
    """{"a": {"b": value}} for path "a.b"."""
    out: dict[str, Any] = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


def _post(client: Any, body: dict[str, Any], **params: Any) -> Any:
    return client.post("/v1/rope/from-config", params={"tower": "vision", **params}, content=json.dumps(body),
                       headers={"content-type": "application/json"})


@pytest.mark.parametrize("scheme", [s for s in TOWERS if s.wrappers], ids=lambda s: s.name)
def test_a_whole_config_without_the_vision_model_type(scheme: TowerScheme, classes: dict[str, Rotary]) -> None:
    """Older config.json files leave the vision config's model_type out: the whole config's model_type names it."""
    if scheme.module not in classes:
        pytest.skip(f"{scheme.module} not in transformers {transformers.__version__}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vision = _config_class(scheme, classes)().to_dict()
    grid = "1,8,8" if scheme.grid == "input" else None
    params = {"grid_thw": grid} if grid else {}
    with running_client() as client:
        wrapper, path = scheme.wrappers[0]
        named = _post(client, {"model_type": wrapper, **_nested(path, vision)}, **params)
        assert named.status_code == 200, named.text
        unnamed = {key: value for key, value in vision.items() if key != "model_type"}
        bare = _post(client, {"model_type": wrapper, **_nested(path, unnamed)}, **params)
        assert bare.status_code == 200, bare.text
        assert bare.content == named.content or _tensors(bare.content) == _tensors(named.content)


def _tensors(body: bytes) -> bytes:
    length = int.from_bytes(body[:8], "little")
    return body[8 + length:]


def test_the_coverage_table_is_the_sweeps(rows: list[VisionRow]) -> None:
    assert vision_sweep.COVERAGE_DOC.read_text() == vision_sweep.coverage_markdown(rows), (
        "docs/vision-coverage.md is stale: python -m tests.parity.vision_sweep --write")
