"""Numeric core of posenc: pure numpy functions for every positional-encoding family.

Nothing here imports torch or onnx or knows about HTTP (tests/rules); the torch module, the exporter and the
CPU-form derivation are the sub-room `posenc.models.export`, imported explicitly by `posenc export` and the tests.
"""
