"""The package layout, derived from the tree: the top-level folders service/ and models/ install as
posenc.service and posenc.models (every package below them is found, none is listed by hand), and the
model repository onnx/ as the package data posenc.service.shipped_models. The rest of the metadata is in
pyproject.toml."""

from setuptools import find_packages, setup

# namespace -> the folder that holds it
ROOTS = {"posenc": "posenc", "posenc.service": "service", "posenc.models": "models"}
SHIPPED_MODELS = {"posenc.service.shipped_models": "onnx"}


def packages_of(name: str, folder: str) -> list[str]:
    """`name` and every package below `folder`, named under `name`."""
    return [name, *(f"{name}.{sub}" for sub in find_packages(folder))]


setup(packages=[p for name, folder in ROOTS.items() for p in packages_of(name, folder)] + list(SHIPPED_MODELS),
      package_dir={**ROOTS, **SHIPPED_MODELS})
