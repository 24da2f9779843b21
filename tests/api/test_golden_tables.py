"""Every pinned request still gets the same answer: status, ETag, media type and body bytes.

The table routes' plumbing (parameter models, canonical keys, encoders) can change freely as long as
what a client receives does not. tests/golden_requests.py says how the pins were made.
"""

import hashlib
import json

import pytest
from fastapi.testclient import TestClient

from posenc.service import __version__
from tests.golden_requests import ERROR_REQUESTS, GET_REQUESTS, GOLDEN_FILE, answer, post_requests

GOLDEN = json.loads(GOLDEN_FILE.read_text())


def test_pins_belong_to_this_version() -> None:
    # ETags and metadata name the service version: a new version re-records the pins on purpose.
    assert GOLDEN["version"] == __version__, "regenerate with: python -m tests.golden_requests"


@pytest.mark.parametrize("url", GET_REQUESTS)
def test_get_answers_unchanged(client: TestClient, url: str) -> None:
    assert answer(client, "GET", url) == GOLDEN["answers"][f"GET {url}"]


@pytest.mark.parametrize("url", ERROR_REQUESTS)
def test_error_answers_unchanged(client: TestClient, url: str) -> None:
    response = client.get(url)
    assert {"status": response.status_code, "body": response.json()} == GOLDEN["answers"][f"GET {url}"]


@pytest.mark.parametrize(("url", "body", "content_type"), post_requests())
def test_post_answers_unchanged(client: TestClient, url: str, body: bytes, content_type: str) -> None:
    key = f"POST {url} {hashlib.sha256(body).hexdigest()[:12]}"
    assert answer(client, "POST", url, body, content_type) == GOLDEN["answers"][key]
