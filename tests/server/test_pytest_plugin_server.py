"""The pytest plugin's posenc_server, run in a project of its own by pytester: one live server per session on a
free loopback port, its settings from an overridable fixture, a client under test run as a subprocess against
its URL, and the server gone when the session ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.processes import running

pytest_plugins = ["pytester"]

SESSION = '''
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SEEN = Path(os.environ["SEEN_FILE"])

# A client under test that runs as its own process: it only knows the URL.
CLIENT = """
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/v1/alibi/slopes?num_heads=4&format=json") as answer:
    print(json.dumps(json.load(answer)["tensors"]["slopes"]["data"]))
"""


@pytest.mark.parametrize("turn", [1, 2])
def test_one_server_for_the_session(posenc_server, turn):
    assert posenc_server.url == f"http://{posenc_server.host}:{posenc_server.port}"
    assert posenc_server.address == f"{posenc_server.host}:{posenc_server.port}"
    with SEEN.open("a") as seen:
        seen.write(f"{posenc_server.pid} {posenc_server.port}\\n")


def test_a_subprocess_client_against_the_server(posenc_server, posenc_table):
    run = subprocess.run([sys.executable, "-c", CLIENT, posenc_server.url], capture_output=True, text=True,
                         timeout=60, check=True)
    np.testing.assert_array_equal(np.array(json.loads(run.stdout), np.float32),
                                  posenc_table("/v1/alibi/slopes", num_heads=4)["slopes"])


def test_the_servers_settings_come_from_the_fixture(posenc_server):
    from posenc.client import Client, PayloadTooLargeError

    assert posenc_server.env["POSENC_CPU_FORM_FROM"] == "config"  # the plugin's, beside the conftest's settings

    with Client(posenc_server.url) as client, pytest.raises(PayloadTooLargeError, match="2048"):
        client.rope(max_position=64, head_dim=64)
'''

CONFTEST = '''
import pytest

@pytest.fixture(scope="session")
def posenc_server_settings():
    return {"max_table_bytes": 2048, "log_level": "warning"}
'''


def test_posenc_server(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = tmp_path / "seen.txt"
    monkeypatch.setenv("SEEN_FILE", str(seen))
    monkeypatch.delenv("POSENC_CPU_FORM_FROM", raising=False)  # (this suite's conftest sets it for its own servers)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_session=SESSION)
    result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=4)
    servers = {tuple(map(int, line.split())) for line in seen.read_text().splitlines()}
    assert len(servers) == 1, servers  # both tests saw the same process on the same port
    ((pid, _port),) = servers
    assert not running(pid), "the session's server still runs after the session"
