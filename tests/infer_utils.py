"""Helpers shared by the inference tests: random inputs for a model geometry, onnxruntime sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient

from models.dtypes import lookup

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "onnx"


def random_inputs(hq: int, hkv: int, head_dim: int, batch: int, seq: int, *, seed: int = 0,
                  start: int = 0) -> dict[str, np.ndarray]:
    """query [B, Hq, S, D], key/value [B, Hkv, S, D] float32, position_ids [B, S] int64 (rows offset)."""
    rng = np.random.default_rng(seed)
    positions = np.arange(seq, dtype=np.int64)[None, :] + start + 3 * np.arange(batch, dtype=np.int64)[:, None]
    return {
        "query": rng.standard_normal((batch, hq, seq, head_dim), dtype=np.float32),
        "key": rng.standard_normal((batch, hkv, seq, head_dim), dtype=np.float32),
        "value": rng.standard_normal((batch, hkv, seq, head_dim), dtype=np.float32),
        "position_ids": positions,
    }


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return sess.run(["output"], inputs)[0]


def triton_inputs(inputs: dict[str, np.ndarray], binary: bool) -> list[httpclient.InferInput]:
    """tritonclient InferInputs for these arrays, sent as binary tensors or as JSON."""
    out = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), lookup(array.dtype).kserve)
        tensor.set_data_from_numpy(array, binary_data=binary)
        out.append(tensor)
    return out
