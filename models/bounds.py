"""Bounds and defaults of the table parameters: each defined here once, read by the numeric core
(validation) and by the service (query models, OpenAPI).

The bounds only reject nonsense early (422); the real guard is the output-size check (413), which
the service applies from the declared shapes before anything is computed.
"""

MAX_ROWS = 1 << 31  # rows of a position table (max_position)
MAX_DIM = 1 << 16  # channels: head_dim, rotary_dim, sinusoidal dim
MAX_OFFSET = 1 << 40  # first position / past tokens / padding_idx
MAX_HEADS = 1 << 20
MAX_SEQUENCE = 1 << 24  # query_length and key_length of bias and relative tables
MAX_BUCKETS = 1 << 16
MAX_DISTANCE = 1 << 40
MAX_RELATIVE_POSITION = 2**30 - 1  # Shaw clipping distance: indices up to 2k fit in int32

# RoPE: far beyond any real model, and small enough that transformers' float32 arithmetic
# (inv_freq, llama3 wavelengths, YaRN blends) cannot overflow to inf.
MAX_SCALE = 1e6  # factors, betas, mscales, attention factor
MAX_THETA = 1e12
MAX_CONTEXT = 1 << 40  # context lengths (max_position_embeddings, original_max_position_embeddings)

DEFAULT_ROPE_THETA = 10000.0  # transformers' RotaryEmbeddingConfigMixin.default_theta
DEFAULT_SINUSOIDAL_BASE = 10000.0  # "Attention Is All You Need" §3.5
MAX_SINUSOIDAL_BASE = 1e12
# a subnormal base overflows base^-1 (the highest frequency) to inf in the float64 evaluation: refused instead
MIN_SINUSOIDAL_BASE = 1e-300
MAX_ALIBI_BIAS_MAX = 1024.0

# M-RoPE sequence descriptions (the output-size check bounds the rest)
MAX_SEGMENTS = 1 << 16  # text runs, images and videos of one sequence
MAX_GRID = 1 << 16  # patches per grid side (t, h, w) before the merge
MAX_MERGE = 64  # spatial_merge_size
MAX_POSITION_ID = 1 << 40  # explicit M-RoPE position ids
