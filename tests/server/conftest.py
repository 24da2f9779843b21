"""Real servers on loopback, where the protocol itself is under test: every test here is marked `server`
(FOLDER_MARKS in tests/conftest.py)."""

from collections.abc import Iterator

import pytest

from posenc.service.testing import ServerProcess


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The URL of a `posenc serve` with default settings (log level warning), live for the module."""
    with ServerProcess({"log_level": "warning"}, ready="/readyz", ready_timeout=60) as process:
        yield process.url
