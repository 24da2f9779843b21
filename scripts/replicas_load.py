"""Bounded mixed load against posenc replicas behind a load balancer; any failed request fails the run.

    python scripts/replicas_load.py http://127.0.0.1:18000 --seconds 40 --clients 6

Needs numpy (scripts/replicas-test.sh runs it with the repository's environment): the load is the test
kit's (`posenc.service.testing.LoadGenerator`), one keep-alive connection per client to the load balancer on loopback.
Each client sends, in turn, table requests (every family, several wire formats, one POST) and binary KServe
v2 inference requests on the shipped `rope_attention` model. A request fails when it raises (reset,
timeout), hangs past the run's bound, or answers anything but 200. The same request must also get the same
bytes every time, whichever replica answered (replicas agree). Prints a summary; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import urllib.parse
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's test kit

from posenc.service.testing import HttpRequest, LoadGenerator, Outcome, attention_inputs, kserve_request

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


def plan() -> list[HttpRequest]:
    """The cycle each client goes through: every table request, one inference after every two."""
    binary = kserve_request(attention_inputs(HEADS, HEADS, HEAD_DIM, 1, SEQ, seed=5), binary_output=True,
                            content_type=True)
    infer = HttpRequest("POST", "/v2/models/rope_attention/infer", binary.body, binary.headers, "infer")
    tables = [HttpRequest("GET", path, label="table") for path in TABLES]
    tables.append(HttpRequest("POST", FROM_CONFIG[0], FROM_CONFIG[1], {"Content-Type": "application/json"}, "table"))
    mixed: list[HttpRequest] = []
    for request in tables:  # one inference for every two table requests
        mixed.append(request)
        if len(mixed) % 3 == 2:
            mixed.append(infer)
    return mixed


class Tally:
    """Counts by kind, the failures, and the digests of every answer to each request (replicas must agree)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.bodies: dict[str, set[str]] = defaultdict(set)

    def observe(self, done: Outcome) -> None:
        request = done.request
        key = f"{request.method} {request.path}"
        self.counts[request.label] += 1
        if done.status != 200:
            answer = f"HTTP {done.status}: {(done.body or b'')[:200]!r}" if done.status else done.error
            self.failures.append(f"{key}: {answer}")
            self.counts["failed"] += 1
        else:
            self.bodies[key].add(hashlib.sha256(done.body or b"").hexdigest())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="the load balancer, e.g. http://127.0.0.1:18000")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args()
    parsed = urllib.parse.urlsplit(args.url)
    tally = Tally()
    load = LoadGenerator(parsed.port or 80, host=parsed.hostname or "127.0.0.1", connections=args.clients,
                         seconds=args.seconds, timeout=60, keep_bodies=True)
    result = load.run(plan(), tally.observe)
    disagree = {key: len(digests) for key, digests in tally.bodies.items() if len(digests) != 1}
    print(f"replicas-load: {tally.counts['table']} table and {tally.counts['infer']} inference requests, "
          f"{tally.counts['failed']} failed, {len(tally.bodies)} distinct requests, "
          f"{len(disagree)} with differing answers")
    for failure, n in Counter(tally.failures).most_common(10):
        print(f"  failed {n}x: {failure}")
    for key, n in disagree.items():
        print(f"  {n} different bodies for {key}")
    if result.hung:
        print(f"  {result.hung} request(s) still running at the end: a request hung")
    ok = not tally.failures and not disagree and tally.counts["infer"] > 0 and tally.counts["table"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
