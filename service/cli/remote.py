"""A POST to a running posenc service from a CLI command (`--remote URL`): the answer's bytes, or one error
that names the service's message and status, or that the service could not be reached."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class RemoteError(Exception):
    """What went wrong, for the command to print (prefixed with its name)."""


def post(url: str, body: bytes, content_type: str, timeout: float = 300) -> bytes:
    """POST `body` to `url`; the response body, or a RemoteError carrying the service's error message."""
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data: bytes = response.read()
            return data
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise RemoteError(f"{message} (HTTP {exc.code})") from None
    except urllib.error.URLError as exc:
        base = url.split("?", 1)[0]
        raise RemoteError(f"cannot reach {base}: {exc.reason}") from None
