"""llama.cpp's conventions for GGUF files, as data: what its loader assumes when a key is absent (for every
architecture, and where one architecture's loader decides otherwise), how its converters mark the pairs of a head
that are not rotated (`rope_freqs`), and the keys of the sliding-window layers.

Each entry names the llama.cpp source it comes from (file, then function or section). `posenc.service.audit.
gguf_reader` applies them when it builds a file's facts, and quotes the entry it applied in the audit's notes,
so a file that llama.cpp runs as the model runs is no mistake and the report says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from posenc.models.rope_types import GGUF_SCALING_TYPES, ROPE_TYPES

_LOAD_HPARAMS = "src/llama-model.cpp, llama_model::load_hparams"


@dataclass(frozen=True, kw_only=True)
class Convention:
    """What llama.cpp does with one metadata key (after `{arch}.`).

    value: the value it uses when the key is absent (None: another key's, `same_as`);
    same_as: the key whose value it takes when this one is absent;
    says: the rule in words, completing "llama.cpp ...";
    source: where in llama.cpp (file, function or section)."""

    key: str
    says: str
    source: str
    value: float | str | None = None
    same_as: str | None = None

    def note(self, arch: str, *, absent: bool = True, takes: float | None = None) -> str:
        """The note an audit quotes: `takes`, the value the rule gives this file (another key's)."""
        value = "" if takes is None else f" ({takes:g})"
        return f"{arch}.{self.key}{' absent' if absent else ''}: llama.cpp {self.says}{value} ({self.source})"


def _uniform_scaling_spelling() -> str:
    """llama.cpp's default `rope.scaling.type` string is its spelling of LLAMA_ROPE_SCALING_TYPE_LINEAR: the scaling
    that divides every frequency by the factor alone (rope_freq_scale = 1 / factor). The GGUF spellings live in the
    registry (GGUF_SCALING_TYPES); the one meant is found there by what its entry reads, not by its name."""
    spellings = [spelling for spelling, name in GGUF_SCALING_TYPES.items()
                 if (spec := ROPE_TYPES[name]).scaled and spec.reads == {"factor"} and not spec.whole_head]
    if len(spellings) != 1:
        raise RuntimeError(f"the GGUF spelling of uniform (linear) scaling is ambiguous in the registry: {spellings}")
    return spellings[0]


def _whole_head_type() -> str:
    """The registry's RoPE whose frequencies span the whole head with zeros past rotary_dim (Gemma's proportional):
    what a `rope_freqs` mask over the last pairs of a head of dimension_count = head_dim computes."""
    names = [name for name, spec in ROPE_TYPES.items() if spec.whole_head and spec.reads <= {"factor"}]
    if len(names) != 1:
        raise RuntimeError(f"the registry's whole-head RoPE is ambiguous: {names}")
    return names[0]


UNIFORM_SCALING_SPELLING = _uniform_scaling_spelling()
WHOLE_HEAD_TYPE = _whole_head_type()

# (a) what the loader assumes when a key is absent, for every architecture
ABSENT: Mapping[str, Convention] = MappingProxyType({c.key: c for c in (
    Convention(key="rope.freq_base", value=10000.0, says="uses 10000",
               source=f"{_LOAD_HPARAMS}: rope_freq_base_train = 10000.0f, then get_key(LLM_KV_ROPE_FREQ_BASE, "
                      "..., false)"),
    Convention(key="rope.scaling.type", value=UNIFORM_SCALING_SPELLING,
               says=f"reads the type as {UNIFORM_SCALING_SPELLING!r}: the factor divides every frequency "
                    "(rope_freq_scale = 1 / factor)",
               source=f"{_LOAD_HPARAMS}: std::string rope_scaling(\"linear\"), then get_key(LLM_KV_ROPE_SCALING_TYPE, "
                      "..., false)"),
    Convention(key="rope.dimension_count", same_as="attention.key_length", says="rotates the whole head",
               source=f"{_LOAD_HPARAMS}: n_rot = n_embd_head_k, then get_key(LLM_KV_ROPE_DIMENSION_COUNT, "
                      "..., false)"),
    Convention(key="rope.freq_base_swa", same_as="rope.freq_base", says="gives the sliding layers rope.freq_base",
               source="src/models/*.cpp, load_arch_hparams of the sliding-window architectures (cohere2, llama4, "
                      "olmo2, openai-moe, ...): rope_freq_base_train_swa = rope_freq_base_train, then "
                      "get_key(LLM_KV_ROPE_FREQ_BASE_SWA, ..., false)"),
    Convention(key="attention.key_length_swa", same_as="attention.key_length",
               says="gives the sliding layers attention.key_length",
               source=f"{_LOAD_HPARAMS}, head size and n_rot for SWA layers: n_embd_head_k_swa = n_embd_head_k_full"),
    Convention(key="rope.dimension_count_swa", same_as="rope.dimension_count",
               says="gives the sliding layers rope.dimension_count",
               source=f"{_LOAD_HPARAMS}, head size and n_rot for SWA layers: n_rot_swa = n_rot_full"),
)})


def _own_swa_base(path: str, loader: str) -> Convention:
    return Convention(key="rope.freq_base_swa", value=10000.0, says="uses 10000 for the sliding layers",
                      source=f"{path}, {loader}: get_key(LLM_KV_ROPE_FREQ_BASE_SWA, rope_freq_base_train_swa, false) "
                             "over src/llama-hparams.h's rope_freq_base_train_swa = 10000.0f")


# ... and where one architecture's loader decides otherwise (`general.architecture` → key → convention): the Gemma
# loaders read the sliding layers' base from rope.freq_base_swa (10000 when absent, not rope.freq_base) and leave
# their frequency scale at llama-hparams.h's rope_freq_scale_train_swa = 1.0f: their sliding layers have a RoPE of
# their own (an entry with a `value` and no `same_as`). Before the per-architecture loaders, llama.cpp set 10000
# whatever the file said (src/llama-model.cpp, case LLM_ARCH_GEMMA3); a file whose freq_base_swa is not the
# model's is wrong for the loaders that read it.
BY_ARCHITECTURE: Mapping[str, Mapping[str, Convention]] = MappingProxyType({
    arch: MappingProxyType({"rope.freq_base_swa": _own_swa_base(path, loader)}) for arch, path, loader in (
        ("gemma3", "src/models/gemma3.cpp", "llama_model_gemma3::load_arch_hparams"),
        ("gemma3n", "src/models/gemma3n.cpp", "llama_model_gemma3n::load_arch_hparams"),
        ("gemma-embedding", "src/models/gemma-embedding.cpp", "llama_model_gemma_embedding::load_arch_hparams"),
        ("gemma4", "src/models/gemma4.cpp", "llama_model_gemma4::load_arch_hparams"))
})

# (b) partial rotary as a mask: ggml divides each pair's frequency by its rope_freqs factor (theta / ff), so a
# factor of 1e30 leaves the pair's angle 0: cos 1, sin 0, not rotated. Gemma-4's converter writes dimension_count =
# head_dim and 1e30 for the pairs past the rotated ones; the rotated channels are 2 x the pairs under the mask.
# A factor from UNROTATED_FACTOR up leaves the angle under 2e-11 rad at position 2^31: below float32's resolution.
WRITTEN_MASK = 1e30
UNROTATED_FACTOR = 1e20
MASK = Convention(
    key="rope_freqs", value=WRITTEN_MASK,
    says=f"divides each pair's frequency by its factor: from {UNROTATED_FACTOR:g} up the pair is not rotated",
    source="ggml/src/ggml-cpu/ops.cpp, rope_cache_init: rope_yarn(theta / freq_factors[i0/2], ...); "
           "convert_hf_to_gguf.py, Gemma4Model.generate_extra_tensors: [1.0] * n_rot + [1e30] * n_unrot")
# (Gemma4Model.set_gguf_parameters writes rope.dimension_count = global_head_dim beside that mask: "proportional")

# (c) the keys of the sliding-window layers, read and reported beside the full layers' ones
SWA_KEYS: tuple[str, ...] = ("attention.key_length_swa", "rope.dimension_count_swa", "rope.freq_base_swa")
# where an architecture's loader reads the sliding layers' own base (BY_ARCHITECTURE), it leaves their frequency
# scale at 1 (rope_freq_scale_train_swa's default): its sliding layers are not scaled; the loaders that give them
# the full layers' base give them the full layers' scale too (rope_freq_scale_train_swa = rope_freq_scale_train)

# (d) architectures whose graph divides only the full-attention layers' frequencies by `rope_freqs` (the sliding
# layers get no divisors): architecture → where in llama.cpp
FREQS_OF_FULL_LAYERS_ONLY: Mapping[str, str] = MappingProxyType({
    "gemma4": "src/models/gemma4-iswa.cpp, llm_build_gemma4_iswa: freq_factors = model.layers[il].rope_freqs only "
              "where !hparams.is_swa(il)"})


def convention(arch: str, key: str) -> Convention | None:
    """The convention llama.cpp applies to `{arch}.{key}`: the architecture's own, else every architecture's."""
    return BY_ARCHITECTURE.get(arch, {}).get(key) or ABSENT.get(key)
