"""The pytest plugin's in-process fixtures (posenc_settings, posenc_app, posenc_client, posenc_table), run in a
project of their own by pytester: registered by the installed entry point, settings per test by marker or by an
overridden fixture, and no fixture of this repository's own test suite shadowed. posenc_server: tests/server."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from posenc import pytest_plugin
from posenc.service.inference.runtime import sessions
from tests.conftest import assert_runs_in_fresh_python
from tests.onnx_models import ROOT

pytest_plugins = ["pytester"]

PLUGIN_FIXTURES = {"posenc_settings", "posenc_app", "posenc_client", "posenc_table", "posenc_server_settings",
                   "posenc_server"}

IN_PROCESS = '''
import numpy as np
import pytest

import posenc
from posenc.client import InvalidParameterError, PayloadTooLargeError

pytestmark = pytest.mark.posenc_settings(cache_bytes=12345, max_table_bytes=1 << 20)


def test_the_golden_table_in_one_call(posenc_table):
    rope = posenc_table("/v1/rope", max_position=6, head_dim=8)
    assert sorted(rope) == ["cos", "inv_freq", "sin"] and rope["cos"].shape == (6, 8)
    assert rope["cos"].dtype == np.float32 and rope.metadata["endpoint"] == "rope"
    same = posenc.table("/v1/rope", max_position=6, head_dim=8)
    assert all(np.array_equal(rope[name], same[name]) for name in rope)
    assert posenc_table("/v1/sinusoidal", max_position=3, dim=4, dtype="bfloat16")["pe"].dtype.name == "bfloat16"


def test_errors_are_the_services(posenc_table):
    with pytest.raises(InvalidParameterError) as info:
        posenc_table("/v1/sinusoidal", max_position=0, dim=4)
    assert info.value.status == 422 and info.value.type == "invalid_parameter"
    assert "max_position" in info.value.error


def test_the_module_marker_reaches_the_app(posenc_app, posenc_settings):
    assert posenc_app.state.process.settings is posenc_settings
    assert (posenc_settings.cache_bytes, posenc_settings.max_table_bytes) == (12345, 1 << 20)


@pytest.mark.posenc_settings(max_table_bytes=1024)
def test_the_nearest_marker_wins(posenc_table, posenc_settings):
    assert (posenc_settings.cache_bytes, posenc_settings.max_table_bytes) == (12345, 1024)
    with pytest.raises(PayloadTooLargeError, match="1024"):
        posenc_table("/v1/rope", max_position=64, head_dim=64)


def test_the_client_runs_the_lifespan(posenc_client):
    assert posenc_client.get("/readyz").status_code == 200
    answer = posenc_client.get("/v1/alibi/slopes", params={"num_heads": 4, "format": "json"})
    assert answer.json()["tensors"]["slopes"]["data"] == [0.25, 0.0625, 0.015625, 0.00390625]
'''


def test_the_entry_point_names_the_plugin() -> None:
    from importlib.metadata import entry_points

    (point,) = [p for p in entry_points(group="pytest11") if p.name == "posenc"]
    assert point.load() is pytest_plugin


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    code = ("import sys, posenc.pytest_plugin\n"
            "loaded = {'numpy', 'fastapi', 'httpx2', 'pydantic'} & set(sys.modules)\n"
            "assert not loaded, loaded\n")
    assert_runs_in_fresh_python(code)


def test_the_in_process_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_golden=IN_PROCESS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=5)


def test_a_conftest_overrides_the_settings(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
import posenc, pytest

@pytest.fixture
def posenc_settings():
    return posenc.Settings(max_table_bytes=100)
''')
    pytester.makepyfile(test_override='''
import pytest
from posenc.client import PayloadTooLargeError

def test_settings_of_the_folder(posenc_table):
    with pytest.raises(PayloadTooLargeError):
        posenc_table("/v1/alibi/slopes", num_heads=64)
''')
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


GRAPH_CHOICE = '''
import pytest


def test_by_default_the_graphs_follow_config_json(posenc_settings):
    assert posenc_settings.cpu_form_from == "config"


@pytest.mark.posenc_settings(cpu_form_from="calibrate")
def test_a_marker_asks_for_the_calibration(posenc_settings):
    assert posenc_settings.cpu_form_from == "calibrate"
'''


@pytest.mark.parametrize(("environment", "default"), [(None, "config"), ("never", "never"), ("calibrate", "calibrate")])
def test_the_fixtures_pick_the_graphs_by_config_json_unless_told(pytester: pytest.Pytester,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                environment: str | None, default: str) -> None:
    """No calibration at the fixtures' start-up (seconds per model on a fresh machine): config.json's rule, unless
    POSENC_CPU_FORM_FROM or a marker says otherwise."""
    monkeypatch.delenv("POSENC_CPU_FORM_FROM", raising=False)
    if environment is not None:
        monkeypatch.setenv("POSENC_CPU_FORM_FROM", environment)
    pytester.makepyfile(test_graphs=GRAPH_CHOICE.replace('== "config"', f'== "{default}"'))
    pytester.runpytest("-p", "no:cacheprovider", "--strict-markers").assert_outcomes(passed=2)
    assert pytest_plugin.fixture_defaults() == ({"cpu_form_from": "config"} if environment is None else {})


SHARED_SESSIONS = '''
SEEN = []


def test_one_app(posenc_client):
    SEEN.append(posenc_client.app.state.process.engine.models["rope_attention"].session)


def test_another_app_with_the_same_sessions(posenc_client):
    assert posenc_client.app.state.process.engine.models["rope_attention"].session is SEEN[0]
'''


def test_the_apps_of_a_session_share_their_onnxruntime_sessions(pytester: pytest.Pytester) -> None:
    sessions.stop_sharing()  # (this suite's conftest shares them for its own apps)
    try:
        pytester.makepyfile(test_shared=SHARED_SESSIONS)
        pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)
    finally:
        sessions.share_sessions()


def test_a_marker_with_positional_arguments_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad='''
import pytest

@pytest.mark.posenc_settings({"cache_bytes": 0})
def test_it(posenc_app):
    pass
''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*takes Settings fields by name*"])


def test_the_plugin_can_be_turned_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_off="def test_it(posenc_table):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:posenc")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'posenc_table' not found*"])


def _fixtures_defined_in(path: Path) -> set[str]:
    """Names of the functions decorated with pytest.fixture in a module (its own name, not `name=` aliases)."""
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and any("fixture" in ast.unparse(d) for d in node.decorator_list)}


def test_the_plugin_shadows_no_fixture_of_this_repository() -> None:
    assert _fixtures_defined_in(Path(pytest_plugin.__file__)) == PLUGIN_FIXTURES
    ours = set().union(*(_fixtures_defined_in(path) for path in (ROOT / "tests").rglob("*.py")))
    assert "client" in ours and "server" in ours  # the scan finds this suite's fixtures
    assert not ours & PLUGIN_FIXTURES
