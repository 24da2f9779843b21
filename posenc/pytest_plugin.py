"""posenc's pytest plugin: fixtures for a project that tests its own code against posenc. pytest loads it
wherever posenc is installed (entry point `pytest11`, name `posenc`; `-p no:posenc` turns it off).

* `posenc_settings`: the `Settings` of this test's app: the defaults (POSENC_* variables included), then the
  fields of every `@pytest.mark.posenc_settings(**fields)` on the test, its class and its module, the nearest
  winning. Override the fixture in a conftest.py for settings of a whole folder.
* `posenc_app`: `posenc.create_app(posenc_settings)`, a fresh app per test.
* `posenc_client`: FastAPI's TestClient on `posenc_app`, its lifespan run (models loaded, /readyz 200).
* `posenc_table(endpoint, **params) -> dict[str, np.ndarray]`: golden arrays in one call, answered by
  `posenc_app` in-process (`posenc.table` on the test's app: same parameters, same arrays, same errors).
* `posenc_server_settings` (session): the settings of the live server, as field names → values (default:
  log level warning); override it in a conftest.py.
* `posenc_server` (session): `posenc serve` in a subprocess on a free loopback port, ready when /readyz answers,
  for a client under test that runs as its own process: `.url`, `.host`, `.port`, `.address` (host:port),
  `.log()`, `.stop()` (also at the end of the session). One per session (per xdist worker).

Each test gets a fresh app, but the apps of a session share their models' onnxruntime sessions (one per model
file, session options and providers: `posenc.service.inference.runtime.sessions`), so a fresh app costs no model
loading.
The fixtures' apps and server pick each model's CPU graph by config.json's rule (`cpu_form_from=config`,
`FIXTURE_DEFAULTS`) instead of measuring the graphs at start-up, unless POSENC_CPU_FORM_FROM, a marker or
posenc_server_settings says otherwise.

Nothing is imported here until a fixture runs (hence this module lives outside the test kit's package, whose
import loads numpy): a project that does not use posenc pays nothing for the plugin. The in-process fixtures need
httpx2 (the `client` extra); posenc_server needs nothing more than posenc, and runs the test kit's ServerProcess.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fastapi.testclient import TestClient
    from starlette.types import ASGIApp

    from posenc.service.client import Table
    from posenc.service.settings import Settings
    from posenc.service.testing.server import ServerProcess

SETTINGS_MARKER = "posenc_settings"
DEFAULT_SERVER_SETTINGS: Mapping[str, object] = {"log_level": "warning"}
# What the fixtures' apps and server change from posenc's defaults, unless a POSENC_* variable, a marker or
# posenc_server_settings names the field: each model's CPU graph by config.json's rule rather than a timing of
# the graphs at start-up, so that every run of a suite picks the same graphs on any machine, and a fresh machine
# (a CI runner, with no calibration cache) does not spend seconds per model measuring them before the first test.
FIXTURE_DEFAULTS: Mapping[str, object] = {"cpu_form_from": "config"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{SETTINGS_MARKER}(**fields): posenc Settings fields for this test's "
                                       "posenc_app (posenc_client, posenc_table), e.g. cache_bytes=0")


def fixture_defaults() -> dict[str, object]:
    """`FIXTURE_DEFAULTS` less the fields the environment sets (POSENC_<FIELD>, in any case, as Settings reads it)."""
    from posenc.service.testing.server import setting_variable

    environment = {name.upper() for name in os.environ}
    return {field: value for field, value in FIXTURE_DEFAULTS.items() if setting_variable(field) not in environment}


def marked_settings(node: pytest.Item) -> dict[str, Any]:
    """The fields of the `posenc_settings` markers on `node` (module, class, function: the nearest wins)."""
    fields: dict[str, Any] = {}
    for marker in reversed(list(node.iter_markers(SETTINGS_MARKER))):  # iter_markers: the nearest first
        if marker.args:
            raise pytest.UsageError(f"@pytest.mark.{SETTINGS_MARKER} takes Settings fields by name "
                                    f"(e.g. cache_bytes=0), not {marker.args!r}")
        fields.update(marker.kwargs)
    return fields


@pytest.fixture
def posenc_settings(request: pytest.FixtureRequest) -> Settings:
    """The defaults (and `fixture_defaults`) with the fields of this test's `posenc_settings` markers."""
    import posenc

    return posenc.Settings(**{**fixture_defaults(), **marked_settings(request.node)})


@pytest.fixture
def posenc_app(posenc_settings: Settings) -> ASGIApp:
    """The service as an ASGI app (through the public API, as a project's own conftest would build it); its models'
    onnxruntime sessions shared with the other apps of the session (`share_sessions`)."""
    import posenc
    from posenc.service.inference.runtime.sessions import share_sessions

    share_sessions()
    return posenc.create_app(posenc_settings)


@pytest.fixture
def posenc_client(posenc_app: ASGIApp) -> Iterator[TestClient]:
    """A TestClient on `posenc_app` with the lifespan run."""
    try:
        from fastapi.testclient import TestClient
    except ImportError:
        raise pytest.UsageError("posenc_client needs httpx2: pip install 'posenc[client]'") from None
    with TestClient(posenc_app) as client:
        yield client


@pytest.fixture
def posenc_table(posenc_app: ASGIApp) -> Callable[..., Table]:
    """`posenc_table(endpoint, *, body=None, **params)`: the table's tensors by name, read-only numpy arrays."""
    from posenc.service.http.in_process import app_client

    client = app_client(posenc_app)
    return client.table


@pytest.fixture(scope="session")
def posenc_server_settings() -> Mapping[str, object]:
    """Settings of the session's live server: Settings field names (or POSENC_* names) → values."""
    return DEFAULT_SERVER_SETTINGS


@pytest.fixture(scope="session")
def posenc_server(posenc_server_settings: Mapping[str, object]) -> Iterator[ServerProcess]:
    """A live `posenc serve` on a free loopback port for the session; stopped (SIGTERM, then SIGKILL) at its end."""
    from posenc.service.testing.server import ServerProcess

    settings = {**fixture_defaults(), **posenc_server_settings}
    with ServerProcess(settings, ready="/readyz", ready_timeout=120) as server:
        yield server
