"""Helpers shared by the inference tests: random inputs for a model geometry (the kit's), onnxruntime sessions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb

from posenc.models.dtypes import lookup
from posenc.service.testing import attention_inputs as random_inputs

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "onnx"
# The shipped repository's models, sorted (the repository index's order): tests that cover every model use it
SHIPPED = ("gemma_2b_attention", "llama3_1_attention", "phi3_5_mini_attention", "qwen2_5_7b_attention",
           "qwen2_5_7b_yarn_attention", "rope_attention")
__all__ = ["REPOSITORY", "ROOT", "SHIPPED", "geometry", "random_inputs", "run", "session", "triton_inputs"]


def geometry(model: str) -> tuple[int, int, int]:
    """(Hq, Hkv, D) of a shipped model, from its config.json."""
    attention = json.loads((REPOSITORY / model / "config.json").read_text())["attention"]
    return attention["num_heads"], attention["num_kv_heads"], attention["head_dim"]


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return sess.run(["output"], inputs)[0]


def grpc_infer_request(inputs: dict[str, np.ndarray], model: str, request_id: str = "") -> pb.ModelInferRequest:
    """A KServe v2 gRPC `ModelInferRequest` of these arrays, each in `raw_input_contents`, in order."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=lookup(array.dtype).kserve, shape=array.shape)
        request.raw_input_contents.append(array.tobytes())
    return request


def triton_inputs(inputs: dict[str, np.ndarray], binary: bool) -> list[httpclient.InferInput]:
    """tritonclient InferInputs for these arrays, sent as binary tensors or as JSON."""
    out = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), lookup(array.dtype).kserve)
        tensor.set_data_from_numpy(array, binary_data=binary)
        out.append(tensor)
    return out
