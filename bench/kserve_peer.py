"""The peer of `bench infer`: KServe's own Python ModelServer serving a shipped model's graphs with onnxruntime.

Run by the interpreter of KServe's virtual environment (bench/peers.py makes it), not by posenc's: it imports
kserve, onnxruntime and numpy only. The model answers the KServe v2 protocol (binary tensors included) on
/v2/models/NAME/infer; it runs the same graph posenc runs for the request's sequence length (`FOLDER@FILE:N,...`:
each FILE from sequence length N on, as config.json's `cpu_rule`; model.onnx alone without it) with the session
options posenc's server uses (intra-op threads, one inter-op thread, no spinning).

    .venv-bench-kserve/bin/python bench/kserve_peer.py --port 8080 --model-dir onnx/rope_attention --threads 1
"""

from __future__ import annotations

import argparse
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OnnxAttention(Model):
    def __init__(self, name: str, folder: Path, threads: int, rule: list[tuple[int, str]]) -> None:
        super().__init__(name)
        self.folder, self.threads, self.rule = folder, threads, rule or [(1, "model.onnx")]
        self.sessions: dict[str, ort.InferenceSession] = {}

    def _session(self, file: str) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(self.folder / file), sess_options=options,
                                    providers=["CPUExecutionProvider"])

    def load(self) -> bool:
        self.sessions = {file: self._session(file) for _, file in self.rule}
        self.ready = True
        return True

    def predict(self, payload: InferRequest, headers: Any = None, response_headers: Any = None) -> InferResponse:
        feeds = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        seq = feeds["query"].shape[2]
        file = [name for start, name in self.rule if seq >= start][-1]
        output = self.sessions[file].run(["output"], feeds)[0]
        tensor = InferOutput(name="output", shape=list(output.shape), datatype="FP32")
        tensor.set_data_from_numpy(np.ascontiguousarray(output), binary_data=True)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[tensor],
                             use_binary_outputs=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/kserve_peer.py")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", type=Path, action="append", required=True,
                        help="a shipped model's folder (repeatable); @FILE:N,... after it: its rule")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    models = []
    for entry in args.model_dir:
        folder, _, rule = str(entry).partition("@")
        steps = [step.rpartition(":") for step in rule.split(",") if step]
        models.append(OnnxAttention(Path(folder).name, Path(folder), args.threads,
                                    [(int(start), file) for file, _, start in steps]))
    for model in models:
        model.load()
    print(f"kserve {version('kserve')}, onnxruntime {ort.__version__}", flush=True)
    ModelServer(http_port=args.port, enable_grpc=False, workers=1, enable_latency_logging=False).start(models)


if __name__ == "__main__":
    main()
