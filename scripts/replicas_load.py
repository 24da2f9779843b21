"""Bounded mixed load against posenc replicas behind a load balancer; any failed request fails the run.

    python3 scripts/replicas_load.py http://127.0.0.1:18000 --seconds 40 --clients 6

Standard library only (it runs on the host of scripts/replicas-test.sh). Each client thread keeps one
connection to the load balancer and sends, in turn, table requests (every family, several wire formats,
one POST) and binary KServe v2 inference requests on the shipped `rope_attention` model. A request fails
when it raises (reset, timeout) or answers anything but 200. The same request must also get the same bytes
every time, whichever replica answered (replicas agree). Prints a summary; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import random
import struct
import sys
import threading
import time
import urllib.parse
from collections import Counter, defaultdict

TABLES = [
    "/v1/rope?max_position=256&head_dim=64",
    "/v1/rope?max_position=64&head_dim=128&rope_type=yarn&factor=4&original_max_position_embeddings=4096&format=npy"
    "&tensor=cos",
    "/v1/sinusoidal?max_position=128&dim=64&format=raw",
    "/v1/alibi/slopes?num_heads=12&format=json",
    "/v1/alibi/bias?num_heads=8&query_length=32&key_length=32",
    "/v1/t5/buckets?query_length=32&key_length=32&format=raw",
    "/v1/deberta/buckets?query_length=16&key_length=16&format=npy",
    "/v1/relative/clipped?query_length=16&key_length=16&max_relative_position=4",
]
FROM_CONFIG = ("/v1/rope/from-config?max_position=32",
               json.dumps({"head_dim": 64, "max_position_embeddings": 4096, "rope_theta": 500000.0}).encode())
SEQ, HEADS, HEAD_DIM = 8, 8, 64


def infer_request() -> tuple[bytes, int]:
    """A binary KServe v2 request for rope_attention: B=1, H=8, S=8, D=64 (fixed seed), header length."""
    rng = random.Random(5)
    count = HEADS * SEQ * HEAD_DIM
    tensors = [struct.pack(f"<{count}f", *(rng.uniform(-1, 1) for _ in range(count))) for _ in range(3)]
    tensors.append(struct.pack(f"<{SEQ}q", *range(SEQ)))
    shape = [1, HEADS, SEQ, HEAD_DIM]
    inputs = [{"name": name, "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": len(t)}}
              for name, t in zip(("query", "key", "value"), tensors, strict=False)]
    inputs.append({"name": "position_ids", "shape": [1, SEQ], "datatype": "INT64",
                   "parameters": {"binary_data_size": len(tensors[3])}})
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(tensors), len(header)


class Load:
    def __init__(self, url: str, seconds: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.until = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.bodies: dict[str, set[str]] = defaultdict(set)
        self.infer_body, self.infer_header = infer_request()

    def requests(self) -> list[tuple[str, str, bytes, dict[str, str]]]:
        """The cycle each client goes through: every table request, one inference after every two."""
        infer = ("POST", "/v2/models/rope_attention/infer", self.infer_body,
                 {"Content-Type": "application/octet-stream",
                  "Inference-Header-Content-Length": str(self.infer_header)})
        table_requests: list[tuple[str, str, bytes, dict[str, str]]] = [("GET", path, b"", {}) for path in TABLES]
        table_requests.append(("POST", FROM_CONFIG[0], FROM_CONFIG[1], {"Content-Type": "application/json"}))
        mixed = []
        for request in table_requests:  # one inference for every two table requests
            mixed.append(request)
            if len(mixed) % 3 == 2:
                mixed.append(infer)
        return mixed

    def client(self, index: int) -> None:
        plan = self.requests()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        step = index
        while time.monotonic() < self.until:
            method, path, body, headers = plan[step % len(plan)]
            step += 1
            kind = "infer" if path.startswith("/v2/") else "table"
            try:
                connection.request(method, path, body=body or None, headers=headers)
                response = connection.getresponse()
                answer = response.read()
                status = response.status
            except (OSError, http.client.HTTPException) as exc:
                connection.close()  # a new connection for the next request
                connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
                self.record(kind, f"{method} {path}: {type(exc).__name__}: {exc}")
                continue
            if status != 200:
                self.record(kind, f"{method} {path}: HTTP {status}: {answer[:200]!r}")
                continue
            self.record(kind, None, f"{method} {path}", hashlib.sha256(answer).hexdigest())
        connection.close()

    def record(self, kind: str, failure: str | None, key: str = "", digest: str = "") -> None:
        with self.lock:
            self.counts[kind] += 1
            if failure is not None:
                self.failures.append(failure)
                self.counts["failed"] += 1
            else:
                self.bodies[key].add(digest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="the load balancer, e.g. http://127.0.0.1:18000")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args()
    load = Load(args.url, args.seconds)
    threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.seconds + 120)
    disagree = {key: len(digests) for key, digests in load.bodies.items() if len(digests) != 1}
    print(f"replicas-load: {load.counts['table']} table and {load.counts['infer']} inference requests, "
          f"{load.counts['failed']} failed, {len(load.bodies)} distinct requests, "
          f"{len(disagree)} with differing answers")
    for failure, n in Counter(load.failures).most_common(10):
        print(f"  failed {n}x: {failure}")
    for key, n in disagree.items():
        print(f"  {n} different bodies for {key}")
    alive = [t for t in threads if t.is_alive()]
    if alive:
        print(f"  {len(alive)} client(s) still running: a request hung")
    ok = not load.failures and not disagree and not alive and load.counts["infer"] > 0 and load.counts["table"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
