"""Artifacts written here for the audit tests, the way the common converters write them (no downloads): GGUF
files with ggml's GGUFWriter (llama.cpp's convert_hf_to_gguf.py keys and tensors), ONNX graphs with
onnx.helper in the onnxruntime-genai builder's shape (cos_cache / sin_cache initializers + GroupQueryAttention
do_rotary, or RotaryEmbedding) or with an in-graph inv_freq feeding Cos/Sin, and safetensors checkpoints."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from posenc.models.rope import rope_cos_sin
from posenc.models.rope_config import rope_parameters_from_config
from posenc.models.rope_frequencies import default_inv_freq

GGUF_SCALING = {"linear": "linear", "yarn": "yarn", "longrope": "longrope"}  # HF rope_type → GGUF spelling


def llama3_rope_factors(theta: float, dim: int, factor: float, low: float, high: float, old: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: the divisors of rope_freqs.weight."""
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def write_gguf(path: Path, arch: str, meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray] | None = None,
               sparse_bytes: int = 0) -> Path:
    """A GGUF file: `meta` keys without the `{arch}.` prefix (ints, floats, strings, lists), small F32 tensors,
    and optionally one more tensor of `sparse_bytes` whose data is a hole (truncate-extended, nothing written)."""
    import gguf

    writer = gguf.GGUFWriter(path, arch)
    for key, value in meta.items():
        name = f"{arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(name, value)
        elif isinstance(value, int):
            writer.add_uint32(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        else:
            writer.add_array(name, list(value))
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array.astype(np.float32))
    if sparse_bytes:
        writer.add_tensor_info("token_embd.weight", (sparse_bytes // 2,), np.dtype(np.float16), sparse_bytes,
                               raw_dtype=gguf.GGMLQuantizationType.F16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    out = writer.fout[0]
    writer.write_padding(out, out.tell())
    for info in writer.tensors[0].values():
        if info.tensor is not None:
            info.tensor.tofile(out)
            writer.write_padding(out, info.nbytes)
    end = out.tell()
    writer.close()
    if sparse_bytes:
        os.truncate(path, end + sparse_bytes)
    return path


def llama_gguf_meta(context: int, theta: float, hidden: int = 4096, heads: int = 32, kv: int = 8,
                    rot: int = 128) -> dict[str, Any]:
    return {"context_length": context, "embedding_length": hidden, "attention.head_count": heads,
            "attention.head_count_kv": kv, "rope.dimension_count": rot, "rope.freq_base": theta, "block_count": 32}


# A small Llama-3.1-style model for the ONNX and safetensors files (tables of 2048 positions stay small)
SMALL_LLAMA3 = {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
                "max_position_embeddings": 2048, "rope_theta": 500000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 256}}


def caches_of(config: Mapping[str, Any], rows: int, dtype: Any = np.float16) -> tuple[np.ndarray, np.ndarray]:
    """The builder's cos_cache / sin_cache [rows, rotary_dim/2] of a config, cast once."""
    params, _ = rope_parameters_from_config(config)
    cos, sin, _ = rope_cos_sin(params, rows, form="half", dtype=np.float64)
    return cos.astype(dtype), sin.astype(dtype)


def genai_onnx(cos: np.ndarray, sin: np.ndarray, *, heads: int = 8, kv_heads: int = 2, interleaved: int = 0,
               op: str = "GroupQueryAttention", mrope_section: tuple[int, ...] = ()) -> bytes:
    """onnxruntime-genai's builder shape: cos_cache / sin_cache initializers feeding GroupQueryAttention with
    do_rotary=1 (or com.microsoft's RotaryEmbedding, or opset 23's: op="RotaryEmbedding23"; or, with
    `mrope_section`, com.microsoft's MRotaryEmbedding on q and on k, as it writes Qwen2.5-VL and Qwen3-VL)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(cos, "cos_cache"), numpy_helper.from_array(sin, "sin_cache")]
    if mrope_section:
        nodes = [helper.make_node("MRotaryEmbedding", [x, "position_ids", "cos_cache", "sin_cache"], [f"{x}_rotated"],
                                  domain="com.microsoft", interleaved=interleaved, num_heads=count,
                                  mrope_section=list(mrope_section), mrope_layout=0)
                 for x, count in (("q", heads), ("k", kv_heads))]
        graph = helper.make_graph(nodes, "genai", [helper.make_tensor_value_info("q", TensorProto.FLOAT16, None)],
                                  [helper.make_tensor_value_info("q_rotated", TensorProto.FLOAT16, None)], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                       helper.make_opsetid("com.microsoft", 1)]).SerializeToString()
    if op == "GroupQueryAttention":
        node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len",
                                                        "cos_cache", "sin_cache"], ["out", "present_k", "present_v"],
                                domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, do_rotary=1,
                                rotary_interleaved=interleaved)
    elif op == "RotaryEmbedding":
        node = helper.make_node("RotaryEmbedding", ["q", "position_ids", "cos_cache", "sin_cache"], ["out"],
                                domain="com.microsoft", interleaved=interleaved, num_heads=heads)
    else:  # the opset-23 operator: (X, cos_cache, sin_cache, position_ids)
        node = helper.make_node("RotaryEmbedding", ["q", "cos_cache", "sin_cache", "position_ids"], ["out"],
                                interleaved=interleaved, num_heads=heads)
    graph = helper.make_graph([node], "genai", [helper.make_tensor_value_info("q", TensorProto.FLOAT16, None)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT16, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft",
                                                                                                     1)])
    return model.SerializeToString()


def inv_freq_onnx(inv_freq: np.ndarray, attention_factor: float | None = None) -> bytes:
    """An export with the inverse frequencies as a constant: position_ids · inv_freq → Cos, Sin (× factor)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(inv_freq.astype(np.float32), "inv_freq")]
    nodes = [helper.make_node("Cast", ["position_ids"], ["pos"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["pos", "axis"], ["pos3"]),
             helper.make_node("Mul", ["pos3", "inv_freq"], ["freqs"]),
             helper.make_node("Cos", ["freqs"], ["cos"]), helper.make_node("Sin", ["freqs"], ["sin"])]
    inits.append(numpy_helper.from_array(np.asarray([-1], dtype=np.int64), "axis"))
    outputs = ["cos", "sin"]
    if attention_factor is not None:
        inits.append(numpy_helper.from_array(np.asarray(attention_factor, dtype=np.float32), "mscale"))
        nodes += [helper.make_node("Mul", ["cos", "mscale"], ["cos_scaled"]),
                  helper.make_node("Mul", ["sin", "mscale"], ["sin_scaled"])]
        outputs = ["cos_scaled", "sin_scaled"]
    graph = helper.make_graph(nodes, "inv_freq", [helper.make_tensor_value_info("position_ids", TensorProto.INT64,
                                                                                None)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def plain_inv_freq(theta: float, dim: int) -> np.ndarray:
    return default_inv_freq(theta, dim).astype(np.float32)


def layer_types(layers: int, every: int = 6) -> list[str]:
    """Gemma's pattern (Gemma3TextConfig.__post_init__): every `every`-th layer full attention, the others sliding."""
    return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)]


# A small Gemma-3 text model's config.json as transformers 5.23 writes it (save_pretrained of Gemma3TextConfig): the
# RoPE per layer type in rope_parameters, keyed by the names in layer_types (the position keys; the rest of the file
# is sizes of the MLP, the vocabulary and token ids)
GEMMA3_T5: dict[str, Any] = {
    "model_type": "gemma3_text", "hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 128, "num_hidden_layers": 6, "max_position_embeddings": 8192, "sliding_window": 512,
    "layer_types": layer_types(6),
    "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}


def gemma3_gguf_meta(freq_base: float, freq_base_swa: float = 10000.0) -> dict[str, Any]:
    """GEMMA3_T5 as convert_hf_to_gguf.py's Gemma3Model writes it (`gemma3.` keys): the full layers' base in
    rope.freq_base, the sliding layers' in rope.freq_base_swa."""
    return {"context_length": 8192, "embedding_length": 512, "block_count": 6, "attention.head_count": 4,
            "attention.head_count_kv": 1, "attention.key_length": 128, "attention.value_length": 128,
            "attention.sliding_window": 512, "rope.freq_base": freq_base, "rope.freq_base_swa": freq_base_swa}


# A small Gemma-4 text model's config.json as transformers 5.23 writes it: the full-attention layers' head size in
# per_layer_config (HeterogeneousConfigMixin: {layer index: overrides}), no global_head_dim
GEMMA4_T5: dict[str, Any] = {
    "model_type": "gemma4_text", "hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 64, "num_hidden_layers": 6, "max_position_embeddings": 8192, "sliding_window": 512,
    "layer_types": layer_types(6), "per_layer_config": {"5": {"head_dim": 128}},
    "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                           "rope_type": "proportional"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}


def gemma4_gguf(head: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """GEMMA4_T5 as convert_hf_to_gguf.py's Gemma4Model writes it, with full-attention heads of `head` channels:
    rope.dimension_count = that head, its unrotated pairs marked 1e30 in rope_freqs (a quarter rotates)."""
    pairs, rotated = head // 2, int(0.25 * head // 2)
    meta = {"context_length": 8192, "embedding_length": 512, "block_count": 6, "attention.head_count": 4,
            "attention.head_count_kv": 1, "attention.key_length": head, "attention.key_length_swa": 64,
            "rope.dimension_count": head, "rope.dimension_count_swa": 64, "rope.freq_base": 1000000.0,
            "rope.freq_base_swa": 10000.0}
    return meta, {"rope_freqs.weight": np.array([1.0] * rotated + [1e30] * (pairs - rotated), dtype=np.float32)}
