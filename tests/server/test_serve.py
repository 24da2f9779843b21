"""`posenc serve` as a real server: a safetensors response parsed with nothing but JSON and struct."""

import json
import struct
import subprocess
import urllib.request

import numpy as np
import pytest

from posenc.models.sinusoidal import sinusoidal_table
from posenc.service.testing import free_port, serve_command, serve_env


def test_safetensors_header_is_plain_json(server: str) -> None:
    with urllib.request.urlopen(server + "/v1/sinusoidal?max_position=32&dim=16&variant=fairseq") as r:
        body = r.read()
        assert r.headers["Content-Type"] == "application/x-safetensors"
    (header_len,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8:8 + header_len].decode("utf-8"))
    start, end = header["pe"]["data_offsets"]
    assert header["pe"]["dtype"] == "F32" and header["pe"]["shape"] == [32, 16]
    values = struct.unpack(f"<{32 * 16}f", body[8 + header_len + start:8 + header_len + end])
    np.testing.assert_array_equal(np.array(values, dtype=np.float32).reshape(32, 16),
                                  sinusoidal_table(32, 16, "fairseq"))


def test_errors_over_the_wire(server: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server + "/v1/sinusoidal?max_position=0&dim=16")
    with info.value as error:  # an HTTPError holds the open response
        assert error.code == 422
        assert json.loads(error.read())["type"] == "invalid_parameter"


def test_bad_setting_fails_at_startup_naming_the_variable() -> None:
    proc = subprocess.run(serve_command("--port", str(free_port())), env=serve_env({"cache_bytes": "lots"}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "POSENC_CACHE_BYTES" in proc.stderr
