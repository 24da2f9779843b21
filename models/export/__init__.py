"""The torch module, the ONNX exporter and the CPU-form derivation: for torch and onnx users only.

The numeric core above (posenc.models) imports none of this and neither torch nor onnx (tests/rules);
`posenc export` imports it on demand.
"""
