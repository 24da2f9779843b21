"""A config.json with thousands of layer types, each with a RoPE of its own (transformers 5's per-layer-type
rope_parameters, `layer_types` listing them), audited by POST /v1/audit and by `posenc audit`: refused with a 400
(exit status 2) naming MAX_LAYER_TYPES before any layer type is resolved, so the work is the parse, linear in the
file. Each resolution reads the whole rope dict: resolved one by one, 1,000 layer types cost 8.6 s of server CPU
and 10,000 more than 80 s (with a quadratic step left, 14 s).

The work is shown by counts (resolutions made) and by CPU seconds from /proc and getrusage against a bound in
proportion to the file's size, never by wall time."""

from __future__ import annotations

import http.client
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from posenc.models.audit import reference as reference_module
from posenc.service.audit import config_reader
from posenc.service.audit.run import reference
from posenc.service.audit_limits import MAX_LAYER_TYPES
from posenc.service.errors import BadRequest
from posenc.service.testing import ServerProcess, layered_config

# CPU a refusal may take: a fixed part (a request's or a command's start) and a part per MiB of the file (its parse)
FIXED_CPU_SECONDS, CPU_SECONDS_PER_MIB = 1.0, 2.0


def cpu_bound(size: int) -> float:
    return FIXED_CPU_SECONDS + CPU_SECONDS_PER_MIB * size / (1 << 20)


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The layer types resolved (`rope_parameters_from_config` calls), by the file's reader and by the reference."""
    calls: list[str | None] = []

    def counting(resolve: Callable[..., Any]) -> Callable[..., Any]:
        def counted(config: Any, **kwargs: Any) -> Any:
            calls.append(kwargs.get("layer_type"))
            return resolve(config, **kwargs)
        return counted

    for module in (config_reader, reference_module):
        monkeypatch.setattr(module, "rope_parameters_from_config", counting(module.rope_parameters_from_config))
    return calls


@pytest.mark.parametrize("types", [1_000, 10_000])
def test_a_config_with_too_many_layer_types_resolves_none(types: int, resolutions: list[str | None]) -> None:
    body = json.dumps(layered_config(types)).encode()
    with pytest.raises(BadRequest, match=f"{types} layer types.*at most {MAX_LAYER_TYPES}"):
        config_reader.document_found(body)
    with pytest.raises(BadRequest, match=f"the given config.json: .*{types} layer types"):
        reference(config_reader.document_found(json.dumps(layered_config(2)).encode()), None,
                  config_reader.parse(body))
    assert resolutions == ["type_00000", "type_00001"]  # the small file's own two: none of the large one's


@pytest.mark.parametrize("types", [1, 2, MAX_LAYER_TYPES])
def test_each_layer_type_is_resolved_once(types: int, resolutions: list[str | None]) -> None:
    config = layered_config(types)
    found = config_reader.document_found(json.dumps(config).encode())
    assert sorted(found.layers) == sorted(config["layer_types"])
    assert len(resolutions) == types  # the file's reader: one resolution per layer type
    ref = reference(found, None, config)
    assert [layer.layer_type for layer in ref.layers] == sorted(config["layer_types"])
    assert len(resolutions) == 2 * types  # and the reference's: one more per layer type


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess({"log_level": "warning"}, ready="/readyz", ready_timeout=60) as process:
        yield process


@pytest.mark.timeout(120)
@pytest.mark.parametrize("types", [1_000, 10_000])
def test_the_server_refuses_them_for_cpu_linear_in_the_file(server: ServerProcess, types: int) -> None:
    body = json.dumps(layered_config(types)).encode()  # 69 kB, 690 kB
    before = process_cpu(server.pid)
    # a server that resolved them would answer after a minute or more: the socket's timeout ends the test first
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    connection.request("POST", "/v1/audit", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    document = json.loads(response.read())
    connection.close()
    spent = process_cpu(server.pid) - before
    assert response.status == 400, document
    assert f"{types} layer types" in document["error"] and f"at most {MAX_LAYER_TYPES}" in document["error"]
    assert spent <= cpu_bound(len(body)), f"{spent:.2f} s of server CPU for {len(body)} bytes"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("types", [1_000, 10_000])
@pytest.mark.parametrize("as_reference", [False, True], ids=["file", "reference"])
def test_posenc_audit_refuses_them_for_cpu_linear_in_the_file(tmp_path: Path, types: int, as_reference: bool) -> None:
    large = tmp_path / "config.json"
    large.write_text(json.dumps(layered_config(types)))
    small = tmp_path / "small.json"
    small.write_text(json.dumps(layered_config(2)))
    args = [str(small), "--config", str(large)] if as_reference else [str(large)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "posenc.service.cli", "audit", *args], capture_output=True,
                          text=True, timeout=100)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert done.returncode == 2, done.stdout[-500:] + done.stderr[-500:]
    assert done.stderr.count("\n") == 1 and f"{types} layer types" in done.stderr
    assert f"at most {MAX_LAYER_TYPES}" in done.stderr
    assert spent <= cpu_bound(large.stat().st_size), f"{spent:.2f} s of CPU for {large.stat().st_size} bytes"
