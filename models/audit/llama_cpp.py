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
# ... whose factor 1 (or none) scales nothing: what a converter that writes the type for every model means by it
UNIFORM_SCALE_ONE = ("llama.cpp divides the frequencies by 1, an unscaled RoPE (src/llama-model.cpp, "
                     "llama_model::load_hparams: rope_freq_scale_train = ropescale == 0.0f ? 1.0f : 1.0f/ropescale)")
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
    Convention(key="attention.key_length_mla_swa", same_as="attention.key_length_mla",
               says="gives the sliding layers the q/k head of attention.key_length_mla",
               source="src/models/dots3note.cpp, load_arch_hparams: get_key(LLM_KV_ATTENTION_KEY_LENGTH_MLA_SWA, "
                      "n_embd_head_k_mla_swa); build: n_embd_head_k_mla = is_swa ? n_embd_head_k_mla_swa : "
                      "n_embd_head_k_mla()"),
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
        ("gemma4", "src/models/gemma4.cpp", "llama_model_gemma4::load_arch_hparams"),
        ("gemma4-assistant", "src/models/gemma4-assistant.cpp", "load_arch_hparams"),
        ("mimo2", "src/models/mimo2.cpp", "load_arch_hparams"),
        ("modern-bert", "src/models/modern-bert.cpp", "load_arch_hparams"),
        ("plamo3", "src/models/plamo3.cpp", "load_arch_hparams"),
        ("step35", "src/models/step35.cpp", "llama_model_step35::load_arch_hparams"),
        ("dots3note", "src/models/dots3note.cpp", "load_arch_hparams"))
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
SWA_KEYS: tuple[str, ...] = ("attention.key_length_swa", "rope.dimension_count_swa", "rope.freq_base_swa",
                             "attention.key_length_mla_swa")
# where an architecture's loader reads the sliding layers' own base (BY_ARCHITECTURE), it leaves their frequency
# scale at 1 (rope_freq_scale_train_swa's default): its sliding layers are not scaled; the loaders that give them
# the full layers' base give them the full layers' scale too (rope_freq_scale_train_swa = rope_freq_scale_train)

@dataclass(frozen=True)
class UnscaledSliding:
    """An architecture whose loader gives its sliding layers the full layers' base (or `rope.freq_base_swa`, where
    `reads_swa_base`) but not their scaling: rope_freq_scale_train_swa = 1, so a YaRN of the full layers leaves the
    sliding ones plain (OLMo-3, Laguna). `source`: where in llama.cpp."""

    reads_swa_base: bool
    source: str

    def note(self, arch: str) -> str:
        base = "rope.freq_base_swa (else rope.freq_base)" if self.reads_swa_base else "rope.freq_base"
        return f"{arch}: llama.cpp runs the sliding layers at {base} without the file's scaling ({self.source})"


# (c') `general.architecture` → its sliding layers' unscaled RoPE
UNSCALED_SLIDING_LAYERS: Mapping[str, UnscaledSliding] = MappingProxyType({
    "olmo2": UnscaledSliding(reads_swa_base=False, source=(
        "src/models/olmo2.cpp, load_arch_hparams: rope_freq_scale_train_swa = 1.0; graph: is_swa layers call "
        "ggml_rope_ext(freq_base, freq_scale 1.0, ext_factor 0.0, attn_factor 1.0), freq_base the context's")),
    "laguna": UnscaledSliding(reads_swa_base=True, source=(
        "src/models/laguna.cpp, load_arch_hparams: rope_freq_scale_train_swa = 1.0f, "
        "get_key(LLM_KV_ROPE_FREQ_BASE_SWA, rope_freq_base_train_swa, false); graph: freq_base_l = is_swa_il ? "
        "rope_freq_base_train_swa : freq_base")),
})

# (d) architectures whose graph divides only the full-attention layers' frequencies by `rope_freqs` (the sliding
# layers get no divisors): architecture → where in llama.cpp
FREQS_OF_FULL_LAYERS_ONLY: Mapping[str, str] = MappingProxyType({
    "gemma4": "src/models/gemma4-iswa.cpp, llm_build_gemma4_iswa: freq_factors = model.layers[il].rope_freqs only "
              "where !hparams.is_swa(il)",
    "step35": "src/models/step35.cpp, graph: rope_factors = is_swa ? nullptr : model.get_rope_factors(cparams, il)"})

# (d') architectures whose loader halves the full layers' rotated channels after the sliding layers took theirs
# (rope.dimension_count, else the head): the full layers rotate half of it, and ggml reads only the first half of
# `rope_freqs` (the converter writes the factors of the rotated channels, padded with 1)
HALVED_FULL_ROTARY: Mapping[str, str] = MappingProxyType({
    "step35": "src/models/step35.cpp, llama_model_step35::load_arch_hparams: n_rot_full = n_rot_full / 2 (after "
              "src/llama-model.cpp, load_hparams: n_rot_swa = n_rot_full); graph: ggml_rope_ext(..., rope_factors, "
              "n_rot_l, ...) reads n_rot_l / 2 factors"})


def convention(arch: str, key: str) -> Convention | None:
    """The convention llama.cpp applies to `{arch}.{key}`: the architecture's own, else every architecture's."""
    return BY_ARCHITECTURE.get(arch, {}).get(key) or ABSENT.get(key)


# (e) multi-head latent attention (MLA: DeepSeek-V2/V3, MiniCPM3, Kimi): each q/k head is qk_nope_head_dim channels
# left unrotated and qk_rope_head_dim rotated ones. The converters write rope.dimension_count = qk_rope_head_dim and
# attention.key_length = qk_nope_head_dim + qk_rope_head_dim, the q/k head (MiniCPM3Model.set_gguf_parameters, the
# converters before MLA's compressed layout); in the compressed layout llama.cpp decompresses at run time they write
# that head as attention.key_length_mla instead, attention.key_length = kv_lora_rank + qk_rope_head_dim (the KV
# latent and the rotated part) and, for the architectures below, one KV head: the latent every head shares.
MLA_HEAD = Convention(
    key="attention.key_length_mla", same_as="attention.key_length",
    says="takes the q/k head (qk_nope_head_dim + qk_rope_head_dim) from attention.key_length_mla where it is stated "
         "(the compressed layout: attention.key_length is then kv_lora_rank + qk_rope_head_dim), else from "
         "attention.key_length",
    source="src/llama-hparams.cpp, llama_hparams::n_embd_head_k_mla: is_mla() ? n_embd_head_k_mla_impl : "
           "n_embd_head_k(); src/models/deepseek2.cpp, n_embd_head_qk_nope = n_embd_head_k_mla - n_rot; "
           "convert_hf_to_gguf.py, conversion/deepseek.py, DeepseekV2Model.set_gguf_parameters: "
           "add_key_length(kv_lora_rank + qk_rope_head_dim), add_key_length_mla(qk_nope_head_dim + qk_rope_head_dim)")
_ONE_KV_HEAD = "set_gguf_parameters: self.hparams[\"num_key_value_heads\"] = 1 (MLA converted into MQA of the latent)"
MLA_ONE_KV_HEAD: Mapping[str, str] = MappingProxyType({
    "deepseek2": f"convert_hf_to_gguf.py, conversion/deepseek.py, DeepseekV2Model.{_ONE_KV_HEAD}",
    "deepseek32": f"convert_hf_to_gguf.py, conversion/deepseek.py, DeepseekV32Model (DeepseekV2Model's) "
                  f"{_ONE_KV_HEAD}",
    "kimi-k3": f"convert_hf_to_gguf.py, conversion/kimi_k3.py, {_ONE_KV_HEAD}",
    "kimi-linear": f"convert_hf_to_gguf.py, conversion/kimi_linear.py, {_ONE_KV_HEAD}",
    "bailingmoe3": f"convert_hf_to_gguf.py, conversion/bailingmoe3.py, {_ONE_KV_HEAD}",
    "mistral4": f"convert_hf_to_gguf.py, conversion/mistral3.py, Mistral3Model.Mistral4Model (DeepseekV2Model's) "
                f"{_ONE_KV_HEAD}",
    "dots3note": f"convert_hf_to_gguf.py, conversion/dots3.py, Dots3NoteModel (DeepseekV2Model's) {_ONE_KV_HEAD}",
})


# (f) YaRN's attention factor, the factor cos and sin carry: llama.cpp computes it once per context from
# rope.scaling.yarn_log_multiplier (mscale_all_dim, where an architecture's loader reads the key) and cancels ggml's own
# 0.1·ln(s) + 1 (ggml/src/ggml-cpu/ops.cpp, rope_yarn), so the table carries get_mscale(s, mscale) /
# get_mscale(s, mscale_all_dim) as transformers' yarn does with both given, or get_mscale(s, 1) = 0.1·ln(s) + 1 when
# the multiplier is absent or 0. DeepSeek-V2's graph puts YaRN's mscale² into the softmax scale (kq_scale) instead.
@dataclass(frozen=True, kw_only=True)
class YarnMultiplier:
    """How one architecture's loader reads rope.scaling.yarn_log_multiplier: `divisor`, what the stored value is
    divided by to give mscale_all_dim (the DeepSeek converters write 0.1 x mscale_all_dim); `mscale_is_all`: mscale
    is taken to be mscale_all_dim where that is not 1 (else 1)."""

    divisor: float
    mscale_is_all: bool
    source: str

    def mscales(self, stored: float) -> tuple[float, float]:
        """(mscale, mscale_all_dim) llama.cpp uses for a stored multiplier."""
        mscale_all_dim = stored / self.divisor
        return (mscale_all_dim if self.mscale_is_all and mscale_all_dim != 1.0 else 1.0), mscale_all_dim


_YARN_FACTOR = ("src/llama-context.cpp, llama_context::llama_context: yarn_attn_factor = get_mscale(factor, mscale) / "
                "get_mscale(factor, mscale_all_dims), times 1 / (1 + 0.1 ln factor) against ggml's rope_yarn")
YARN_MULTIPLIER_KEY = "rope.scaling.yarn_log_multiplier"
YARN_MULTIPLIER: Mapping[str, YarnMultiplier] = MappingProxyType({
    "deepseek2": YarnMultiplier(divisor=0.1, mscale_is_all=True, source=(
        "src/models/deepseek2.cpp, llama_model_deepseek2::load_arch_hparams: rope_yarn_log_mul /= 0.1f; "
        f"{_YARN_FACTOR}, mscale = mscale_all_dims for LLM_ARCH_DEEPSEEK2 [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]; "
        "src/models/deepseek2.cpp, llm_build_deepseek2: kq_scale = mscale^2 / sqrt(n_embd_head_k)")),
    "deepseek32": YarnMultiplier(divisor=0.1, mscale_is_all=False, source=(
        f"src/models/deepseek32.cpp, load_arch_hparams: rope_yarn_log_mul /= 0.1f; {_YARN_FACTOR}, mscale = 1")),
    "mistral4": YarnMultiplier(divisor=0.1, mscale_is_all=False, source=(
        "src/models/models.h, llama_model_mistral4: llama_model_deepseek2's load_arch_hparams (rope_yarn_log_mul /= "
        f"0.1f) and graph; {_YARN_FACTOR}, mscale = 1 (the DeepSeek-V2 case is LLM_ARCH_DEEPSEEK2's alone)")),
    "mistral3": YarnMultiplier(divisor=1.0, mscale_is_all=False, source=(
        f"src/models/mistral3.cpp, load_arch_hparams: get_key(LLM_KV_ROPE_SCALING_YARN_LOG_MUL); {_YARN_FACTOR}, "
        "mscale = 1")),
})


# (g) scaling computed at run time from the sequence length (transformers' dynamic NTK): llama.cpp has no such scaling
# and the converter writes none for it (on purpose: a GGUF key could only fix one length's frequencies). Such a file
# runs the unscaled frequencies, the model's own up to max_position_embeddings.
RUNTIME_SCALING = Convention(
    key="rope.scaling.type", value="none",
    says="has no RoPE scaling recomputed from the sequence length (its types are none, linear, yarn and longrope), "
         "and its converter writes none for it: the file runs the unscaled frequencies",
    source="include/llama.h, enum llama_rope_scaling_type; convert_hf_to_gguf.py, conversion/base.py, "
           "TextModel.set_gguf_parameters: rope_type \"dynamic\" writes nothing")


# (h) YaRN's correction range: ggml rounds it to whole dims always (transformers' truncate=True). A model made with
# truncate=false (gpt-oss) runs other frequencies in llama.cpp, and no GGUF key can say otherwise (vLLM and SGLang
# fixed the same rounding in their runtimes: vllm-project/vllm#27722, sgl-project/sglang#14270).
YARN_ROUNDING = Convention(
    key="rope.scaling.type",
    says="rounds YaRN's correction range to whole dims (the floor of its low end, the ceiling of its high end) "
         "whatever the model's truncate, and no GGUF key says otherwise",
    source="ggml/src/ggml.c, ggml_rope_yarn_corr_dims: start = floorf(...), end = ceilf(...)")


@dataclass(frozen=True)
class WrittenContext:
    """A context length the converter writes for a model whose scaling reads the parameter `reads`, whatever
    config.json's max_position_embeddings says (the model's own, by its makers' account): `says` completes "the
    converter ...", `source` where."""

    length: int
    reads: str
    says: str
    source: str


# (i) `general.architecture` → the context length its converter writes on purpose
WRITTEN_CONTEXT: Mapping[str, WrittenContext] = MappingProxyType({
    "hunyuan-dense": WrittenContext(
        256 * 1024, "alpha",
        says="writes 262144 for an NTK-alpha HunYuan model (its config.json says 32768; alpha 1000 is made for 256K, "
             "Hunyuan-A13B's technical report)",
        source="convert_hf_to_gguf.py, conversion/hunyuan.py, HunYuanModel.set_gguf_parameters: "
               "add_context_length(256 * 1024)"),
    "hunyuan-moe": WrittenContext(
        256 * 1024, "alpha",
        says="writes 262144 for an NTK-alpha HunYuan mixture of experts (Hunyuan-A13B: its config.json says 32768; "
             "alpha 1000 is made for 256K, its technical report)",
        source="convert_hf_to_gguf.py, conversion/hunyuan.py, HunYuanMoEModel.set_gguf_parameters: "
               "add_context_length(256 * 1024)"),
})


@dataclass(frozen=True)
class CompressedLayers:
    """An architecture whose layers with a KV compressor have a RoPE of their own (DeepSeek-V4): `ratios` the
    per-layer key of compression ratios (0: a layer without a compressor), `base` the key of the compressed layers'
    base. The layers without a compressor run rope.freq_base unscaled; the compressed ones run `base` with the file's
    scaling and attention factor 1 (llama.cpp divides ggml's YaRN factor out, as transformers' DeepseekV4Config sets
    attention_factor 1 for them). `main`, `compressed`: transformers' names of the two RoPEs (its rope_parameters'
    keys)."""

    ratios: str
    base: str
    main: str
    compressed: str
    source: str

    def note(self, arch: str, ratios: list[int], base: float | None) -> str:
        layers = sum(1 for ratio in ratios if ratio)
        return (f"{arch}.{self.ratios}: {layers} of {len(ratios)} layers compressed; llama.cpp gives them base "
                f"{arch}.{self.base} ({base:g}) with the file's scaling at attention factor 1, the others "
                f"rope.freq_base unscaled ({self.source})")


# (j) `general.architecture` → its compressed layers' RoPE
COMPRESSED_LAYERS: Mapping[str, CompressedLayers] = MappingProxyType({
    "deepseek4": CompressedLayers(
        ratios="attention.compress_ratios", base="attention.compress_rope_freq_base", main="main",
        compressed="compress",
        source="src/models/deepseek4.cpp, build_attn: use_compress_rope = dsv4_compress_ratios[il] != 0, "
               "freq_base_l = use_compress_rope ? dsv4_compress_rope_base : freq_base, freq_scale_l and ext_factor_l "
               "1 and 0 otherwise, attn_factor_l = dsv4_rope_attn_factor (1 / (1 + 0.1 ln(1 / freq_scale)) against "
               "ggml's rope_yarn)"),
})


# (k) `general.architecture` → its loader stretches rope.freq_base by rope.scaling.alpha when it loads the file
# (NTK-alpha: base · alpha^(d / (d − 2)), d the head size), where other converters write the stretched base
ALPHA_AT_LOAD: Mapping[str, str] = MappingProxyType({
    "hunyuan_vl": "src/models/hunyuan-vl.cpp, llama_model_hunyuan_vl::load_arch_hparams: rope_freq_base_train *= "
                  "powf(rope_scaling_alpha, dim / (dim - 2)), dim = n_embd_head_k()"})


# (l) `general.architecture` → its loader takes rope.scaling.finetuned as the switch of RoPE on every layer (absent:
# on): the Granite converters write false for a hybrid with Mamba layers (the released Granite-4 hybrids are NoPE)
ROPE_SWITCH_KEY = "rope.scaling.finetuned"
ROPE_SWITCH: Mapping[str, str] = MappingProxyType({
    arch: f"src/models/{path}, load_arch_hparams: get_key(LLM_KV_ROPE_SCALING_FINETUNED, rope_finetuned, false); "
          "std::fill(rope_pattern, rope_finetuned); graph: ggml_rope_ext only where has_rope(il)"
    for arch, path in (("granite", "granite.cpp"), ("granitehybrid", "granite-hybrid.cpp"),
                       ("graniteswitch", "granite-switch.cpp"))})
