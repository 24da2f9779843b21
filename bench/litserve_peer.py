"""A peer of `bench infer`: Lightning AI's LitServe (HTTP, FastAPI + uvicorn, the model in a worker process of its
own) serving a shipped model's graphs with onnxruntime (bench/peer_onnx.py).

Run by the interpreter of LitServe's virtual environment (bench/peers.py makes it), with the checkout's top as its
working directory: `python -m bench.litserve_peer`. One LitAPI per model at POST /v2/models/NAME/litserve, one
inference worker on the CPU, batching off (max_batch_size 1), ZeroMQ between the API server and the worker
(`fast_queue`, LitServe's faster transport). LitServe reads a request body as JSON, so the request is
`bench.peer_onnx.litserve_body` (each input's bytes as a base64 string); the answer is the output's raw bytes.

    .venv-bench-litserve/bin/python -m bench.litserve_peer --port 8000 --model-dir onnx/rope_attention --threads 1
"""

import argparse
import logging
from importlib.metadata import version
from typing import Any

import litserve as ls
import numpy as np
import onnxruntime as ort
from starlette.requests import Request
from starlette.responses import Response

from bench.peer_onnx import SHAPE_HEADER, OnnxGraphs, litserve_inputs


def path_of(model: str) -> str:
    return f"/v2/models/{model}/litserve"


class OnnxAttention(ls.LitAPI):
    def __init__(self, entry: str, threads: int) -> None:
        self.entry, self.threads = entry, threads
        name = entry.partition("@")[0].rstrip("/").rsplit("/", 1)[-1]
        super().__init__(max_batch_size=1, api_path=path_of(name))
        self.graphs: OnnxGraphs | None = None

    def setup(self, device: Any) -> None:
        self.graphs = OnnxGraphs(self.entry, self.threads)

    # LitServe reads the annotation (no `from __future__ import annotations` here): Request, its default, has the
    # API server parse the body as JSON and hand the worker the parsed object
    def decode_request(self, request: Request) -> dict[str, np.ndarray]:
        return litserve_inputs(request)  # type: ignore[arg-type]

    def predict(self, x: dict[str, np.ndarray]) -> np.ndarray:
        assert self.graphs is not None
        return self.graphs.run(x)

    def encode_response(self, output: np.ndarray) -> Response:
        return Response(content=np.ascontiguousarray(output).tobytes(), media_type="application/octet-stream",
                        headers={SHAPE_HEADER: ",".join(str(n) for n in output.shape)})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.litserve_peer")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", action="append", required=True,
                        help="a shipped model's folder (repeatable); @FILE:N,... after it: its rule")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    apis = [OnnxAttention(entry, args.threads) for entry in args.model_dir]
    print(f"litserve {version('litserve')}, onnxruntime {ort.__version__}", flush=True)
    server = ls.LitServer(apis, accelerator="cpu", devices=1, workers_per_device=1, timeout=600, fast_queue=True)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=1, log_level="warning",
               generate_client_file=False)


if __name__ == "__main__":
    main()
