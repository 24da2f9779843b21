"""What a learned absolute position table [P, d] encodes (BERT's or GPT-2's `position_embeddings`):
cosine similarity between positions, the spectrum over positions of each dimension, nearest-neighbour
offsets, and the same measures for the sinusoidal table of the same shape, for comparison."""

import numpy as np

from posenc.models.errors import ParameterError
from posenc.models.properties.measures import MAX_PROPERTY_ROWS
from posenc.models.sinusoidal import sinusoidal_table

MAX_LEARNED_ROWS = 8192  # the similarity matrix is [P, P]
MAX_LEARNED_WIDTH = MAX_PROPERTY_ROWS


def check_learned_shape(shape: tuple[int, ...]) -> None:
    """A position table is 2-D [positions, dim] with at least two positions."""
    if len(shape) != 2:
        raise ParameterError("table", f"must be 2-D [positions, dim], got shape {list(shape)}")
    positions, dim = shape
    if not 2 <= positions <= MAX_LEARNED_ROWS:
        raise ParameterError("table", f"needs 2 .. {MAX_LEARNED_ROWS} positions (rows), got {positions}")
    if not 1 <= dim <= MAX_LEARNED_WIDTH:
        raise ParameterError("table", f"needs 1 .. {MAX_LEARNED_WIDTH} dimensions (columns), got {dim}")


def cosine_similarity(table: np.ndarray) -> np.ndarray:
    """cos(angle) between every two rows: [P, d] → float64 [P, P] (a zero row has similarity 0)."""
    rows = table.astype(np.float64)
    norms = np.linalg.norm(rows, axis=1)
    unit = rows / np.where(norms > 0, norms, 1.0)[:, None]
    return np.clip(unit @ unit.T, -1.0, 1.0)


def spectrum(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension amplitude spectrum over positions (each column's mean removed).

    Returns the mean amplitude per frequency float64 [P//2 + 1] (frequency f cycles per P positions)
    and each dimension's dominant frequency float64 [d] in cycles per position.
    """
    rows = table.astype(np.float64)
    amplitude = np.abs(np.fft.rfft(rows - rows.mean(axis=0), axis=0))  # [P//2 + 1, d]
    frequencies = np.fft.rfftfreq(rows.shape[0])  # cycles per position
    return amplitude.mean(axis=1), frequencies[np.argmax(amplitude, axis=0)]


def nearest_offsets(similarity: np.ndarray) -> np.ndarray:
    """For each position, (most similar other position) − position: int64 [P]. A smooth table gives ±1."""
    others = similarity.copy()
    np.fill_diagonal(others, -np.inf)
    return (np.argmax(others, axis=1) - np.arange(similarity.shape[0])).astype(np.int64)


def learned_properties(table: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, float | int]]:
    """Curves and scalars of a learned table [P, d], and of the paper sinusoidal table [P, d].

    Curves: cosine_similarity [P, P], spectrum [P//2 + 1], dominant_frequency [d], nearest_offset [P],
    similarity_by_distance [P] (mean cosine similarity of positions Δ apart), each also prefixed
    `sinusoidal_`; frequency [P//2 + 1] (cycles per position).
    """
    check_learned_shape(table.shape)
    positions, dim = table.shape
    curves: dict[str, np.ndarray] = {"frequency": np.fft.rfftfreq(positions)}
    scalars: dict[str, float | int] = {"positions": positions, "dim": dim}
    reference = sinusoidal_table(positions, dim, "paper", dtype=np.float64)
    for prefix, values in (("", table), ("sinusoidal_", reference)):
        similarity = cosine_similarity(values)
        mean_spectrum, dominant = spectrum(values)
        nearest = nearest_offsets(similarity)
        curves |= {f"{prefix}cosine_similarity": similarity, f"{prefix}spectrum": mean_spectrum,
                   f"{prefix}dominant_frequency": dominant, f"{prefix}nearest_offset": nearest,
                   f"{prefix}similarity_by_distance": similarity_by_distance(similarity)}
        distances = np.linalg.norm(np.diff(values.astype(np.float64), axis=0), axis=1)
        scalars |= {f"{prefix}min_adjacent_distance": float(distances.min()),
                    f"{prefix}nearest_is_neighbour": float(np.mean(np.abs(nearest) == 1))}
    return curves, scalars


def similarity_by_distance(similarity: np.ndarray) -> np.ndarray:
    """Mean of the Δ-th diagonal of a [P, P] similarity matrix, Δ = 0 .. P − 1: float64 [P]."""
    return np.array([np.diagonal(similarity, offset=delta).mean() for delta in range(similarity.shape[0])])
