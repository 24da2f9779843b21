"""The front page and the documentation site: README.md stays short and its links resolve, the generated
reference tables (docs/hooks/reference.py) cover the code they are generated from, and the site's
navigation names only pages that exist. No mkdocs, no browser: scripts/docs-test.sh builds and opens it."""

from __future__ import annotations

import importlib.util
import io
import re
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slug(heading: str) -> str:
    """The anchor GitHub and mkdocs' toc give a heading (lower case, punctuation dropped, spaces to -)."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r" ", "-", re.sub(r"[^\w\- ]", "", text))


def _anchors(markdown: str) -> set[str]:
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            anchors.add(_slug(match.group(1)))
    return anchors


def test_readme_is_a_front_page() -> None:
    assert len(README.read_text().splitlines()) <= 300


@pytest.mark.parametrize("source", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(source: Path) -> None:
    broken = []
    for target in LINK.findall(source.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not resolved offline
        path, _, anchor = target.partition("#")
        resolved = (source.parent / path).resolve() if path else source
        missing_anchor = anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved.read_text())
        if not resolved.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{source.name}: links that do not resolve: {broken}"


def test_docs_pages_link_only_within_docs() -> None:
    outside = [(page.name, target) for page in DOCS.glob("*.md") for target in LINK.findall(page.read_text())
               if not re.match(r"[a-z]+:", target) and target.split("#")[0]
               and not (page.parent / target.split("#")[0]).resolve().is_relative_to(DOCS)]
    assert not outside


def test_every_nav_page_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [p for item in nav for p in pages(item)]
        if isinstance(nav, dict):
            return [p for value in nav.values() for p in pages(value)]
        return []

    listed = pages(config["nav"])
    assert listed and all((DOCS / page).is_file() for page in listed)
    assert {p.name for p in DOCS.glob("*.md")} <= set(listed), "a page is missing from the navigation"


def test_every_marker_names_a_table() -> None:
    reference = _reference()
    used = {name for page in DOCS.glob("*.md") for name in reference.MARKER.findall(page.read_text())}
    assert used == set(reference.TABLES)


def test_configuration_lists_every_setting() -> None:
    from posenc.service.settings import Settings

    table = _reference().render("configuration")
    for name, field in Settings.model_fields.items():
        assert f"`POSENC_{name.upper()}`" in table
        assert " ".join((field.description or "").split()).replace("|", "\\|") in table


def test_configuration_follows_the_settings_descriptions(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.service.settings import Settings

    field = Settings.model_fields["port"]
    monkeypatch.setattr(field, "description", "a description written for this test only")
    assert "a description written for this test only" in _reference().render("configuration")


def test_errors_list_every_class_of_the_taxonomy() -> None:
    from posenc.service import errors

    table = _reference().render("errors")
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ServiceError)]
    for cls in classes:
        assert f"| {cls.status_code} | `{cls.error_type}` | `{cls.__name__}` |" in table
        assert cls.__dict__.get("__doc__"), f"{cls.__name__} needs a docstring: it is the docs' 'when'"
    assert "| 507 |" in table


def test_endpoints_list_every_route() -> None:
    from posenc.service.http.app import create_app

    table = _reference().render("endpoints")
    for path, operations in create_app().openapi()["paths"].items():
        for method in operations:
            assert f"| {method.upper()} | `{path}` |" in table


def test_readme_links_the_endpoint_list_and_names_only_real_routes() -> None:
    """The README does not repeat the generated list: it links it, and the routes it names exist."""
    from posenc.service.http.app import create_app

    paths = create_app().openapi()["paths"]
    readme = README.read_text()
    assert "[Endpoints](docs/endpoints.md)" in readme
    named = re.findall(r"`(GET|POST) (/[^`\s?]*)`", readme)
    assert named
    for method, path in named:
        assert method.lower() in paths.get(path, {}), f"README names {method} {path}: no such route"
    prefixes = re.findall(r"`(/(?:v1|v2|healthz|readyz|metrics)[^`\s?]*)`", readme)
    assert len(prefixes) >= 10
    for path in prefixes:
        assert any(route.startswith(path.removesuffix("...")) for route in paths), f"README names {path}: no route"


def test_rope_types_list_every_registered_type() -> None:
    from posenc.models.rope_types import ROPE_TYPES

    table = _reference().render("rope_types")
    for name, spec in ROPE_TYPES.items():
        assert f"| `{name}` |" in table
        assert all(f"`{key}`" in table for key in spec.config_keys)


def test_unknown_marker_fails() -> None:
    with pytest.raises(KeyError):
        _reference().fill("<!-- reference:nonsense -->")


@pytest.mark.parametrize("picture", sorted((DOCS / "img").glob("*.png")), ids=lambda p: p.name)
def test_pictures_are_not_blank(picture: Path) -> None:
    from matplotlib import image

    pixels = image.imread(io.BytesIO(picture.read_bytes()), format="png")
    assert pixels.ndim == 3 and min(pixels.shape[:2]) >= 100
    assert float(np.asarray(pixels[..., :3], dtype=np.float64).std()) > 0.02, f"{picture.name} looks blank"
