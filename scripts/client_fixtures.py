"""Expected numbers for the client tests (JavaScript, C++, Go, Java, Rust), computed on the Python side.

    python scripts/client_fixtures.py OUT.json

Writes `{"dtypes": [...], "tables": [...], "infer": {...} | null}`. `dtypes` is models/dtypes.py's table
(name, safetensors code, KServe datatype, element size in bytes, .npy descr without its byte-order
character or null), which every client's own dtype table is checked against. Each table case has the endpoint, its query
parameters and the expected tensors as little-endian bytes (base64) with dtype and shape: the
sinusoidal cases straight from `posenc.models.sinusoidal`, every case also through the app in-process
(`fastapi.testclient.TestClient`, lifespan included). Every case in CASES must answer 200: one that
does not (a missing route, parameters the endpoint refuses) stops the script with a non-zero exit
naming the case, so the JS test never silently checks fewer cases. The inference case holds
deterministic inputs and the output of onnxruntime run directly on the shipped
`onnx/<model>/model.onnx` — no server involved.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from posenc.models.sinusoidal import sinusoidal_table
from posenc.service.codec.encode import decode_json_tensor
from posenc.service.http.app import create_app
from posenc.service.settings import Settings

REPO = Path(__file__).resolve().parent.parent

# (endpoint, parameters): small tables of every v1 GET family, including bfloat16 and -inf values.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/sinusoidal", {"max_position": 6, "dim": 8, "variant": "paper"}),
    ("/v1/sinusoidal", {"max_position": 5, "dim": 12, "variant": "fairseq", "dtype": "float64"}),
    ("/v1/sinusoidal", {"max_position": 4, "dim": 8, "variant": "tensor2tensor", "dtype": "bfloat16"}),
    ("/v1/rope", {"max_position": 5, "head_dim": 8}),
    ("/v1/rope", {"max_position": 4, "head_dim": 16, "rope_type": "linear", "factor": 2.0, "dtype": "float16"}),
    ("/v1/alibi/slopes", {"num_heads": 12}),
    ("/v1/alibi/bias", {"num_heads": 2, "query_length": 3, "key_length": 4, "mode": "causal", "mask": "true"}),
    ("/v1/t5/buckets", {"query_length": 4, "key_length": 6}),
    ("/v1/deberta/buckets", {"query_length": 3, "key_length": 5}),
    ("/v1/relative/clipped", {"query_length": 3, "key_length": 5, "max_relative_position": 2}),
]


def tensor_doc(array: np.ndarray) -> dict[str, Any]:
    from posenc.models.dtypes import dtype_name

    little = np.ascontiguousarray(array)
    return {"dtype": dtype_name(array.dtype), "shape": list(array.shape),
            "b64": base64.b64encode(little.reshape(-1).view(np.uint8).tobytes()).decode()}


class FixtureError(RuntimeError):
    """A fixture case the app does not answer with 200."""


def in_process(client: TestClient, endpoint: str, params: dict[str, Any]) -> dict[str, np.ndarray]:
    """The tensors the app computes for this request; FixtureError unless it answers 200."""
    # format=json decodes with the service's own helper (bfloat16 and -inf included, no extra package).
    response = client.get(endpoint, params={**params, "format": "json"})
    if response.status_code != 200:
        raise FixtureError(f"GET {endpoint} {params}: HTTP {response.status_code} {response.content[:300]!r}")
    doc = response.json()
    return {name: decode_json_tensor(t) for name, t in doc["tensors"].items()}


def direct(endpoint: str, params: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """Straight from the numeric core, where the test knows the function."""
    if endpoint != "/v1/sinusoidal":
        return None
    from posenc.models.dtypes import np_dtype

    pe = sinusoidal_table(params["max_position"], params["dim"], params["variant"], 10000.0, 0, 1,
                          np_dtype(params.get("dtype", "float32")))
    return {"pe": pe}


def table_cases() -> list[dict[str, Any]]:
    """One fixture per CASES entry, in order; SystemExit naming every case that did not answer 200."""
    served_cases, failed = [], []
    with TestClient(create_app(Settings(access_log=False))) as client:
        for endpoint, params in CASES:
            try:
                served_cases.append((endpoint, params, in_process(client, endpoint, params)))
            except FixtureError as exc:
                failed.append(str(exc))
    if failed:
        raise SystemExit(f"js fixtures: {len(failed)} of {len(CASES)} table case(s) did not answer 200:\n  "
                         + "\n  ".join(failed))
    cases = []
    for endpoint, params, served in served_cases:
        reference = direct(endpoint, params)
        if reference is not None:
            for name, array in reference.items():
                if array.tobytes() != served[name].tobytes():
                    raise SystemExit(f"{endpoint}: app and models.sinusoidal disagree on {name}")
        tensors = {name: tensor_doc(array) for name, array in served.items()}
        cases.append({"endpoint": endpoint, "params": {k: str(v) for k, v in params.items()}, "tensors": tensors})
    return cases


def model_inputs(config: dict[str, Any], batch: int, seq: int) -> dict[str, np.ndarray]:
    """Deterministic inputs for the declared shapes (-1: `batch` first, `seq` elsewhere)."""
    rng = np.random.default_rng(1234)
    inputs = {}
    for spec in config["inputs"]:
        shape = [d if d > 0 else (batch if i == 0 else seq) for i, d in enumerate(spec["shape"])]
        if spec["datatype"] == "INT64":
            inputs[spec["name"]] = np.broadcast_to(np.arange(shape[-1], dtype=np.int64) + 3, shape).copy()
        else:
            inputs[spec["name"]] = rng.standard_normal(shape).astype(np.float32)
    return inputs


def infer_case() -> dict[str, Any] | None:
    configs = sorted((REPO / "onnx").glob("*/config.json"))
    if not configs:
        print("js fixtures: no model in onnx/, the infer test will skip", file=sys.stderr)
        return None
    preferred = [c for c in configs if c.parent.name == "rope_attention"]
    config_path = (preferred or configs)[0]
    import onnxruntime as ort

    config = json.loads(config_path.read_text())
    inputs = model_inputs(config, batch=2, seq=5)
    session = ort.InferenceSession(str(config_path.parent / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(names, inputs), strict=True))
    return {"model": config_path.parent.name,
            "inputs": {name: tensor_doc(a) for name, a in inputs.items()},
            "outputs": {name: tensor_doc(a) for name, a in outputs.items()}}


def dtype_table() -> list[dict[str, Any]]:
    """models/dtypes.py's rows in the spellings the clients keep: the one table they are checked against."""
    from posenc.models.dtypes import DTYPES

    return [{"name": d.name, "safetensors": d.safetensors, "kserve": d.kserve, "size": d.numpy.itemsize,
             "npy": d.npy} for d in DTYPES]


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit("usage: client_fixtures.py OUT.json")
    doc = {"dtypes": dtype_table(), "tables": table_cases(), "infer": infer_case()}
    Path(sys.argv[1]).write_text(json.dumps(doc))
    print(f"js fixtures: {len(doc['tables'])} table cases, infer: "
          f"{doc['infer']['model'] if doc['infer'] else 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
