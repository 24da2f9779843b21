"""Every vision tower's rotary table of the installed transformers against posenc, found by walking its model folders.

Each vision rotary class (`rotary_sweep.is_vision`, and SAM 3's ViT, which the text sweep lists as a vision table) is
classified: a tower posenc describes (`posenc.models.vision_towers.TOWERS`, matched by the rotary class's name), a
class that is no vision tower's table (`NOT_A_TOWER`, with the reason) or a tower posenc does not serve (`GAPS`, with
the status posenc answers, which `gap_holds` checks is still the answer). A class in none of them fails the suite.

A tower is built with one layer from its config class's defaults (the module that owns the rotary embedding: the
vision model, encoder or memory attention), run on the grids of `grids` (the smallest its config allows, a non-square
one crossing windows where the tower has windows, a video where it takes one), and the cos/sin reaching its first
attention layer are recorded: the modeling module's rotary application (`apply_rotary_pos_emb_vision` or its
equivalent, `APPLY`) is replaced for the forward by one that records its arguments and stops the forward. posenc
answers `POST /v1/rope/from-config?tower=vision&grid_thw=t,h,w` from the whole default config.json and from the
vision config alone; both must equal the tower's table: exact (max error <= 1e-6 in float32). Where a CLS row's
angles are a learned weight (`class_pos_emb`, in no config), posenc answers the patch rows alone, and the full table
when the request gives the module's own weight values; both are checked.

`python -m tests.parity.vision_sweep` prints the rows; `--write` regenerates docs/vision-coverage.md.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.numpy import load as load_safetensors

from posenc.models.vision_towers import TOWERS, TowerScheme
from tests.parity.rotary_sweep import Rotary, _sub_configs, config_class, is_vision, rotary_classes

EXACT = 1e-6
COVERAGE_DOC = Path(__file__).resolve().parents[2] / "docs" / "vision-coverage.md"

# Vision tables the text sweep lists among its exclusions (their class names do not say Vision).
VISION_EXTRA = ("Sam3ViTRotaryEmbedding",)

# Vision rotary classes that are no vision tower's table, with the reason (`not_a_tower_holds` checks each).
NOT_A_TOWER: dict[str, str] = {
}

# Towers posenc does not serve: (the status `POST /v1/rope/from-config?tower=vision` gives, the reason).
# `gap_holds` checks each still gets that status, so closing a gap forces its removal from this list.
GAPS: dict[str, tuple[int, str]] = {
}

# The rotary application each modeling module's first attention layer calls, by the name the module looks it up.
APPLY = ("apply_rotary_pos_emb_vision", "vision_apply_rotary_emb", "apply_multidimensional_rope",
         "apply_rotary_pos_emb_2d_self_attn", "apply_rotary_pos_emb_2d", "apply_rotary_pos_emb")


@dataclass
class VisionRow:
    folder: str
    cls: str
    kind: str  # tower, gap, not-a-tower
    tower: str = ""
    status: str = ""  # exact, wrong, refused, unrun, listed
    grids: list[str] = field(default_factory=list)
    rows: str = ""
    cls_rows: str = ""
    layout: str = ""
    columns: str = ""
    video: str = ""
    max_error: float | None = None
    note: str = ""


def vision_classes() -> Iterator[Rotary]:
    for rotary in rotary_classes():
        if is_vision(rotary) or rotary.name in VISION_EXTRA:
            yield rotary


def scheme_of(rotary: Rotary) -> TowerScheme | None:
    return next((scheme for scheme in TOWERS if scheme.module == rotary.name), None)


# --- building a tower --------------------------------------------------------------------------------------------


def _one_layer(config: Any) -> None:
    """The layers up to the first attention layer (one, but where convolution layers come first: LFM3-VL)."""
    layers = 1
    types = getattr(config, "layer_types", None)
    if isinstance(types, list):
        layers = next((i + 1 for i, kind in enumerate(types) if "attention" in kind), 1)
        config.layer_types = types[:layers]
    for name in ("depth", "num_hidden_layers", "num_layers", "memory_attention_num_layers", "encoder_layers"):
        if isinstance(getattr(config, name, None), int) and not isinstance(getattr(config, name), bool):
            setattr(config, name, layers)


def vision_config(rotary: Rotary) -> Any:
    """The config the rotary module is built from: its config class's defaults (or the first sub-config it builds
    from), with one layer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = config_class(rotary)()
        for _, config in _sub_configs(whole):
            try:
                rotary.cls(config)
            except (AttributeError, KeyError, TypeError):
                continue
            _one_layer(config)
            return config
    raise TypeError(f"{rotary.name}: no config of {type(whole).__name__} builds it")


def whole_config(scheme: TowerScheme, config: Any) -> tuple[dict[str, Any], str]:
    """(the whole default config.json holding `config`, the path to it): the first wrapper of the scheme that
    transformers knows, with `config` as its vision config; the config itself where the tower has none."""
    for wrapper, path in scheme.wrappers:
        if wrapper not in transformers.CONFIG_MAPPING:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                whole = transformers.CONFIG_MAPPING[wrapper]().to_dict()
            except Exception:  # a wrapper whose defaults do not build on their own
                continue
        node = whole
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = config.to_dict()
        return whole, path
    return config.to_dict(), ""


def owner_class(rotary: Rotary) -> type:
    """The module of the modeling file that builds the rotary embedding (the vision model, encoder or memory
    attention): the class whose __init__ instantiates it."""
    module = importlib.import_module(rotary.module_name)
    owners = [cls for cls in vars(module).values() if isinstance(cls, type) and cls.__module__ == rotary.module_name
              and issubclass(cls, torch.nn.Module) and cls is not rotary.cls
              and f"{rotary.name}(" in inspect.getsource(cls.__init__)]
    if not owners:
        raise TypeError(f"no module of {rotary.module_name} builds {rotary.name}")
    return owners[0]


class _Captured(Exception):
    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("captured")
        self.args_ = args
        self.kwargs_ = kwargs


def _recorder(*args: Any, **kwargs: Any) -> Any:
    raise _Captured(args, kwargs)


def capture(module_name: str, run: Callable[[], Any]) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """(name, args, kwargs) of the first rotary application `run` reaches in the modeling module."""
    module = importlib.import_module(module_name)
    names = [name for name in APPLY if callable(getattr(module, name, None))]
    saved = {name: getattr(module, name) for name in names}
    try:
        for name in names:
            setattr(module, name, lambda *a, _n=name, **k: _recorder(_n, *a, **k))
        with torch.no_grad():
            run()
    except _Captured as captured:
        return captured.args_[0], captured.args_[1:], captured.kwargs_
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)
    raise RuntimeError("the forward reached no rotary application")


def _cos_sin(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The table the rotary application received, [rows, width] float32 (a complex freqs_ci: each pair's value
    twice, as view_as_complex pairs channels)."""
    if name == "vision_apply_rotary_emb":
        freqs = kwargs.get("freqs_ci", args[2] if len(args) > 2 else None)
        freqs = freqs.reshape(-1, freqs.shape[-1])
        return (np.repeat(freqs.real.numpy(), 2, axis=1), np.repeat(freqs.imag.numpy(), 2, axis=1))
    if name == "apply_multidimensional_rope":
        cos, sin = args[1], args[2]
    else:
        cos = kwargs["cos"] if "cos" in kwargs else args[2]
        sin = kwargs["sin"] if "sin" in kwargs else args[3]
    return cos.reshape(-1, cos.shape[-1]).float().numpy(), sin.reshape(-1, sin.shape[-1]).float().numpy()


def _int(config: Any, *names: str, default: int = 1) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, list | tuple) and value:
            return int(value[0])
    return default


def _inputs(owner: Any, config: Any, scheme: TowerScheme, grid: tuple[int, int, int], merge: int
            ) -> Iterator[Callable[[], Any]]:
    """Calls of the owner's forward on `grid`, one per input layout the towers use (tried in turn: the first that
    reaches the rotary application is the tower's)."""
    t, h, w = grid
    n = t * h * w
    params = list(inspect.signature(owner.forward).parameters)
    patch = _int(config, "patch_size", "native_patch_size", default=14)
    channels = _int(config, "in_channels", "num_channels", "in_chans", default=3)
    temporal = _int(config, "temporal_patch_size", "patch_temporal", default=1)
    hidden = _int(config, "hidden_size", "embed_dim", default=32)
    grid_thw = torch.tensor([[t, h, w]])
    if scheme.name == "inkling2":
        grid_thw = torch.tensor([[t, h // merge, w // merge]])
    extra: dict[str, Any] = {}
    if "merge_sizes" in params:
        extra["merge_sizes"] = torch.tensor([merge])
    if any("grid_thw" in p for p in params):
        key = next(p for p in params if "grid_thw" in p)
        shapes = [(n, channels * temporal * patch * patch), (n, channels, patch, patch),
                  (n, channels * patch * patch), (n // (merge * merge), merge * patch * merge * patch, channels),
                  (1, n, channels * temporal * patch * patch)]
        if params[0] == "inputs_embeds":
            shapes = [(n, hidden), (1, n, hidden)]
        frames = torch.tensor([[1, h, w]] * t)  # a video as its frames (GLM-4V's model feeds it so)
        for grid_arg in (grid_thw, frames) if t > 1 else (grid_thw,):
            for shape in shapes:
                yield lambda s=shape, g=grid_arg: owner(torch.randn(*s), **{key: g}, **extra)
        return
    if "pixel_position_ids" in params:  # Gemma 4's encoder: patch embeddings with their (x, y), row by row
        ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        positions = torch.from_numpy(np.stack([xs.reshape(-1), ys.reshape(-1)], axis=1))[None]
        yield lambda: owner(torch.randn(1, h * w, hidden), torch.ones(1, h * w, dtype=torch.bool),
                            pixel_position_ids=positions)
        return
    if params[:1] == ["hidden_states"] and scheme.grid == "window":  # SAM 3's ViT layer: the image's feature map
        side = _int(config, "image_size") // patch
        yield lambda: owner(torch.randn(1, side, side, hidden))
        return
    if "current_vision_features" in params:  # SAM memory attention: the current frame's features and one memory
        width = config.memory_attention_hidden_size
        memory = _int(config, "memory_attention_cross_attention_kv_dim", "mem_dim", default=64)
        k_rows = h * w
        if getattr(config, "memory_attention_rope_k_sizes", None):
            k_rows = int(np.prod(config.memory_attention_rope_k_sizes))
        yield lambda: owner(torch.randn(h * w, 1, width), torch.randn(k_rows, 1, memory),
                            torch.randn(h * w, 1, width), torch.randn(k_rows, 1, memory))
        return
    if "num_patches" in params:  # DeepSeek-OCR-2's encoder: tokens then its model's queries (144, or 256 past 144)
        yield lambda: owner(torch.randn(1, n + (144 if n <= 144 else 256), hidden), num_patches=n)
        return
    images = torch.randn(1, channels, h * patch, w * patch)
    if "image_sizes" in params:
        yield lambda: owner(images, image_sizes=torch.tensor([[h * patch, w * patch]]))
    yield lambda: owner(images)


def tower_table(rotary: Rotary, owner: Any, config: Any, scheme: TowerScheme | None, grid: tuple[int, int, int],
                merge: int) -> tuple[np.ndarray, np.ndarray]:
    errors = []
    for call in _inputs(owner, config, scheme or TOWERS[0], grid, merge):
        try:
            name, args, kwargs = capture(rotary.module_name, call)
        except Exception as exc:  # this input layout is not the tower's
            errors.append(exc)
            continue
        return _cos_sin(name, args, kwargs)
    raise errors[-1] if errors else RuntimeError("no input layout")


# --- the grids ---------------------------------------------------------------------------------------------------


def grids(scheme: TowerScheme, config: Any, owner: Any) -> list[tuple[int, int, int]]:
    """The smallest grid the tower allows; a non-square one (crossing windows where the tower has them); a video
    where the tower takes one (its forward takes grid_thw). Fixed-grid towers: their grid. Chosen from the tower's
    module and config, not from posenc's description of it."""
    if scheme.grid == "side":
        side = _int(config, "image_size") // _int(config, "patch_size")
        return [(1, side, side)]
    if scheme.grid == "feat_sizes":  # the grid of memory_attention_rope_feat_sizes (the sweep sets it per grid)
        width, height = config.memory_attention_rope_feat_sizes
        return [(1, height, width), (1, 4, 6)]
    if scheme.grid == "window":  # SAM 3's ViT: a window layer's table, and a global layer's (the image's grid)
        side = _int(config, "image_size") // _int(config, "patch_size")
        return [(1, config.window_size, config.window_size), (1, side, side)]
    merge = tower_merge(config, owner)
    window = 0  # patches per window side, as get_vision_window_index computes it from the module's values
    if isinstance(getattr(owner, "window_size", None), int) and isinstance(getattr(owner, "patch_size", None), int):
        window = owner.window_size // merge // owner.patch_size * merge
    wide = (1, window + merge, 2 * window + merge) if window else (1, 2 * merge, 3 * merge)  # 2 x 3 windows
    out = [(1, merge, merge), wide]
    params = inspect.signature(owner.forward).parameters
    if any("grid_thw" in name for name in params):
        out.append((2, *wide[1:]) if window else (3, 2 * merge, 2 * merge))
    if "num_patches" in params:  # past the 144 tokens of the smaller query set
        out.append((1, 13, 13))
    return out


def tower_merge(config: Any, owner: Any) -> int:
    """The spatial merge the tower's grids must be multiples of: the module's own, else its config's."""
    merge = getattr(owner, "spatial_merge_size", None)
    return merge if isinstance(merge, int) else _int(config, "spatial_merge_size")


# --- posenc ------------------------------------------------------------------------------------------------------


def ask_posenc(client: Any, config: dict[str, Any], grid: tuple[int, int, int], merge: int | None = None,
               tower: str = "vision", class_pos_emb: list[float] | None = None) -> tuple[int, Any]:
    params: dict[str, Any] = {"tower": tower, "grid_thw": ",".join(map(str, grid)), "dtype": "float32"}
    if merge is not None:
        params["merge_size"] = merge
    if class_pos_emb is not None:
        config = {**config, "class_pos_emb": class_pos_emb}
    response = client.post("/v1/rope/from-config", params=params, content=json.dumps(config, default=str),
                           headers={"content-type": "application/json"})
    if response.status_code != 200:
        return response.status_code, response.json().get("error", response.text)
    length = int.from_bytes(response.content[:8], "little")
    metadata = json.loads(response.content[8:8 + length]).get("__metadata__", {})
    return 200, (load_safetensors(response.content), metadata)


def _split_cls(scheme: TowerScheme, grid: tuple[int, int, int], cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(patch row mask, CLS row mask) of a tower table with learned CLS rows."""
    t = grid[0]
    cls = scheme.cls
    assert cls is not None
    frames = t if cls.per == "frame" else 1
    per = cos.shape[0] // frames
    index = np.arange(cos.shape[0]) % per
    is_cls = index == (0 if cls.where == "first" else per - 1)
    return ~is_cls, is_cls


def largest_position(scheme: TowerScheme, grid: tuple[int, int, int], rows: int) -> int:
    """The largest position of a table of `rows` rows: the grid's largest extent - 1 (+ offset); 1-D: rows - 1."""
    return rows - 1 if scheme.frequencies == "sequence" else max(grid) - 1 + scheme.offset


def rounding_bound(scheme: TowerScheme, grid: tuple[int, int, int], inv_freq: np.ndarray, layout: str,
                   rows: int = 0) -> np.ndarray:
    """Per column, what the tower's float32 angles (position · inv_freq rounded to float32, positions up to
    `largest_position`) can move cos and sin: 2 ulp of the largest angle, plus the two roundings of the values."""
    bound = 2 * (largest_position(scheme, grid, rows) + 1) * inv_freq.astype(np.float64) * 2.0**-23 + 2.4e-7
    if layout == "interleaved":
        return np.repeat(bound, 2)
    if layout == "half":
        return np.concatenate([bound, bound])
    parts = np.split(bound, len(scheme.axes))  # half_per_axis
    return np.concatenate([block for part in parts for block in (part, part)])


def fixed_grid(scheme: TowerScheme, config: Any, grid: tuple[int, int, int]) -> bool:
    """Set the config of a tower whose grid is its config's to `grid`; whether it changed."""
    if scheme.grid != "feat_sizes" or list(config.memory_attention_rope_feat_sizes) == [grid[2], grid[1]]:
        return False
    config.memory_attention_rope_feat_sizes = [grid[2], grid[1]]
    return True


def tower_row(client: Any, rotary: Rotary, scheme: TowerScheme) -> VisionRow:
    row = VisionRow(rotary.folder, rotary.name, "tower", scheme.name)
    config = vision_config(rotary)
    owner = owner_class(rotary)(config).eval()
    whole, _ = whole_config(scheme, config)
    input_merge = "merge_sizes" in inspect.signature(owner.forward).parameters  # VideoLLaMA3: merge is an input
    merge = 1 if input_merge else tower_merge(config, owner)  # (the image processor's 1)
    errors: list[float] = []
    notes: list[str] = []
    beyond: dict[tuple[int, int, int], tuple[float, int]] = {}
    runs: list[tuple[tuple[int, int, int], int | None]] = [(grid, None) for grid in grids(scheme, config, owner)]
    learned = scheme.cls is not None and scheme.cls.angles == "learned"
    if input_merge:  # a video as the video processor gives it, merged 2 x 2
        runs.append(((2, 4, 4), 2))
    for grid, merge_size in runs:
        run_merge = merge_size or merge
        row.grids.append(",".join(map(str, grid)) + (f" (merge {merge_size})" if merge_size else ""))
        if fixed_grid(scheme, config, grid):  # a fixed-grid tower built for this grid
            owner = owner_class(rotary)(config).eval()
            whole, _ = whole_config(scheme, config)
        if scheme.grid == "window":  # SAM 3's ViT layer: windowed (the first layer) or global, by the grid
            window = config.window_size if grid[1:] == (config.window_size, config.window_size) else 0
            owner = owner_class(rotary)(config, window_size=window).eval()
        try:
            cos, sin = tower_table(rotary, owner, config, scheme, grid, run_merge)
        except Exception as exc:
            row.status, row.note = "unrun", f"grid {grid}: {exc!r}"[:240]
            return row
        asks: list[tuple[dict[str, Any], list[float] | None, np.ndarray]] = []  # (upload, class_pos_emb, rows)
        every = np.ones(cos.shape[0], dtype=bool)
        if learned:  # the module's own weight given: the whole table; not given: the patch rows alone
            weight = dict(owner.named_parameters())[scheme.learned_cls].detach().reshape(-1).tolist()
            patches, _ = _split_cls(scheme, grid, cos)
            asks = [(whole, weight, every), (whole, None, patches), (config.to_dict(), weight, every)]
        else:
            asks = [(whole, None, every), (config.to_dict(), None, every)]
        for upload, given, keep in asks:
            status, answer = ask_posenc(client, upload, grid, merge_size, class_pos_emb=given)
            if status != 200:
                row.status, row.note = "refused", f"grid {grid}: {status}: {str(answer)[:200]}"
                return row
            tables, metadata = answer
            if tables["cos"].shape != cos[keep].shape or (learned and given is None) != ("missing_rows" in metadata):
                row.status, row.note = "wrong", f"grid {grid}: shape {tables['cos'].shape}, the tower's {cos.shape}"
                return row
            error = max(float(np.max(np.abs(tables["cos"] - cos[keep]))),
                        float(np.max(np.abs(tables["sin"] - sin[keep]))))
            errors.append(error)
            if error > EXACT:
                bound = rounding_bound(scheme, grid, tables["inv_freq"], metadata["layout"], cos.shape[0])
                if (np.any(np.abs(tables["cos"] - cos[keep]) > bound)
                        or np.any(np.abs(tables["sin"] - sin[keep]) > bound)):
                    row.status, row.max_error = "wrong", error
                    row.note = f"grid {grid}: beyond the tower's own float32 angle rounding"
                    return row
                beyond[grid] = (error, largest_position(scheme, grid, cos.shape[0]))
        row.rows, row.cls_rows, row.layout = metadata["rows"], metadata["cls_rows"], metadata["layout"]
        row.columns, row.video = metadata["columns"], metadata["video"]
    row.max_error = max(errors)
    row.status = "exact"
    for grid, (error, largest) in beyond.items():
        notes.append(f"grid {','.join(map(str, grid))}: {error:.1e}, within the tower's float32 angle rounding "
                     f"(positions up to {largest})")
    if learned:
        notes.append(f"CLS angles are the weight {scheme.learned_cls}: the full table with its values as "
                     "class_pos_emb, the patch rows without")
    if scheme.note:
        notes.append(scheme.note)
    row.note = "; ".join(notes)
    return row


def gap_holds(client: Any, rotary: Rotary) -> bool:
    """Whether posenc still answers a listed gap's tower with the listed status."""
    status, _ = GAPS[rotary.name]
    config = vision_config(rotary)
    answered, _ = ask_posenc(client, config.to_dict(), (1, 4, 4))
    return answered == status


def not_a_tower_holds(rotary: Rotary) -> bool:
    """Whether a `NOT_A_TOWER` class is still built from a text config."""
    return "Text" in config_class(rotary).__name__


def sweep(client: Any, only: list[str] | None = None) -> list[VisionRow]:
    """Every row (`only`: the classes of these folders)."""
    out: list[VisionRow] = []
    for rotary in vision_classes():
        if only and rotary.folder not in only:
            continue
        scheme = scheme_of(rotary)
        if rotary.name in NOT_A_TOWER:
            out.append(VisionRow(rotary.folder, rotary.name, "not-a-tower", status="listed",
                                 note=NOT_A_TOWER[rotary.name]))
        elif rotary.name in GAPS:
            status, reason = GAPS[rotary.name]
            out.append(VisionRow(rotary.folder, rotary.name, "gap", status="listed", note=f"{status}: {reason}"))
        elif scheme is None:
            out.append(VisionRow(rotary.folder, rotary.name, "unclassified", status="unrun",
                                 note="a vision rotary class posenc does not know: describe it in "
                                      "posenc.models.vision_towers, or list it here"))
        else:
            try:
                out.append(tower_row(client, rotary, scheme))
            except Exception as exc:
                out.append(VisionRow(rotary.folder, rotary.name, "tower", scheme.name, "unrun", note=repr(exc)[:240]))
    return out


def coverage_markdown(rows: list[VisionRow]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        key = row.status if row.kind == "tower" else row.kind
        counts[key] = counts.get(key, 0) + 1
    lines = [
        "# Vision coverage",
        "",
        f"Generated by `python -m tests.parity.vision_sweep --write` against transformers {transformers.__version__}"
        " (the sweep of `tests/parity/test_vision_sweep.py`): every vision rotary module of its model folders, its "
        "tower built with one layer from its config class's defaults and run on the grids listed, the cos and sin "
        "its first attention layer passes to its rotary application recorded, against `POST /v1/rope/from-config"
        "?tower=vision&grid_thw=t,h,w` of the whole default config.json and of the vision config alone (exact: max "
        "error <= 1e-6 in float32; learned CLS angles: the full table given the module's own class_pos_emb, and the "
        "patch rows alone without it).",
        "",
        "Totals: " + ", ".join(f"{key} {value}" for key, value in sorted(counts.items())) + ".",
        "",
        "| folder | module | tower | grids (t,h,w) | row order | CLS rows | columns | layout | video | max error | "
        "status | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        error = "" if r.max_error is None else f"{r.max_error:.1e}"
        status = r.status if r.kind == "tower" else r.kind
        lines.append(f"| {r.folder} | {r.cls} | {r.tower} | {' '.join(r.grids)} | {r.rows} | {r.cls_rows} | "
                     f"{r.columns} | {r.layout} | {r.video} | {error} | {status} | {r.note} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import sys

    from tests.conftest import running_client

    os.environ.setdefault("POSENC_CPU_FORM_FROM", "config")
    torch.manual_seed(0)
    only = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    with running_client() as client:
        rows = sweep(client, only)
    if "--write" in sys.argv:
        COVERAGE_DOC.write_text(coverage_markdown(rows))
    for r in rows:
        print(r.folder, r.cls, r.tower, r.status, " ".join(r.grids), r.max_error, r.note, sep=" | ")


if __name__ == "__main__":
    main()
