"""HTTP checks of a running posenc service (standard library only: runs on any host with python3).

    python3 scripts/container_check.py wait-ready URL [--timeout S]
    python3 scripts/container_check.py wait-live URL [--timeout S]
    python3 scripts/container_check.py check URL [--model NAME --model-config PATH] [--expect-models NAME ...]
    python3 scripts/container_check.py expect-unready URL

`check` covers health, the KServe v2 server endpoints (`/v2`, `/v2/health/ready`), one table in each
wire format (decoded and compared value by value), the metrics endpoint, with `--expect-models` the
repository index (exactly those models, each READY) and, with `--model`, one binary KServe v2 inference
call. `expect-unready` wants the service up (`/healthz`, `/v2`) but unready (503 on `/readyz` and
`/v2/health/ready`); a service without `/v2` fails it. Exit status 0 = all good; failures print one line
each to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import time
import urllib.error
import urllib.request
from array import array
from typing import Any

TABLE = "/v1/sinusoidal?max_position=16&dim=8&variant=paper"


class CheckFailed(Exception):
    pass


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body); HTTP errors are answers too, not exceptions."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def wait_for(url: str, path: str, timeout: float) -> None:
    """Poll `path` until it answers 200; bounded by `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status, _, body = http("GET", url + path, timeout=2.0)
            if status == 200:
                return
            last = f"HTTP {status}: {body[:200]!r}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise CheckFailed(f"{path} not 200 after {timeout:.0f}s (last: {last})")


def floats32(data: bytes) -> list[float]:
    values = array("f")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def decode_safetensors(body: bytes) -> dict[str, tuple[str, list[int], bytes]]:
    """{name: (dtype code, shape, bytes)} of a safetensors file."""
    (n,) = struct.unpack_from("<Q", body)
    header = json.loads(body[8:8 + n])
    header.pop("__metadata__", None)
    data = body[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def decode_npy(body: bytes) -> tuple[str, list[int], bytes]:
    expect(body[:6] == b"\x93NUMPY", "npy: bad magic")
    major = body[6]
    n, start = (struct.unpack_from("<H", body, 8)[0], 10) if major == 1 else (struct.unpack_from("<I", body, 8)[0], 12)
    header = body[start:start + n].decode("latin-1")
    descr = header.split("'descr':")[1].split(",")[0].strip().strip("'")
    shape_text = header.split("'shape':")[1].split(")")[0].strip(" (")
    shape = [int(s) for s in shape_text.split(",") if s.strip()]
    return descr, shape, body[start + n:]


def check_tables(url: str) -> None:
    """The same table in all four formats: same shape, same float32 values, and pe[1][0] == sin(1)."""
    got: dict[str, list[float]] = {}
    status, headers, body = http("GET", url + TABLE + "&format=safetensors")
    expect(status == 200 and headers.get("content-type", "").startswith("application/x-safetensors"),
           f"safetensors: HTTP {status} {headers.get('content-type')}")
    dtype, shape, data = decode_safetensors(body)["pe"]
    expect((dtype, shape) == ("F32", [16, 8]), f"safetensors: pe is {dtype} {shape}")
    got["safetensors"] = floats32(data)

    status, _, body = http("GET", url + TABLE + "&format=npy")
    expect(status == 200, f"npy: HTTP {status}")
    descr, shape, data = decode_npy(body)
    expect((descr, shape) == ("<f4", [16, 8]), f"npy: {descr} {shape}")
    got["npy"] = floats32(data)

    status, headers, body = http("GET", url + TABLE + "&format=raw")
    expect(status == 200, f"raw: HTTP {status}")
    described = (headers.get("x-tensor-name"), headers.get("x-tensor-dtype"), headers.get("x-tensor-shape"))
    expect(described == ("pe", "float32", "16,8"), f"raw: headers {described}")
    got["raw"] = floats32(body)

    status, _, body = http("GET", url + TABLE + "&format=json")
    expect(status == 200, f"json: HTTP {status}")
    tensor = json.loads(body)["tensors"]["pe"]
    expect(tensor["shape"] == [16, 8], f"json: shape {tensor['shape']}")
    got["json"] = [float(v) for v in tensor["data"]]

    reference = got["safetensors"]
    for fmt, values in got.items():
        expect(values == reference, f"{fmt}: values differ from safetensors")
    expect(abs(reference[8] - math.sin(1.0)) < 1e-6, f"pe[1][0] = {reference[8]}, expected sin(1)")
    status, _, _ = http("GET", url + "/v1/sinusoidal?max_position=0&dim=8")
    expect(status == 422, f"bad parameter: HTTP {status}, expected 422")


def check_v2_server(url: str, ready: bool) -> None:
    """The KServe v2 server endpoints exist (a missing /v2 is a failure) and readiness is as expected."""
    status, _, body = http("GET", url + "/v2")
    expect(status == 200, f"/v2: HTTP {status}, expected 200 (KServe v2 server metadata): {body[:200]!r}")
    doc = json.loads(body)
    expect(isinstance(doc, dict) and doc.get("name") == "posenc", f"/v2: {body[:200]!r}, expected server 'posenc'")
    status, _, body = http("GET", url + "/v2/health/live")
    expect(status == 200, f"/v2/health/live: HTTP {status}: {body[:200]!r}")
    status, _, body = http("GET", url + "/v2/health/ready")
    wanted = 200 if ready else 503
    expect(status == wanted, f"/v2/health/ready: HTTP {status}, expected {wanted}: {body[:200]!r}")


def check_index(url: str, models: list[str]) -> None:
    """The repository index lists exactly these models (the image's repository), each READY."""
    status, _, body = http("POST", url + "/v2/repository/index", b"{}", {"Content-Type": "application/json"})
    expect(status == 200, f"/v2/repository/index: HTTP {status}: {body[:200]!r}")
    listed = {entry["name"]: entry["state"] for entry in json.loads(body)}
    expect(listed == dict.fromkeys(models, "READY"),
           f"/v2/repository/index: {listed}, expected {sorted(models)} all READY")


def check_metrics(url: str) -> None:
    status, headers, body = http("GET", url + "/metrics")
    expect(status == 200 and headers.get("content-type", "").startswith("text/plain"), f"/metrics: HTTP {status}")
    text = body.decode()
    expect('route="/v1/sinusoidal"' in text and "posenc_http_requests_total" in text,
           "/metrics: no request counter for /v1/sinusoidal")
    expect("posenc_table_cache_hits_total" in text, "/metrics: no table cache counters")


def infer_inputs(metadata: dict[str, Any], seq: int) -> list[tuple[dict[str, Any], bytes]]:
    """Deterministic inputs for the model's declared shapes (-1: batch 1, sequence `seq`)."""
    out = []
    for spec in metadata["inputs"]:
        shape = [d if d > 0 else (1 if i == 0 else seq) for i, d in enumerate(spec["shape"])]
        count = math.prod(shape)
        if spec["datatype"] == "INT64":
            per_row = shape[-1]
            data = struct.pack(f"<{count}q", *[i % per_row for i in range(count)])
        else:
            data = struct.pack(f"<{count}f", *[((i * 37) % 101) / 101.0 - 0.5 for i in range(count)])
        header = {"name": spec["name"], "shape": shape, "datatype": spec["datatype"],
                  "parameters": {"binary_data_size": len(data)}}
        out.append((header, data))
    return out


def check_infer(url: str, model: str, causal: bool) -> None:
    """One binary-tensor infer call; for a causal model, position 0 attends only to itself → v[0]."""
    status, _, body = http("GET", f"{url}/v2/models/{model}")
    expect(status == 200, f"/v2/models/{model}: HTTP {status} {body[:200]!r}")
    inputs = infer_inputs(json.loads(body), seq=3)
    header = json.dumps({"inputs": [h for h, _ in inputs],
                         "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
    payload = header + b"".join(d for _, d in inputs)
    status, headers, body = http("POST", f"{url}/v2/models/{model}/infer", payload,
                                 {"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"}, timeout=30.0)
    expect(status == 200, f"infer: HTTP {status} {body[:300]!r}")
    n = int(headers.get("inference-header-content-length", len(body)))
    doc = json.loads(body[:n])
    (out,) = [o for o in doc["outputs"] if o["name"] == "output"]
    values = floats32(body[n:n + out["parameters"]["binary_data_size"]])
    expect(len(values) == math.prod(out["shape"]) and all(map(math.isfinite, values)),
           f"infer: output {out['shape']} has {len(values)} values or non-finite ones")
    if causal:
        value_header, value_bytes = next((h, d) for h, d in inputs if h["name"] == "value")
        _, kv_heads, seq, dim = value_header["shape"]
        heads = out["shape"][1]
        v = floats32(value_bytes)
        for h in range(heads):
            kv = h // (heads // kv_heads)  # grouped-query attention: query head h reads kv head h // group
            got, want = values[h * seq * dim:][:dim], v[kv * seq * dim:][:dim]  # [1, H, S, D]: position 0
            diff = max(abs(a - b) for a, b in zip(got, want, strict=True))
            expect(diff < 1e-5, f"infer: head {h} position 0 differs from value[kv head {kv}, 0] by {diff}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["wait-ready", "wait-live", "check", "expect-unready"])
    parser.add_argument("url")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--model")
    parser.add_argument("--model-config", help="the model's config.json (for its `causal` flag)")
    parser.add_argument("--expect-models", nargs="*", help="every model the repository index must list READY")
    args = parser.parse_args()
    url = args.url.rstrip("/")
    try:
        if args.action == "wait-ready":
            wait_for(url, "/readyz", args.timeout)
        elif args.action == "wait-live":
            wait_for(url, "/healthz", args.timeout)
        elif args.action == "expect-unready":
            wait_for(url, "/healthz", args.timeout)
            status, _, body = http("GET", url + "/readyz")
            expect(status == 503, f"/readyz: HTTP {status}, expected 503: {body[:200]!r}")
            check_v2_server(url, ready=False)
            print(f"  unready as expected: {body.decode()[:300]}")
        else:
            wait_for(url, "/healthz", 5)
            wait_for(url, "/readyz", 5)
            check_v2_server(url, ready=True)
            check_tables(url)
            check_metrics(url)
            if args.expect_models is not None:
                check_index(url, args.expect_models)
            if args.model:
                causal = False
                if args.model_config:
                    with open(args.model_config) as fh:
                        causal = bool(json.load(fh).get("causal", False))
                check_infer(url, args.model, causal)
    except (CheckFailed, OSError, ValueError, KeyError) as exc:
        print(f"FAIL ({args.action}): {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
