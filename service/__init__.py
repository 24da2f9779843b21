"""posenc: positional-encoding tables, attention biases and ONNX RoPE-attention inference over HTTP."""

__version__ = "0.1.0"
