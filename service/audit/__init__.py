"""Artifact audits: GGUF, ONNX, safetensors and config.json files read within bounds, their position facts judged
by `posenc.models.audit` (`posenc audit`, `POST /v1/audit`)."""
