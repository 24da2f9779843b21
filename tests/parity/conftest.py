"""Parity with the references (torch, transformers, onnx): every test here is marked `torch`."""

from pathlib import Path

import pytest

from tests.conftest import mark_folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent, pytest.mark.torch)
