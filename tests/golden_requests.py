"""Requests whose answers (status, ETag, body hash) are pinned in tests/data/golden_tables.json.

The pinned answers were recorded from the service and only change on purpose: a new version (the
ETag and the metadata name it), or a deliberate change of a table. Regenerate with
`python -m tests.golden_requests` and review the diff.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

GOLDEN_FILE = Path(__file__).parent / "data" / "golden_tables.json"

GET_REQUESTS = [
    "/v1/rope?max_position=16&head_dim=64",
    "/v1/rope?max_position=16&head_dim=64&format=npy&tensor=cos",
    "/v1/rope?max_position=16&head_dim=64&format=raw&tensor=sin",
    "/v1/rope?max_position=4&head_dim=16&format=json",
    "/v1/rope?max_position=8&head_dim=64&offset=100&layout=interleaved&dtype=bfloat16",
    "/v1/rope?max_position=8&head_dim=64&form=half&dtype=float16",
    "/v1/rope?max_position=8&head_dim=64&form=half&layout=interleaved",
    "/v1/rope?max_position=8&head_dim=80&partial_rotary_factor=0.4",
    "/v1/rope?max_position=8&head_dim=64&rotary_dim=32",
    "/v1/rope?max_position=8&head_dim=64&rope_type=linear&factor=4",
    "/v1/rope?max_position=8&head_dim=64&rope_type=dynamic&factor=2&max_position_embeddings=4",
    "/v1/rope?max_position=8&head_dim=128&rope_type=yarn&factor=4&original_max_position_embeddings=4096",
    "/v1/rope?max_position=8&head_dim=128&rope_type=yarn&factor=4&original_max_position_embeddings=4096"
    "&truncate=false&beta_fast=16&beta_slow=2",
    "/v1/rope?max_position=8&head_dim=64&rope_type=yarn&factor=40&original_max_position_embeddings=4096"
    "&mscale=1&mscale_all_dim=1",
    "/v1/rope?max_position=8&head_dim=64&rope_type=yarn&max_position_embeddings=16384"
    "&original_max_position_embeddings=4096&attention_factor=1.5",
    "/v1/rope?max_position=8&head_dim=128&rope_theta=500000&rope_type=llama3&factor=8&low_freq_factor=1"
    "&high_freq_factor=4&original_max_position_embeddings=8192",
    # low_freq_factor = high_freq_factor (Llama 4's 1 and 1): no smoothing band, as transformers computes it
    "/v1/rope?max_position=8&head_dim=64&rope_type=llama3&factor=8&low_freq_factor=2&high_freq_factor=2"
    "&original_max_position_embeddings=8192",
    "/v1/rope?max_position=8&head_dim=8&rope_type=longrope&short_factor=1,1.5,2,2.5&long_factor=2,3,4,5"
    "&original_max_position_embeddings=4&max_position_embeddings=16",
    "/v1/rope?max_position=8&head_dim=8&rope_type=longrope&short_factor=1,1.5,2,2.5&long_factor=2,3,4,5"
    "&original_max_position_embeddings=4&factor=4&attention_factor=1.25&offset=2",
    "/v1/rope?max_position=8&head_dim=256&partial_rotary_factor=0.25&rope_theta=1000000&rope_type=proportional",
    "/v1/rope?max_position=8&head_dim=256&partial_rotary_factor=0.25&rope_type=proportional&factor=2",
    "/v1/sinusoidal?max_position=16&dim=8",
    "/v1/sinusoidal?max_position=16&dim=9&variant=tensor2tensor&base=500",
    "/v1/sinusoidal?max_position=16&dim=8&variant=fairseq",
    "/v1/sinusoidal?max_position=16&dim=8&variant=fairseq&padding_idx=3&offset=2",
    "/v1/sinusoidal?max_position=16&dim=7&variant=marian&dtype=float64&format=npy",
    "/v1/sinusoidal?max_position=4&dim=4&format=json",
    # 256 frequencies from pow / exp: numpy's AVX-512 float64 pow and exp differ from the baseline's in the last bit
    "/v1/sinusoidal?max_position=64&dim=512&dtype=float64&format=npy",
    "/v1/sinusoidal?max_position=64&dim=512&variant=tensor2tensor&dtype=float64&format=npy",
    "/v1/sinusoidal?max_position=4096&dim=512&variant=fairseq",
    "/v1/alibi/slopes?num_heads=12",
    "/v1/alibi/slopes?num_heads=12&alibi_bias_max=16&dtype=float64&format=raw",
    "/v1/alibi/bias?num_heads=5&query_length=3&key_length=7",
    "/v1/alibi/bias?num_heads=4&query_length=8&key_length=4",
    "/v1/alibi/bias?num_heads=5&query_length=3&key_length=7&mode=symmetric&mask=true",
    "/v1/alibi/bias?num_heads=4&query_length=2&key_length=6&mode=bloom&dtype=bfloat16",
    "/v1/alibi/bias?num_heads=4&query_length=2&key_length=6&mode=mpt&mask=true&format=json",
    "/v1/t5/buckets?query_length=9&key_length=200",
    "/v1/t5/buckets?query_length=9&key_length=200&bidirectional=false&num_buckets=16&max_distance=64"
    "&offset=5&dtype=int32",
    "/v1/deberta/buckets?query_length=20&key_length=700",
    "/v1/deberta/buckets?query_length=20&key_length=70&position_buckets=32&max_relative_positions=64&format=npy",
    "/v1/relative/clipped?query_length=5&key_length=9&max_relative_position=3",
    "/v1/relative/clipped?query_length=5&key_length=9&max_relative_position=0&dtype=int32&format=json",
]

# Error answers are pinned verbatim: their messages are part of the contract.
ERROR_REQUESTS = [
    "/v1/rope?head_dim=64",
    "/v1/rope?max_position=8&head_dim=1",
    "/v1/rope?max_position=8&head_dim=64&rope_type=bogus",
    "/v1/rope?max_position=8&head_dim=64&rotary_dim=33",
    "/v1/rope?max_position=8&head_dim=64&rope_type=linear&factor=0.5",
    "/v1/rope?max_position=8&head_dim=64&rope_type=linear",
    "/v1/rope?max_position=8&head_dim=64&rope_type=llama3",
    "/v1/rope?max_position=8&head_dim=64&rope_type=yarn",
    "/v1/rope?max_position=8&head_dim=64&rope_type=longrope&max_position_embeddings=64",
    "/v1/rope?max_position=8&head_dim=8&rope_type=longrope&short_factor=1,x&long_factor=1,2,3,4"
    "&original_max_position_embeddings=4",
    # llama3, low_freq_factor = high_freq_factor: 0 / 0 at a wavelength of exactly original / low (transformers: NaN)
    "/v1/rope?max_position=8&head_dim=2&rope_type=llama3&factor=8&low_freq_factor=0.15915494309189535"
    "&high_freq_factor=0.15915494309189535&original_max_position_embeddings=1",
    "/v1/rope?max_position=8&head_dim=4&rope_type=dynamic&factor=2&max_position_embeddings=4&rotary_dim=2",
    "/v1/rope?max_position=8&head_dim=64&format=npy",
    "/v1/rope?max_position=8&head_dim=64&format=xml",
    "/v1/rope?max_position=8&head_dim=64&format=npy&tensor=tan",
    "/v1/rope?max_position=8&head_dim=64&format=npy&tensor=cos&dtype=bfloat16",
    "/v1/rope?max_position=2147483648&head_dim=65536",
    "/v1/rope?max_position=100000&head_dim=1024&format=json&tensor=cos",
    "/v1/sinusoidal?max_position=8&dim=3&variant=fairseq",
    "/v1/sinusoidal?max_position=8&dim=8&variant=sine",
    "/v1/alibi/slopes?num_heads=0",
    "/v1/alibi/bias?num_heads=4&query_length=2&key_length=4&mode=flat",
    "/v1/t5/buckets?query_length=2&key_length=4&num_buckets=2",
    "/v1/t5/buckets?query_length=2&key_length=4&max_distance=4",
    "/v1/deberta/buckets?query_length=2&key_length=4&position_buckets=256&max_relative_positions=100",
    "/v1/relative/clipped?query_length=2&key_length=4",
]

LLAMA_CONFIG = {
    "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}
GEMMA_CONFIG = {
    "head_dim": 256, "max_position_embeddings": 8192, "layer_types": ["sliding_attention", "full_attention"],
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                                           "partial_rotary_factor": 0.25}},
}


def _t5_weight() -> bytes:
    weight = (np.arange(32 * 3, dtype=np.float32).reshape(32, 3) - 40.0) / 7.0  # [num_buckets, heads]
    buffer = io.BytesIO()
    np.save(buffer, weight)
    return buffer.getvalue()


def post_requests() -> list[tuple[str, bytes, str]]:
    """(url, body, content type) of the pinned POST requests."""
    return [
        ("/v1/rope/from-config?max_position=8", json.dumps(LLAMA_CONFIG).encode(), "application/json"),
        ("/v1/rope/from-config?max_position=8&format=npy&tensor=inv_freq", json.dumps(LLAMA_CONFIG).encode(),
         "application/json"),
        ("/v1/rope/from-config?max_position=4&layer_type=full_attention", json.dumps(GEMMA_CONFIG).encode(),
         "application/json"),
        ("/v1/rope/from-config", json.dumps({"head_dim": 8, "max_position_embeddings": 6}).encode(),
         "application/json"),
        ("/v1/t5/bias?query_length=4&key_length=6", _t5_weight(), "application/x-npy"),
        ("/v1/t5/bias?query_length=4&key_length=6&bidirectional=false&dtype=float16&format=raw", _t5_weight(),
         "application/octet-stream"),
    ]


def answer(client: Any, method: str, url: str, body: bytes = b"", content_type: str | None = None) -> dict[str, Any]:
    """What is pinned of one answer: status, ETag, media type, body length and SHA-256."""
    if method == "GET":
        response = client.get(url)
    else:
        response = client.post(url, content=body, headers={"Content-Type": content_type or ""})
    return {"status": response.status_code, "etag": response.headers.get("etag"),
            "content_type": response.headers.get("content-type"), "length": len(response.content),
            "sha256": hashlib.sha256(response.content).hexdigest()}


def record(client: Any) -> dict[str, Any]:
    from posenc.service import __version__

    answers = {f"GET {url}": answer(client, "GET", url) for url in GET_REQUESTS}
    for url in ERROR_REQUESTS:
        response = client.get(url)
        answers[f"GET {url}"] = {"status": response.status_code, "body": response.json()}
    answers.update({f"POST {url} {hashlib.sha256(body).hexdigest()[:12]}": answer(client, "POST", url, body, ctype)
                    for url, body, ctype in post_requests()})
    return {"version": __version__, "answers": answers}


if __name__ == "__main__":
    from fastapi.testclient import TestClient

    from posenc.service.http.app import create_app
    from posenc.service.settings import Settings

    with TestClient(create_app(Settings(access_log=False))) as test_client:
        GOLDEN_FILE.write_text(json.dumps(record(test_client), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN_FILE}")
