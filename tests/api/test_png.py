"""format=png on the table routes: a picture of the table (cached, ETagged, pixel-limited)."""

import io

import numpy as np
import pytest
from fastapi.testclient import TestClient

from posenc.service.codec.encode import negotiate_format
from posenc.service.tables.png import Curve, Heatmap, Panel, Picture, render
from tests.conftest import running_client

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(body: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk."""
    assert body.startswith(PNG_MAGIC)
    return int.from_bytes(body[16:20], "big"), int.from_bytes(body[20:24], "big")


def pixels(body: bytes) -> np.ndarray:
    from matplotlib.image import imread

    return imread(io.BytesIO(body), format="png")


@pytest.mark.parametrize("url", [
    "/v1/rope?max_position=32&head_dim=16",
    "/v1/sinusoidal?max_position=32&dim=16",
    "/v1/alibi/bias?num_heads=3&query_length=8&key_length=8&mask=true",
    "/v1/alibi/slopes?num_heads=5",
    "/v1/t5/buckets?query_length=16&key_length=16",
    "/v1/relative/clipped?query_length=8&key_length=8&max_relative_position=3",
])
def test_table_routes_draw_a_picture(client: TestClient, url: str) -> None:
    response = client.get(url + "&format=png")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    width, height = png_size(response.content)
    assert width >= 600 and height >= 300
    image = pixels(response.content)
    assert image[..., :3].std() > 0.05  # not blank: a heatmap or curve with axes and a colour bar
    assert client.get(url + "&format=png", headers={"If-None-Match": response.headers["ETag"]}).status_code == 304
    assert client.get(url + "&format=png").headers["X-Cache"] == "hit"


def test_png_key_differs_from_the_binary_formats(client: TestClient) -> None:
    url = "/v1/sinusoidal?max_position=8&dim=4"
    assert client.get(url + "&format=png").headers["ETag"] != client.get(url).headers["ETag"]
    assert negotiate_format(None, "image/png") == "png"
    assert negotiate_format(None, "text/html, */*;q=0.1") == "safetensors"  # browsers still get a table


def test_tensor_picks_what_is_drawn(client: TestClient) -> None:
    base = "/v1/rope?max_position=16&head_dim=8&format=png"
    cos, sin = client.get(base).content, client.get(base + "&tensor=sin").content
    assert cos == client.get(base + "&tensor=cos").content  # without ?tensor=: the first tensor
    assert cos != sin
    assert client.get(base + "&tensor=nope").status_code == 422


def test_pixel_limit_answers_413_before_computing() -> None:
    with running_client(max_png_pixels=4096) as client:
        assert client.get("/v1/sinusoidal?max_position=64&dim=64&format=png").status_code == 200
        refused = client.get("/v1/sinusoidal?max_position=65&dim=64&format=png")
        assert refused.status_code == 413
        assert "4160 requested" in refused.json()["error"]
        # 3-D biases draw a bounded number of heads: the limit counts what is drawn
        assert client.get("/v1/alibi/bias?num_heads=64&query_length=8&key_length=8&format=png").status_code == 200


def test_render_is_deterministic_and_handles_infinities() -> None:
    values = np.array([[0.0, -np.inf], [1.0, 2.0]])
    picture = Picture("t", (Heatmap("h", values, "q", "k"),
                            Panel("p", "x", "y", (Curve(np.arange(3), np.array([1.0, np.nan, 3.0]), "c"),))))
    first = render(picture)
    assert first == render(picture)
    assert png_size(first)[0] == 1000


def test_marks_are_one_collection_however_many() -> None:
    """A clipped map of max_relative_position 6990 marks ~14,000 boundaries: one artist each took 15 s to
    draw; as one collection the panel holds its curve and one collection whatever the count."""
    from matplotlib.figure import Figure

    from posenc.service.tables.png import _curves

    offsets = np.arange(-7000, 7000)
    panel = Panel("index", "key − query", "index", (Curve(offsets, np.clip(offsets, -6990, 6990), None, "step"),),
                  marks=tuple(float(b) for b in offsets), mark_label="boundaries")
    axes = Figure().add_subplot()
    _curves(axes, panel)
    assert len(axes.lines) == 1 and len(axes.collections) == 1
    assert len(axes.collections[0].get_segments()) == len(offsets)
