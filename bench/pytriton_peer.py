"""A peer of `bench infer`: NVIDIA PyTriton (Triton Inference Server's C++ HTTP and gRPC front-ends) serving a
shipped model's graphs through a Python inference callable that runs onnxruntime (bench/peer_onnx.py).

Run by the interpreter of PyTriton's virtual environment (bench/peers.py makes it), with the checkout's top as its
working directory: `python -m bench.pytriton_peer`. Each model is bound with batching off (every request is one
call of the callable, as posenc runs a lone request) and dynamic shapes; the callable answers `output` as the
KServe v2 protocol names it, so tritonclient (binary tensors) talks to it as it talks to posenc.

    .venv-bench-pytriton/bin/python -m bench.pytriton_peer --http-port 8000 --grpc-port 8001 \
        --model-dir onnx/rope_attention --threads 1
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import sysconfig
from importlib.metadata import version
from typing import Any

import numpy as np
import onnxruntime as ort

from bench.peer_onnx import DTYPES, INPUTS, OnnxGraphs


def infer_function(graphs: OnnxGraphs) -> Any:
    """PyTriton's inference callable for one model: a list of requests in, a list of {output} out."""
    def infer(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        return [{"output": graphs.run({name: request[name] for name in INPUTS})} for request in requests]
    return infer


def main() -> None:
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    parser = argparse.ArgumentParser(prog="python -m bench.pytriton_peer")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--model-dir", action="append", required=True,
                        help="a shipped model's folder (repeatable); @FILE:N,... after it: its rule")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # Triton's Python backend stub links libpython3.X.so by name: the one of this interpreter, not the system's (a
    # different patch release whose C modules do not match this interpreter's standard library)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p)
    # SIGTERM (the benchmark's stop) unwinds through Triton's __exit__: tritonserver and the proxies stop too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    config = TritonConfig(http_address="127.0.0.1", http_port=args.http_port, grpc_address="127.0.0.1",
                          grpc_port=args.grpc_port, allow_metrics=False, log_verbose=0)
    with Triton(config=config) as triton:
        for entry in args.model_dir:
            graphs = OnnxGraphs(entry, args.threads)
            four = (-1, -1, -1, -1)
            triton.bind(model_name=graphs.name, infer_func=infer_function(graphs),
                        inputs=[Tensor(name=name, dtype=DTYPES[name], shape=(-1, -1) if name == "position_ids"
                                       else four) for name in INPUTS],
                        outputs=[Tensor(name="output", dtype=np.float32, shape=four)],
                        config=ModelConfig(batching=False))
        print(f"nvidia-pytriton {version('nvidia-pytriton')}, onnxruntime {ort.__version__}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
