"""Real servers on loopback, where the protocol itself is under test: every test here is marked `server`."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.testing import ServerProcess
from tests.conftest import mark_folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent, pytest.mark.server)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The URL of a `posenc serve` with default settings (log level warning), live for the module."""
    with ServerProcess({"log_level": "warning"}, ready="/healthz", ready_timeout=60) as process:
        yield process.url
