"""Parity with the references (torch, transformers, onnx): every test here is marked `torch` (FOLDER_MARKS in
tests/conftest.py)."""
