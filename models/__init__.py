"""Numeric core of posenc: pure numpy functions for every positional-encoding family.

Nothing here imports torch or knows about HTTP; `posenc.models.rope_attention` and `posenc.models.export_onnx`
are the only torch users and are imported explicitly by the exporter and the tests.
"""
