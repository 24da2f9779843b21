"""Audit a shipped artifact's position handling: the position facts a file states (GGUF metadata, ONNX caches and
constants, checkpoint buffers, a config.json), each against a reference configuration, and the tables they imply
against the golden ones (pure numpy; the file readers live in `posenc.service.audit`). docs/audit.md."""
