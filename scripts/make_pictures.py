"""Regenerate the pictures in docs/img/ from the service's own `format=png` (no server needed).

    .venv/bin/python scripts/make_pictures.py          # from the repository root

Each picture is exactly what `GET <url>&format=png` answers (the same path as `posenc table ... --format
png`); README.md and the docs pages show them.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from posenc.models.sinusoidal import sinusoidal_table  # noqa: E402
from posenc.service.cli.table import answer, parse_request  # noqa: E402
from posenc.service.settings import Settings  # noqa: E402

PICTURES = {
    "rope-table.png": "/v1/rope?max_position=256&head_dim=64&tensor=cos",
    "rope-properties.png": "/v1/properties/rope?max_position=16384&head_dim=128&rope_theta=500000&rope_type=llama3"
                           "&factor=8&low_freq_factor=1&high_freq_factor=4&original_max_position_embeddings=8192"
                           "&dtype=bfloat16",
    "sinusoidal-properties.png": "/v1/properties/sinusoidal?max_position=2048&dim=128&dtype=float16",
    "alibi-properties.png": "/v1/properties/alibi?num_heads=8&query_length=1&key_length=512",
    "t5-properties.png": "/v1/properties/t5?query_length=1&key_length=300&offset=150",
    "learned-properties.png": "/v1/properties/learned",
}


def learned_example() -> bytes:
    """A stand-in for a learned table: the sinusoidal table [512, 64] plus noise (no weights downloaded)."""
    rng = np.random.default_rng(0)
    table = sinusoidal_table(512, 64, dtype=np.float64) + rng.normal(0.0, 0.15, (512, 64))
    buffer = io.BytesIO()
    np.save(buffer, table.astype(np.float32), allow_pickle=False)
    return buffer.getvalue()


def main() -> int:
    out = ROOT / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    for name, url in PICTURES.items():
        route, values = parse_request(urlsplit(url).path, [])
        values = dict(parse_qsl(urlsplit(url).query))
        tensor = values.pop("tensor", None)
        body = (learned_example(), "application/x-npy") if route.query.body is not None else None
        (out / name).write_bytes(answer(route, values, "png", tensor, body, Settings()))
        print(f"docs/img/{name}  <-  {url}&format=png")
    import make_audit_pictures  # the audit's worked examples (docs/audit.md), from files it writes

    return make_audit_pictures.main()


if __name__ == "__main__":
    sys.exit(main())
