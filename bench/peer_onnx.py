"""The graphs a peer server of `bench infer` runs (bench/pytriton_peer.py, bench/litserve_peer.py): the graph posenc
runs for the request's sequence length, with the session options posenc's server uses.

Imported by the peers' own interpreters (their virtual environments, bench/peers.py), so it needs onnxruntime and
numpy only. `FOLDER@FILE:N,...`: each FILE from sequence length N on, as config.json's `cpu_rule` (model.onnx alone
without it); the sessions have `threads` intra-op threads, one inter-op thread and no spinning.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

INPUTS = ("query", "key", "value", "position_ids")  # the rope attention graphs' inputs, in order
DTYPES = {"query": np.float32, "key": np.float32, "value": np.float32, "position_ids": np.int64}


def parse_model_dir(entry: str) -> tuple[Path, list[tuple[int, str]]]:
    """(folder, rule) of a `FOLDER@FILE:N,...` argument (rule empty: model.onnx alone)."""
    folder, _, rule = entry.partition("@")
    steps = [step.rpartition(":") for step in rule.split(",") if step]
    return Path(folder), [(int(start), file) for file, _, start in steps]


class OnnxGraphs:
    """One model's graphs: a session per file of its rule, chosen by the query's sequence length."""

    def __init__(self, entry: str, threads: int) -> None:
        self.folder, rule = parse_model_dir(entry)
        self.name = self.folder.name
        self.rule = rule or [(1, "model.onnx")]
        self.sessions = {file: self._session(self.folder / file, threads) for _, file in self.rule}

    @staticmethod
    def _session(path: Path, threads: int) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The `output` for `feeds` ([B, H, S, D] query, ...), on the graph the rule names for S."""
        seq = feeds["query"].shape[2]
        file = [name for start, name in self.rule if seq >= start][-1]
        output: np.ndarray = self.sessions[file].run(["output"], feeds)[0]
        return output


# LitServe's request (bench/litserve_peer.py): LitServe reads a request body as JSON (or a form), so the tensors
# travel as base64 strings of their bytes, one JSON object per input; the answer is the output's raw float32 bytes,
# its shape in a header.
SHAPE_HEADER = "x-output-shape"


def litserve_body(arrays: dict[str, np.ndarray]) -> bytes:
    """The JSON request body LitServe's peer reads: {name: {"shape", "dtype", "b64"}} per input."""
    return json.dumps({name: {"shape": list(array.shape), "dtype": str(array.dtype),
                              "b64": base64.b64encode(np.ascontiguousarray(array).data).decode("ascii")}
                       for name, array in arrays.items()}).encode()


def litserve_inputs(payload: dict[str, Any]) -> dict[str, np.ndarray]:
    """The inputs of a parsed `litserve_body`."""
    return {name: np.frombuffer(base64.b64decode(tensor["b64"]), np.dtype(tensor["dtype"])).reshape(tensor["shape"])
            for name, tensor in payload.items()}


def litserve_output(body: bytes, headers: dict[str, str]) -> np.ndarray:
    """The output array of a LitServe peer's answer (raw float32 bytes, the shape in SHAPE_HEADER)."""
    shape = [int(n) for n in headers[SHAPE_HEADER].split(",")]
    return np.frombuffer(body, np.float32).reshape(shape)
