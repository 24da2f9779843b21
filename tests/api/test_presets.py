"""Model presets: the catalogue, GET /v1/presets, and ?preset= on table, properties and check routes and the CLI."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from posenc.models.presets import FAMILY_TABLES, catalogue, find_preset
from posenc.models.presets.tables import TABLE_KINDS, preset_values
from posenc.models.rope_types import ROPE_TYPES
from posenc.service.cli.main import main as posenc_main
from posenc.service.tables.preset import PRESET_FILLS, preset_fills
from posenc.service.tables.registry import table_routes

PRESETS = sorted(catalogue())


def test_catalogue_is_large_and_covers_every_family() -> None:
    assert len(PRESETS) >= 40
    assert {p.family for p in catalogue().values()} == set(FAMILY_TABLES)
    kinds = {route.query.preset_table for route in table_routes().values()} - {None}
    assert kinds == set(TABLE_KINDS)  # every table kind a route serves has presets, and the reverse


def rope_type_of(name: str) -> str:
    from posenc.models.rope_config import rope_parameters_from_config

    preset = find_preset(name)
    params, _ = rope_parameters_from_config(preset.config, layer_type=preset.serving.get("layer_type"))
    return "deepseek_yarn" if preset.serving.get("yarn_mscale") == "deepseek" else params.rope_type


def test_catalogue_covers_the_rope_types() -> None:
    covered = {rope_type_of(p.name) for p in catalogue().values() if "rope" in p.tables}
    assert covered == set(ROPE_TYPES)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_validates_with_the_route_models(name: str) -> None:
    preset = catalogue()[name]
    for route in table_routes().values():
        if route.query.preset_table in preset.tables:
            values = {"query_length": 8, "key_length": 8, "qlen": 4, "klen": 4, "max_position": 64,
                      "grid_thw": "1,4,4"}
            query = route.query.model_validate({**values, "preset": name})
            if route.query.body is None:
                query.check()
                query.specs()


@pytest.mark.parametrize("alias", ["LLAMA-3.1-8B", "meta-llama/Llama-3.1-8B", "META-LLAMA/LLAMA-3.1-8B"])
def test_names_and_public_ids_are_case_insensitive(alias: str) -> None:
    assert find_preset(alias).name == "llama-3.1-8b"


def test_list_and_one_preset(client: TestClient) -> None:
    listed = client.get("/v1/presets").json()["presets"]
    assert [p["name"] for p in listed] == list(catalogue())
    entry = next(p for p in listed if p["name"] == "t5-small")
    assert "GET /v1/t5/buckets" in entry["endpoints"] and "POST /v1/check/t5/buckets" in entry["endpoints"]
    assert entry["provenance"]["model_id"] == "google-t5/t5-small"
    one = client.get("/v1/presets/meta-llama/Llama-3.1-8B").json()
    assert one["name"] == "llama-3.1-8b"
    assert one["parameters"]["GET /v1/rope"]["rope_type"] == "llama3"
    for url in one["golden_urls"]:
        assert client.get(url).status_code == 200, url


def test_unknown_preset_is_a_clear_error(client: TestClient) -> None:
    response = client.get("/v1/rope?preset=no-such-model&max_position=4")
    assert response.status_code == 422 and "GET /v1/presets" in response.json()["error"]
    assert client.get("/v1/presets/no-such-model").status_code == 404


@pytest.mark.parametrize("url", ["/v1/sinusoidal?dim=4&max_position=2&preset=",
                                 "/v1/alibi/bias?num_heads=4&query_length=2&key_length=2&preset=",
                                 "/v1/relative/clipped?query_length=2&key_length=2&max_relative_position=1&preset="])
def test_empty_preset_is_refused(client: TestClient, url: str) -> None:
    """`preset=` names no model: a 422, as an empty value of any other parameter (it was served as no preset, which
    the document's enum does not allow; schemathesis, issue 62)."""
    response = client.get(url)
    assert response.status_code == 422 and response.json()["error"].startswith("preset:"), response.text


@pytest.mark.parametrize(("url", "names"), [
    ("/v1/rope?preset=t5-small&max_position=4", ("t5-small", "/v1/rope")),
    ("/v1/rope/vision?preset=pixtral-12b&model=llama4", ("pixtral-12b", "llama4")),
    ("/v1/rope/from-config?preset=llama-3.1-8b", ("llama-3.1-8b", "rope/from-config")),
])
def test_contradictions_are_422_naming_both(client: TestClient, url: str, names: tuple[str, str]) -> None:
    response = client.request("POST" if "from-config" in url else "GET", url, json={"head_dim": 8})
    assert response.status_code == 422
    assert all(name in response.json()["error"] for name in names)


SPELLED = ("/v1/rope?max_position=32&head_dim=128&rope_theta=500000&rope_type=llama3&factor=8&low_freq_factor=1"
           "&high_freq_factor=4&original_max_position_embeddings=8192")


def test_preset_and_spelled_out_share_one_etag_and_one_cache_entry(client: TestClient) -> None:
    first = client.get("/v1/rope?preset=llama-3.1-8b&max_position=32")
    second = client.get(SPELLED)
    assert first.status_code == second.status_code == 200
    assert first.headers["etag"] == second.headers["etag"]
    assert second.headers["x-cache"] == "hit" and first.content == second.content
    assert client.get("/v1/rope?preset=llama-3.1-8b&max_position=32",
                      headers={"If-None-Match": second.headers["etag"]}).status_code == 304


def test_explicit_parameters_override_the_preset(client: TestClient) -> None:
    overridden = client.get("/v1/rope?preset=llama-3.1-8b&max_position=32&rope_theta=10000&rope_type=default")
    plain = client.get("/v1/rope?max_position=32&head_dim=128")
    assert overridden.headers["etag"] == plain.headers["etag"]


@pytest.mark.parametrize(("url", "spelled"), [
    ("/v1/alibi/bias?preset=bloom-560m&query_length=3&key_length=5",
     "/v1/alibi/bias?num_heads=16&mode=bloom&query_length=3&key_length=5"),
    ("/v1/t5/buckets?preset=flan-t5-base&query_length=4&key_length=6", "/v1/t5/buckets?query_length=4&key_length=6"),
    ("/v1/sinusoidal?preset=m2m100-418m&max_position=8",
     "/v1/sinusoidal?dim=1024&variant=fairseq&padding_idx=1&max_position=8"),
    ("/v1/properties/rope?preset=pythia-160m&max_position=16",
     "/v1/properties/rope?head_dim=64&partial_rotary_factor=0.25&max_position=16"),
])
def test_other_families_key_as_spelled_out(client: TestClient, url: str, spelled: str) -> None:
    assert client.get(url).headers["etag"] == client.get(spelled).headers["etag"]


def test_check_route_takes_a_preset(client: TestClient) -> None:
    import numpy as np

    from posenc.service.codec.encode import encode_safetensors

    table = client.get("/v1/alibi/slopes?preset=mpt-7b&format=json").json()["tensors"]["slopes"]
    body = encode_safetensors({"slopes": np.asarray(table["data"], dtype=np.float32)}, {})
    response = client.post("/v1/check/alibi/slopes?preset=mpt-7b", content=body,
                           headers={"Content-Type": "application/x-safetensors"})
    assert response.status_code == 200, response.text
    assert response.json()["verdict"] == "matches"


def test_openapi_documents_preset_on_every_table_route(client: TestClient) -> None:
    """`preset` lists the slugs that fill the route's table (an enum: another model's slug is a 422 there); a route
    no preset fills does not declare it."""
    spec = client.get("/openapi.json").json()
    for path, route in [*table_routes().items(), ("/v1/check/rope", table_routes()["/v1/rope"])]:
        operation = next(iter(spec["paths"][path].values()))
        presets = [p for p in operation["parameters"] if p["name"] == "preset"]
        kind = route.query.preset_table
        if kind is None:
            assert not presets, path
            continue
        (preset,) = presets
        assert "GET /v1/presets" in preset["schema"]["description"]
        names, none = preset["schema"]["anyOf"]  # nullable, as every optional parameter without a default
        assert names["enum"] == [name for name, p in catalogue().items() if kind in p.tables] and none, path


@pytest.mark.parametrize(("path", "filled", "other"), [
    ("/v1/rope", {"head_dim", "max_position"}, set()),
    ("/v1/alibi/bias", {"num_heads"}, {"query_length", "key_length"}),
    ("/v1/rope/vision", {"head_dim"}, set()),
    ("/v1/rope/vision/tower", {"vision_tower", "head_dim"}, {"grid_thw"}),
    ("/v1/properties/xlnet", {"d_model"}, {"qlen", "klen"}),
    ("/v1/check/sinusoidal", {"dim", "max_position"}, set()),
])
def test_parameters_a_preset_fills_say_so(client: TestClient, path: str, filled: set[str], other: set[str]) -> None:
    """A required parameter that every preset of the route fills stays required in the document (a client that
    sends it is never refused) and says that a request with the preset may leave it out, which is served
    (schemathesis found /v1/rope/vision?preset=pixtral-12b served without head_dim; its run's hooks read this)."""
    operation = next(iter(client.get("/openapi.json").json()["paths"][path].values()))
    parameters = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
    assert {name for name, p in parameters.items() if p["required"]} == filled | other, path
    assert {name for name, p in parameters.items() if PRESET_FILLS in p.get("description", "")} == filled, path
    assert filled <= preset_fills(table_routes()[path.replace("/check", "")].query.preset_table or "")
    if not path.startswith("/v1/check/"):
        values = {"query_length": 8, "key_length": 8, "grid_thw": "1,4,4", "qlen": 4, "klen": 4}
        query = "&".join(f"{name}={values[name]}" for name in sorted(other))
        preset = parameters["preset"]["schema"]["anyOf"][0]["enum"][0]
        response = client.get(f"{path}?preset={preset}&{query}")
        assert response.status_code == 200, response.text


def test_cli_table_takes_a_preset(tmp_path: Any) -> None:
    out = tmp_path / "rope.safetensors"
    assert posenc_main(["table", "rope", "preset=gpt-j-6b", "max_position=8", "-o", str(out)]) == 0
    from safetensors.numpy import load_file

    assert load_file(str(out))["cos"].shape == (8, 64)


def test_preset_values_refuse_a_foreign_kind() -> None:
    with pytest.raises(ValueError, match="t5-small"):
        preset_values(find_preset("t5-small"), "rope")


def test_cli_check_takes_a_preset(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from posenc.models.sinusoidal import sinusoidal_table

    path = tmp_path / "pe.npy"
    np.save(path, sinusoidal_table(1500, 384, "tensor2tensor", offset=1).astype(np.float32))
    assert posenc_main(["check", "/v1/sinusoidal", "preset=whisper-tiny", "--file", str(path)]) == 1
    assert "offset_+1" in capsys.readouterr().out
    np.save(path, sinusoidal_table(1500, 384, "tensor2tensor").astype(np.float32))
    assert posenc_main(["check", "/v1/sinusoidal", "preset=openai/whisper-tiny", "--file", str(path)]) == 0


VISION_TOWER_PRESETS = [name for name in PRESETS if "vision_tower" in catalogue()[name].tables]


def test_the_vision_language_models_have_tower_presets() -> None:
    towers = {name: preset_values(catalogue()[name], "vision_tower")["vision_tower"] for name in VISION_TOWER_PRESETS}
    assert towers == {"qwen2.5-vl-7b-instruct": "qwen2_5_vl", "qwen3-vl-8b-instruct": "qwen3_vl",
                      "glm-4.1v-9b-thinking": "glm4v", "paddleocr-vl": "paddleocr_vl", "gemma-4-31b-it": "gemma4"}
    assert preset_values(find_preset("Qwen/Qwen2.5-VL-7B-Instruct"), "vision_tower") == {
        "vision_tower": "qwen2_5_vl", "head_dim": 80, "rope_theta": 10000.0, "spatial_merge_size": 2, "window": 4}


@pytest.mark.parametrize("name", VISION_TOWER_PRESETS)
@pytest.mark.parametrize("grid", ["1,16,16", "2,10,18"])
def test_vision_tower_preset_is_from_config_of_its_config(client: TestClient, name: str, grid: str) -> None:
    import numpy as np
    from safetensors.numpy import load

    from posenc.models.vision_towers import TOWERS_BY_NAME

    preset = catalogue()[name]
    if TOWERS_BY_NAME[preset_values(preset, "vision_tower")["vision_tower"]].video == "images":
        grid = "1," + grid.split(",", 1)[1]  # image towers (Gemma 4) encode one frame at a time
    answer = client.get(f"/v1/rope/vision/tower?preset={preset.model_id}&grid_thw={grid}")
    assert answer.status_code == 200, answer.text
    upload = client.post(f"/v1/rope/from-config?tower=vision&grid_thw={grid}", json=dict(preset.config))
    assert upload.status_code == 200, upload.text
    ours, theirs = load(answer.content), load(upload.content)
    assert ours.keys() == theirs.keys() and ours["cos"].shape[0] == np.prod([int(v) for v in grid.split(",")])
    for tensor in ours:
        assert ours[tensor].tobytes() == theirs[tensor].tobytes(), tensor
    spelled = "&".join(f"{k}={v}" for k, v in preset_values(preset, "vision_tower").items())
    assert client.get(f"/v1/rope/vision/tower?{spelled}&grid_thw={grid}").headers["etag"] == answer.headers["etag"]


@pytest.mark.parametrize(("url", "field"), [
    ("/v1/rope/vision/tower?preset=qwen2.5-vl-7b-instruct", "grid_thw"),  # no grid
    ("/v1/rope/vision/tower?preset=qwen2.5-vl-7b-instruct&grid_thw=1,3,4", "grid_thw"),  # not a multiple of the merge
    ("/v1/rope/vision/tower?preset=paddleocr-vl&grid_thw=1,4,4&window=2", "window"),  # no window attention
    ("/v1/rope/vision/tower?vision_tower=pixtral&head_dim=64&grid_thw=1,4,4", "vision_tower"),  # GET /v1/rope/vision
    ("/v1/rope/vision/tower?vision_tower=paddleocr_vl&head_dim=64&spatial_merge_size=2&grid_thw=1,4,4",
     "spatial_merge_size"),
    ("/v1/rope/vision?preset=glm-4.1v-9b-thinking", "vision_tower"),  # the tower's table is another route's
])
def test_vision_tower_bad_input(client: TestClient, url: str, field: str) -> None:
    response = client.get(url)
    assert response.status_code == 422, response.text
    assert field in response.json()["error"]
