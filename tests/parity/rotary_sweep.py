"""Every rotary embedding module of the installed transformers against posenc, found by walking its model folders.

Each `*RotaryEmbedding` class defined in a `modeling_*.py` is classified (`classify`): a text module is built from
its config class's defaults (from the sub-config that builds it when the config class is a composite), run on
positions 0 .. S-1 (S = min(4096, max_position_embeddings)) for each of its layer types, and compared with
`POST /v1/rope/from-config` of that config's `to_dict()` and of the model's whole default config.json, in the pair
layout posenc reads from the config (never told which one the module uses: the module's own layout is found from its
output and must be the one posenc answers). Angles are compared in float64, from the module's own `inv_freq` and
attention scaling, so that the module's float32 angle rounding (~1.2e-4 at position 4096) counts against nobody;
the module's float32 output is first checked against that float64 table within its own rounding, which proves the
module computes what the float64 table says.

Rows: exact (max error <= 1e-6), ulp (<= 1e-4, posenc's inv_freq within the precision contract's 2 ulp of the
module's), wrong, refused (posenc answered 4xx), mrope, vision, or excluded (`EXCLUDED`: not a position table of
this kind, each with the reason, which `excluded_reason_holds` checks is still true).

`python -m tests.parity.rotary_sweep` prints the rows; `--write` regenerates docs/rotary-coverage.md.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.numpy import load as load_safetensors

ROWS = 4096
EXACT = 1e-6
ULP = 1e-4
COVERAGE_DOC = Path(__file__).resolve().parents[2] / "docs" / "rotary-coverage.md"
MODELS_DIR = Path(transformers.__file__).parent / "models"


@dataclass(frozen=True)
class Rotary:
    folder: str
    module_name: str
    cls: type

    @property
    def name(self) -> str:
        return self.cls.__name__


@dataclass
class Row:
    folder: str
    cls: str
    kind: str  # text, mrope, vision, excluded
    layer_type: str | None = None
    status: str = ""  # exact, ulp, wrong, refused, listed
    rope_type: str | None = None
    endpoint: str = ""
    layout: str | None = None
    max_error: float | None = None
    note: str = ""


def rotary_classes() -> Iterator[Rotary]:
    """Every `*RotaryEmbedding` class defined in a modeling file of the installed transformers, by folder."""
    for folder in sorted(p.name for p in MODELS_DIR.iterdir() if p.is_dir()):
        for path in sorted((MODELS_DIR / folder).glob("modeling_*.py")):
            if "RotaryEmbedding(" not in path.read_text():
                continue
            module_name = f"transformers.models.{folder}.{path.stem}"
            module = importlib.import_module(module_name)
            for name, cls in vars(module).items():
                if name.endswith("RotaryEmbedding") and isinstance(cls, type) and cls.__module__ == module_name:
                    yield Rotary(folder, module_name, cls)


# Modules that are not a position table posenc serves, with the reason; `excluded_reason_holds` checks each.
EXCLUDED: dict[str, str] = {
    "HunYuanVLRotaryEmbedding": "cannot run: the default config has no mrope_section (its forward takes len(None))",
    "CohereCompassRotaryEmbedding": "cannot build: the default text config's rope_parameters is empty (KeyError)",
    "EfficientLoFTRRotaryEmbedding": "forward takes feature maps (x only): 2-D image feature positions",
    "EomtDinov3RotaryEmbedding": "forward takes pixel values: a vision patch grid",
    "MusicFlamingoRotaryEmbedding": "forward takes timestamps: positions are audio times, not token indices",
    "EsmFold2RotaryEmbedding": "takes an atom config and reference positions: 3-D atom coordinates",
    "Sam3ViTRotaryEmbedding": "a vision tower's 2-D patch table (no position ids)",
}


# Modules whose config class's defaults describe no published model (a rotary dim that is odd, sections that do not
# split the frequencies): the sweep sets the published model's values, named in the reason. `default_still_unfit`
# checks that each default is still unfit (transformers cannot run it, or posenc refuses it with a 422).
_GLM4V = ("GLM-4.1V's config.json rotates half of each head (the default's sections [8, 12, 12] do not split its 64 "
          "frequencies)", {"rope_parameters": {"partial_rotary_factor": 0.5}})
_GLM45 = ("GLM-4.5's config.json: head_dim 128, half rotated (the default's 4096 / 96 heads rotate an odd 21)",
          {"head_dim": 128, "rope_parameters": {"partial_rotary_factor": 0.5}})
_QWEN3_OMNI = ("Qwen3-Omni's config.json: head_dim 128 (the default's 2048 / 28 heads give an odd 73)",
               {"head_dim": 128})
CONFIG_FIXES: dict[str, tuple[str, dict[str, Any]]] = {
    "Glm4vTextRotaryEmbedding": _GLM4V, "GlmImageTextRotaryEmbedding": _GLM4V,
    "Glm4MoeRotaryEmbedding": _GLM45, "Glm4vMoeTextRotaryEmbedding": _GLM45,
    "Qwen3OmniMoeThinkerTextRotaryEmbedding": _QWEN3_OMNI, "Qwen3OmniMoeTalkerRotaryEmbedding": _QWEN3_OMNI,
}


def _apply_fix(config: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if key == "rope_parameters":
            config.rope_parameters = {**(config.rope_parameters or {}), **value}
        else:
            setattr(config, key, value)


def excluded_reason_holds(rotary: Rotary) -> bool:
    """Whether the reason `EXCLUDED` gives for `rotary` is still true of the installed module."""
    reason = EXCLUDED[rotary.name]
    params = list(inspect.signature(rotary.cls.forward).parameters)[1:]
    if reason.startswith("cannot"):
        try:
            module = build_text_module(rotary)[0]
        except Exception:
            return True
        if reason.startswith("cannot build"):
            return False
        for positions in (torch.arange(16)[None], torch.from_numpy(mrope_position_ids())[:, None, :]):
            try:
                run_module(module, None, positions)
                return False
            except Exception:
                continue
        return True
    if "forward takes" in reason or "takes an atom" in reason:
        return params[:2] != ["x", "position_ids"]
    return "position_ids" not in params or "ViT" in rotary.name


def default_still_unfit(client: Any, rotary: Rotary) -> bool:
    """Whether the config class's defaults still need the `CONFIG_FIXES` entry: the module cannot run them, or posenc
    refuses them (422)."""
    try:
        module, _, whole, path = build_text_module(rotary, fixed=False)
        positions = torch.from_numpy(mrope_position_ids())[:, None, :] if getattr(module, "mrope_section", None) \
            else torch.arange(16)[None]
        run_module(module, None, positions)
    except Exception:
        return True
    status, _ = ask_posenc(client, (whole.to_dict(), path), None, 16, "half")
    return status == 422


def is_vision(rotary: Rotary) -> bool:
    annotation = inspect.signature(rotary.cls.__init__).parameters.get("config")
    config_name = getattr(getattr(annotation, "annotation", None), "__name__", "")
    # Granite4VisionTextRotaryEmbedding is the language model's (a text config's): "Text" in a name wins
    names = (rotary.name, config_name)
    return not any("Text" in name for name in names) and any("Vision" in name for name in names)


def config_class(rotary: Rotary) -> type:
    annotation = inspect.signature(rotary.cls.__init__).parameters["config"].annotation
    if isinstance(annotation, str):
        annotation = vars(importlib.import_module(rotary.module_name))[annotation]
    return annotation


def _sub_configs(config: Any) -> Iterator[tuple[str, Any]]:
    """(dotted path, config): `config` (path ""), then its sub-configs breadth first."""
    queue = [("", config)]
    while queue:
        path, node = queue.pop(0)
        yield path, node
        queue.extend((f"{path}.{key}".lstrip("."), value) for key, value in vars(node).items()
                     if isinstance(value, transformers.PretrainedConfig))


def build_text_module(rotary: Rotary, fixed: bool = True) -> tuple[Any, Any, Any, str]:
    """(module, the config it was built from, the whole default config, the path between them): the config class's
    defaults (with `CONFIG_FIXES` applied unless `fixed` is False), or the first of its sub-configs the module
    builds from."""
    fix = CONFIG_FIXES.get(rotary.name) if fixed else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = config_class(rotary)()
        errors = []
        for path, config in _sub_configs(whole):
            try:
                if fix is not None and hasattr(config, "rope_parameters"):
                    _apply_fix(config, fix[1])
                return rotary.cls(config), config, whole, path
            except (AttributeError, KeyError, TypeError) as exc:
                errors.append(exc)
    raise errors[0]


def module_layer_types(module: Any) -> list[str | None]:
    names = [name[: -len("_inv_freq")] for name, _ in module.named_buffers()
             if name.endswith("_inv_freq") and not name.endswith("original_inv_freq")]
    return names or [None]


def run_module(module: Any, layer_type: str | None, positions: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The module's cos and sin [S, width] float32 for positions [1, S] (a complex freqs_cis: its parts)."""
    x = torch.zeros(1, positions.shape[-1], 1)
    args = (x, positions) if layer_type is None else (x, positions, layer_type)
    with torch.no_grad():
        out = module(*args)
    if isinstance(out, torch.Tensor):  # freqs_cis = cos + i sin, one column per frequency
        return out.real.reshape(-1, out.shape[-1]).numpy(), out.imag.reshape(-1, out.shape[-1]).numpy()
    first, second = (part.reshape(-1, part.shape[-1]).numpy() for part in out)
    # GPT-J and CodeGen return (sin, cos): at position 0 the sine is 0 and the cosine the scaling
    return (second, first) if int(positions.flatten()[0]) == 0 and not np.any(first[0]) else (first, second)


LAYOUTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "half": lambda a: np.concatenate([a, a], axis=1),
    "interleaved": lambda a: np.repeat(a, 2, axis=1),
    "form=half": lambda a: a,
}


def float64_tables(module: Any, layer_type: str | None, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(angles float64 [rows, n], cos, sin [rows, n] float64 with the scaling, inv_freq) from the module's state."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    inv_freq = getattr(module, f"{prefix}inv_freq").double().numpy()
    scale = float(getattr(module, f"{prefix}attention_scaling", 1.0))
    angles = np.arange(rows, dtype=np.float64)[:, None] * inv_freq[None, :]
    return angles, np.cos(angles) * scale, np.sin(angles) * scale, scale


def module_layout(cos: np.ndarray, sin: np.ndarray, angles: np.ndarray, ref_cos: np.ndarray, ref_sin: np.ndarray,
                  scale: float) -> str | None:
    """Which pairing the module's float32 output has: the layout whose float64 table it matches within its own
    float32 angle rounding (2 ulp of the angle, plus the output's rounding); None when none does."""
    tolerance = 2 * np.abs(angles) * 2.0**-23 * abs(scale) + 2e-7 * max(1.0, abs(scale))
    for name, spread in LAYOUTS.items():
        if spread(ref_cos).shape != cos.shape:
            continue
        bound = spread(tolerance)
        if np.all(np.abs(spread(ref_cos) - cos) <= bound) and np.all(np.abs(spread(ref_sin) - sin) <= bound):
            return name
    return None


def ask_posenc(client: Any, upload: tuple[dict[str, Any], str], layer_type: str | None, rows: int, layout: str
               ) -> tuple[int, Any]:
    """posenc's answer (tables, metadata) for `upload` = (config, the path of the module's model in it)."""
    config, section = upload
    params: dict[str, Any] = {"max_position": rows, "dtype": "float32"}
    params.update({"form": "half"} if layout == "form=half" else {"layout": layout})
    if section:
        params["config_section"] = section
    if layer_type is not None:
        params["layer_type"] = layer_type
    response = client.post("/v1/rope/from-config", params=params, content=json.dumps(config, default=str),
                           headers={"content-type": "application/json"})
    if response.status_code != 200:
        return response.status_code, response.json().get("error", response.text)
    return 200, (load_safetensors(response.content), _metadata(response.content))


def _ulps(ours: np.ndarray, theirs: np.ndarray) -> int:
    a, b = ours.astype(np.float32).view(np.int32).astype(np.int64), theirs.astype(np.float32).view(np.int32)
    return int(np.max(np.abs(a - b))) if a.size else 0


def text_rows(client: Any, rotary: Rotary) -> list[Row]:
    module, config, whole, path = build_text_module(rotary)
    rows = min(ROWS, int(getattr(config, "max_position_embeddings", None) or ROWS))
    # the config the module was built from, and the model's whole config.json with the path to it
    uploads = [(config.to_dict(), "")] + ([(whole.to_dict(), path)] if whole is not config else [])
    out = []
    for layer_type in module_layer_types(module):
        row = Row(rotary.folder, rotary.name, "text", layer_type, endpoint="POST /v1/rope/from-config")
        rope = getattr(config, "rope_parameters", None) or {}
        rope = rope.get(layer_type, rope) if layer_type is not None else rope
        row.rope_type = rope.get("rope_type") if isinstance(rope, dict) else None
        positions = torch.arange(rows)[None]
        if getattr(module, "mrope_section", None) is not None:
            out.append(_mrope_row(client, rotary, row, module, uploads[-1]))
            continue
        cos, sin = run_module(module, layer_type, positions)
        if not hasattr(module, f"{layer_type + '_' if layer_type else ''}inv_freq"):
            out.append(_precomputed_row(client, row, uploads, cos, sin, rows))
            continue
        angles, ref_cos, ref_sin, scale = float64_tables(module, layer_type, rows)
        layout = module_layout(cos, sin, angles, ref_cos, ref_sin, scale)
        row.layout = layout
        if layout is None:
            row.status, row.note = "wrong", f"the module's output {cos.shape} is none of the known layouts"
            out.append(row)
            continue
        errors, notes = [], []
        for upload in uploads:
            status, answer = ask_posenc(client, upload, layer_type, rows, layout)
            if status != 200:
                row.status, row.note = "refused", f"{status}: {str(answer)[:160]}"
                break
            tables, _ = answer
            expected_cos, expected_sin = LAYOUTS[layout](ref_cos), LAYOUTS[layout](ref_sin)
            if tables["cos"].shape != expected_cos.shape:
                row.status = "wrong"
                notes.append(f"shape {tables['cos'].shape}, the module's {expected_cos.shape}")
                break
            errors.append(max(float(np.max(np.abs(tables["cos"] - expected_cos))),
                              float(np.max(np.abs(tables["sin"] - expected_sin)))))
            inv_ulps = _ulps(tables["inv_freq"], getattr(module, f"{layer_type + '_' if layer_type else ''}inv_freq")
                             .numpy())
            if inv_ulps:
                notes.append(f"inv_freq {inv_ulps} ulp from the module's")
        else:
            row.max_error = max(errors)
            row.status = ("exact" if row.max_error <= EXACT else
                          "ulp" if row.max_error <= ULP and "ulp" in " ".join(notes) and
                          max(int(n.split()[1]) for n in notes if n.startswith("inv_freq")) <= 2 else "wrong")
        row.note = row.note or "; ".join(notes)
        out.append(row)
    return out


def _precomputed_row(client: Any, row: Row, uploads: list[tuple[dict[str, Any], str]], cos: np.ndarray, sin: np.ndarray,
                     rows: int) -> Row:
    """A module that keeps a precomputed float32 sin/cos table (GPT-J, CodeGen: no inv_freq to recompute from): posenc
    within the table's own float32 angle rounding (2 ulp of each angle, from posenc's inv_freq), one column per
    frequency (form=half)."""
    row.layout = "form=half"
    errors = []
    for upload in uploads:
        status, answer = ask_posenc(client, upload, row.layer_type, rows, "form=half")
        if status != 200:
            row.status, row.note = "refused", f"{status}: {str(answer)[:160]}"
            return row
        tables, _ = answer
        if tables["cos"].shape != cos.shape:
            row.status, row.note = "wrong", f"shape {tables['cos'].shape}, the module's {cos.shape}"
            return row
        angles = np.arange(rows, dtype=np.float64)[:, None] * tables["inv_freq"].astype(np.float64)[None, :]
        bound = 2 * angles * 2.0**-23 + 2e-7
        excess = max(float(np.max(np.abs(tables["cos"] - cos) - bound)),
                     float(np.max(np.abs(tables["sin"] - sin) - bound)))
        errors.append(max(float(np.max(np.abs(tables["cos"] - cos))), float(np.max(np.abs(tables["sin"] - sin)))))
        if excess > 0:
            row.status, row.max_error = "wrong", max(errors)
            return row
    row.max_error, row.status = max(errors), "exact" if max(errors) <= EXACT else "ulp"
    row.note = "the module's table is float32 angles: compared within their rounding"
    return row


def mrope_position_ids(merge: int = 2) -> np.ndarray:
    """int64 [3, S]: text, an image grid (t 1, h 8, w 12 patches, merged by `merge`), text, a video grid (t 3, h 4,
    w 4), text, laid out as get_rope_index lays a vision segment (its t, h, w indices offset by the running position,
    which then advances by the larger merged side)."""
    parts, current = [], 0
    for kind, size in (("text", 5), ("grid", (1, 8, 12)), ("text", 3), ("grid", (3, 4, 4)), ("text", 4)):
        if kind == "text":
            parts.append(np.broadcast_to(np.arange(size) + current, (3, size)))
            current += size
            continue
        t, h, w = size[0], size[1] // merge, size[2] // merge
        grid = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")).reshape(3, -1)
        parts.append(grid + current)
        current += max(h, w)
    return np.concatenate(parts, axis=1).astype(np.int64)


def rope_index_position_ids(rotary: Rotary) -> tuple[np.ndarray, str] | None:
    """(int64 [3, S], the class whose get_rope_index made them): the model's own 3-D position ids for text, an image
    (t 1, h 8, w 12 patches), text, a video (t 2, h 4, w 4), text, or without the video where the model refuses it
    (Qwen3-VL splits videos into frames); None where no get_rope_index runs without a built model."""
    module = importlib.import_module(rotary.module_name)
    owners = [cls for cls in vars(module).values() if isinstance(cls, type) and "get_rope_index" in vars(cls)]
    if rotary.folder not in transformers.CONFIG_MAPPING or not owners:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.CONFIG_MAPPING[rotary.folder]()
    merge = getattr(getattr(config, "vision_config", None), "spatial_merge_size", 2)
    image, video = ("image", (1, 8, 12)), ("video", (2, 4, 4))
    for segments in ([("text", 5), image, ("text", 3), video, ("text", 4)], [("text", 5), image, ("text", 4)]):
        types: list[int] = []
        grids: dict[str, list[list[int]]] = {"image": [], "video": []}
        for kind, size in segments:
            if isinstance(size, int):
                types += [0] * size
                continue
            types += [1 if kind == "image" else 2] * (size[0] * (size[1] // merge) * (size[2] // merge))
            grids[kind].append(list(size))
        for owner in owners:
            model = owner.__new__(owner)
            torch.nn.Module.__init__(model)
            object.__setattr__(model, "config", config)
            accepted = inspect.signature(owner.get_rope_index).parameters
            given = {"mm_token_type_ids": torch.tensor([types]),
                     "image_grid_thw": torch.tensor(grids["image"]) if grids["image"] else None,
                     "video_grid_thw": torch.tensor(grids["video"]) if grids["video"] else None}
            try:
                ids, _ = owner.get_rope_index(model, torch.zeros(1, len(types), dtype=torch.long),
                                              **{k: v for k, v in given.items() if k in accepted})
            except Exception:  # this owner needs more of a built model, or refuses this sequence
                continue
            return ids[:, 0, :].numpy().astype(np.int64), owner.__name__
    return None


def _metadata(body: bytes) -> dict[str, str]:
    length = int.from_bytes(body[:8], "little")
    return json.loads(body[8:8 + length]).get("__metadata__", {})


def _mrope_row(client: Any, rotary: Rotary, row: Row, module: Any, upload: tuple[dict[str, Any], str]) -> Row:
    """An M-RoPE module run on 3-D position ids (its model's get_rope_index's where that runs), against
    POST /v1/rope/mrope with the parameters posenc resolves from the model's config.json (from-config's metadata:
    sections, their order, rotary_dim, pair layout), within the module's own float32 angle rounding."""
    row.kind, row.endpoint = "mrope", "POST /v1/rope/mrope"
    real = rope_index_position_ids(rotary)
    ids, source = real if real is not None else (mrope_position_ids(), "the sweep's own layout")
    config, section = upload
    params: dict[str, Any] = {"max_position": 8, **({"config_section": section} if section else {})}
    response = client.post("/v1/rope/from-config", params=params, content=json.dumps(config, default=str),
                           headers={"content-type": "application/json"})
    if response.status_code != 200:
        row.status, row.note = "refused", f"from-config {response.status_code}: {response.text[:160]}"
        return row
    resolved = _metadata(response.content)
    query = {"head_dim": resolved["head_dim"], "partial_rotary_factor": resolved["partial_rotary_factor"],
             "rope_theta": resolved["rope_theta"], "mrope_section": resolved["mrope_section"],
             "section_order": resolved["mrope_order"], "dtype": "float32"}
    cos, sin = run_module(module, None, torch.from_numpy(ids)[:, None, :])
    # the module's output pairing: the family's (the metadata's layout) or, where the model re-pairs the table when
    # it rotates (HunYuan-V4-VL writes cat(f, f) and rotates pairs), the other one
    layouts = [resolved["layout"], *(name for name in ("half", "interleaved") if name != resolved["layout"])]
    for layout in layouts:
        response = client.post("/v1/rope/mrope", params={**query, "layout": layout},
                               json={"position_ids": ids.tolist()})
        if response.status_code != 200:
            row.status, row.note = "refused", f"{response.status_code}: {response.text[:160]}"
            return row
        tables = load_safetensors(response.content)
        if tables["cos"].shape != cos.shape:
            row.status, row.note = "wrong", f"shape {tables['cos'].shape}, the module's {cos.shape}"
            return row
        inv_freq = tables["inv_freq"].astype(np.float64)
        bound = LAYOUTS[layout](2 * float(ids.max()) * inv_freq[None, :] * 2.0**-23) + 2e-7
        error = max(float(np.max(np.abs(tables["cos"] - cos))), float(np.max(np.abs(tables["sin"] - sin))))
        if row.max_error is None or error < row.max_error:
            row.max_error, row.layout = error, layout
        if np.all(np.abs(tables["cos"] - cos) <= bound) and np.all(np.abs(tables["sin"] - sin) <= bound):
            row.status = "exact"
            row.note = (f"sections {query['mrope_section']} {query['section_order']}, rotary_dim "
                        f"{resolved['rotary_dim']}; position ids of {source}; within the module's float32 rounding")
            return row
    row.status, row.note = "wrong", "beyond the module's float32 angle rounding in either pairing"
    return row


def sweep(client: Any) -> list[Row]:
    """Every row of every rotary class (unclassifiable classes raise: a new folder must be looked at)."""
    out: list[Row] = []
    for rotary in rotary_classes():
        if rotary.name in EXCLUDED:
            out.append(Row(rotary.folder, rotary.name, "excluded", status="listed", note=EXCLUDED[rotary.name]))
        elif is_vision(rotary):
            out.append(Row(rotary.folder, rotary.name, "vision", status="listed",
                           note="vision tower: its per-patch table (POST /v1/rope/from-config?tower=vision"
                                "&grid_thw=t,h,w; Vision coverage)"))
        else:
            try:
                rows = text_rows(client, rotary)
            except Exception as exc:  # a module the sweep cannot run: its row fails the suite
                rows = [Row(rotary.folder, rotary.name, "text", status="unrun", note=repr(exc)[:200])]
            if rotary.name in CONFIG_FIXES:
                for row in rows:
                    row.note = f"config as published: {CONFIG_FIXES[rotary.name][0]}; {row.note}"
            out.extend(rows)
    return out


def coverage_markdown(rows: list[Row]) -> str:
    """docs/rotary-coverage.md: the table, generated."""
    counts: dict[str, int] = {}
    for row in rows:
        key = row.kind if row.kind != "text" else f"text {row.status}"
        counts[key] = counts.get(key, 0) + 1
    lines = [
        "# Rotary coverage",
        "",
        f"Generated by `python -m tests.parity.rotary_sweep --write` against transformers {transformers.__version__}"
        " (the sweep of `tests/parity/test_rotary_sweep.py`): every `*RotaryEmbedding` module of its model folders,",
        "built from its config class's defaults and run on positions 0 .. min(4096, max_position_embeddings) - 1, "
        "against `POST /v1/rope/from-config` of that config's `to_dict()` (angles in float64 from the module's own "
        "inv_freq; exact: max error <= 1e-6, ulp: <= 1e-4 with posenc's inv_freq within 2 float32 ulp of torch's).",
        "",
        "Totals: " + ", ".join(f"{key} {value}" for key, value in sorted(counts.items())) + ".",
        "",
        "| folder | module | layer type | rope_type | endpoint | layout | max error | status | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        error = "" if r.max_error is None else f"{r.max_error:.1e}"
        lines.append(f"| {r.folder} | {r.cls} | {r.layer_type or ''} | {r.rope_type or ''} | {r.endpoint} | "
                     f"{r.layout or ''} | {error} | {r.kind if r.kind != 'text' else r.status} | {r.note} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import sys

    from tests.conftest import running_client

    os.environ.setdefault("POSENC_CPU_FORM_FROM", "config")
    with running_client(max_table_bytes=256 * 2**20) as client:
        rows = sweep(client)
    if "--write" in sys.argv:
        COVERAGE_DOC.write_text(coverage_markdown(rows))
    for r in rows:
        print(r.folder, r.cls, r.layer_type, r.kind, r.status, r.layout, r.max_error, r.note, sep=" | ")


if __name__ == "__main__":
    main()
