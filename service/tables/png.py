"""PNG pictures of tables and property curves (`format=png`), drawn with matplotlib's Agg backend.

A `Picture` is plain data (panels of curves or heatmaps); `render` draws it. Table routes get a
picture of one tensor from `table_picture` (heatmap for 2-D, one panel per head for 3-D, a line for
1-D); property routes build their own. matplotlib is imported on first use: the service starts
without paying for it.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FIGURE_WIDTH_IN = 10.0
PANEL_HEIGHT_IN = 3.6
DPI = 100
MAX_HEAD_PANELS = 8  # heads drawn for a [H, q, k] bias; the title says how many there are

# Axis labels by tensor name (rows, columns): the tables posenc serves.
AXES: Mapping[str, tuple[str, str]] = {
    "cos": ("position", "channel"), "sin": ("position", "channel"), "pe": ("position", "dimension"),
    "bias": ("query", "key"), "buckets": ("query", "key"), "relative_positions": ("query", "key"),
    "indices": ("query", "key"), "inv_freq": ("frequency index", "inverse frequency"),
    "slopes": ("head", "slope"),
}

_LOCK = threading.Lock()  # pyplot's state is global: one figure at a time


@dataclass(frozen=True)
class Curve:
    x: np.ndarray
    y: np.ndarray
    label: str | None = None
    style: str = "line"  # line | points | step


@dataclass(frozen=True)
class Panel:
    """Curves on shared axes; `marks` are vertical lines (e.g. bucket boundaries)."""

    title: str
    xlabel: str
    ylabel: str
    curves: Sequence[Curve]
    marks: Sequence[float] = ()
    mark_label: str | None = None
    logy: bool = False
    logx: bool = False


@dataclass(frozen=True)
class Heatmap:
    """One matrix drawn cell by cell, with a labelled colour bar."""

    title: str
    values: np.ndarray  # [rows, columns]
    ylabel: str
    xlabel: str
    colorbar: str = "value"


@dataclass(frozen=True)
class Picture:
    title: str
    panels: Sequence[Panel | Heatmap] = field(default_factory=tuple)


def titled(head: str, params: Mapping[str, str], width: int = 120) -> str:
    """`head` then the NAME=VALUE pairs, wrapped into lines of about `width` characters."""
    lines, line = [head], ""
    for item in (f"{k}={v}" for k, v in params.items()):
        if line and len(line) + len(item) + 2 > width:
            lines.append(line)
            line = ""
        line = f"{line}, {item}" if line else item
    return "\n".join([*lines, line] if line else lines)


def as_float(values: np.ndarray) -> np.ndarray:
    """float64 for drawing (bfloat16 and integers included); −inf/NaN masked out."""
    return np.ma.masked_invalid(np.asarray(values).astype(np.float64))


def table_picture(endpoint: str, name: str, array: np.ndarray, params: Mapping[str, str]) -> Picture:
    """The default picture of one served tensor: 1-D line, 2-D heatmap, 3-D one heatmap per head."""
    rows_label, cols_label = AXES.get(name, ("axis 0", "axis 1"))
    title = titled(f"/v1/{endpoint} · {name} {list(array.shape)} {array.dtype}",
                   {k: v for k, v in params.items() if k != "dtype"})
    if array.ndim <= 1:
        values = array.reshape(-1)
        return Picture(title, (Panel(name, rows_label, cols_label,
                                     (Curve(np.arange(values.size), as_float(values), name, "points"),)),))
    if array.ndim == 2:
        return Picture(title, (Heatmap(name, array, rows_label, cols_label, name),))
    heads = array.reshape(-1, *array.shape[-2:])  # [H, rows, columns]
    shown = min(heads.shape[0], MAX_HEAD_PANELS)
    suffix = f" (first {shown} of {heads.shape[0]})" if shown < heads.shape[0] else ""
    return Picture(title + suffix, tuple(Heatmap(f"{name} · head {h}", heads[h], rows_label, cols_label, name)
                                         for h in range(shown)))


def picture_elements(picture_shape: tuple[int, ...]) -> int:
    """Cells a table picture draws for a tensor of this shape (the pixel limit is checked on it)."""
    if len(picture_shape) <= 2:
        return int(np.prod(picture_shape, dtype=np.int64)) if picture_shape else 1
    heads = int(np.prod(picture_shape[:-2], dtype=np.int64))
    return min(heads, MAX_HEAD_PANELS) * picture_shape[-2] * picture_shape[-1]


def render(picture: Picture) -> bytes:
    """The picture as PNG bytes (deterministic: no timestamp or software tag in the file)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure  # a Figure without pyplot: no global figure manager

    with _LOCK:
        panels = list(picture.panels)
        columns = 2 if len(panels) > 1 else 1
        rows = (len(panels) + columns - 1) // columns
        figure = Figure(figsize=(FIGURE_WIDTH_IN, 1.0 + PANEL_HEIGHT_IN * rows), dpi=DPI, layout="constrained")
        figure.suptitle(picture.title, fontsize=10)
        for index, panel in enumerate(panels):
            axes = figure.add_subplot(rows, columns, index + 1)
            if isinstance(panel, Heatmap):
                _heatmap(figure, axes, panel)
            else:
                _curves(axes, panel)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _heatmap(figure: Any, axes: Any, panel: Heatmap) -> None:
    values = as_float(panel.values)
    image = axes.imshow(values, aspect="auto", interpolation="nearest", cmap="viridis")
    axes.set_title(panel.title, fontsize=9)
    axes.set_xlabel(panel.xlabel)
    axes.set_ylabel(panel.ylabel)
    bar = figure.colorbar(image, ax=axes)
    bar.set_label(panel.colorbar)


def _curves(axes: Any, panel: Panel) -> None:
    for curve in panel.curves:
        x, y = as_float(curve.x), as_float(curve.y)
        if curve.style == "points":
            axes.plot(x, y, ".", markersize=3, label=curve.label)
        elif curve.style == "step":
            axes.step(x, y, where="post", label=curve.label)
        else:
            axes.plot(x, y, linewidth=1.2, label=curve.label)
    if panel.marks:  # one collection, not an artist per mark: a clipped map has one boundary per offset
        axes.vlines(panel.marks, 0, 1, transform=axes.get_xaxis_transform(), colors="0.6", linewidth=0.6,
                    linestyles=":")
    if panel.logy:
        axes.set_yscale("log", nonpositive="mask")  # zeros (a removed mean, a zero frequency) are left out
    if panel.logx:
        axes.set_xscale("log")
    axes.set_title(panel.title + (f" ({panel.mark_label}: dotted)" if panel.marks and panel.mark_label else ""),
                   fontsize=9)
    axes.set_xlabel(panel.xlabel)
    axes.set_ylabel(panel.ylabel)
    axes.grid(True, alpha=0.3)
    if any(curve.label for curve in panel.curves):
        axes.legend(fontsize=8)
