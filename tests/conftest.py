from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


def make_client(**overrides: object) -> TestClient:
    return TestClient(create_app(Settings(**overrides)))  # type: ignore[arg-type]


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client() as c:
        yield c
