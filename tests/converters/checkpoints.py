"""The checkpoints of the converter matrix: tiny random models written by transformers' `save_pretrained`, with the
real models' position settings (base, scaling, layer types, partial rotary) and, where the catalogue has the model,
its attention sizes (hidden size, heads, head size), so that the artifacts are audited against the preset too; one
or two layers, a 64-wide MLP and a 512-token vocabulary keep each under about 100 MB.

The vocabularies are real ones, trained here on the repository's documentation: a SentencePiece BPE model (what
llama.cpp's converter reads for Llama, Phi-3, Qwen2 and Gemma) and a byte-level BPE (GPT-2, Phi-2, GPT-NeoX).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.converters.tools import ROOT

VOCAB = 512
# the small sizes of a checkpoint without a preset: four heads of 64 channels, two KV heads
SMALL = dict(vocab_size=VOCAB, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)


@dataclass(frozen=True)
class Model:
    """A tiny checkpoint to write: `config` the keyword arguments of transformers' `config_class`, `hub_keys` keys
    the real model's config.json carries that transformers 5 no longer writes (added to the saved config.json),
    `config_json` whether the converter must read config.json as it is (`tools.LAUNCHER_CONVERT`: its AutoConfig
    drops a key it needs), `preset` the catalogue's preset of the real model (None: none), `pre_tokenizer` the
    llama.cpp pre-tokenizer of a byte-level BPE vocabulary (None: SentencePiece)."""

    name: str
    config_class: str
    model_class: str
    config: Mapping[str, Any]
    preset: str | None = None
    pre_tokenizer: str | None = None
    hub_keys: Mapping[str, Any] = field(default_factory=dict)
    config_json: bool = False


def _documentation_lines() -> list[str]:
    return [line for path in sorted((ROOT / "docs").glob("*.md")) for line in path.read_text().splitlines()
            if line.strip()]


def sentencepiece_tokenizer(folder: Path) -> Path:
    """A SentencePiece BPE model of VOCAB pieces (byte fallback, <unk> <s> </s>) trained on the documentation, and
    the tokenizer files transformers makes of it (tokenizer.json, tokenizer_config.json: LlamaTokenizer)."""
    import sentencepiece
    import transformers

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(_documentation_lines()), model_writer=model,
                                             vocab_size=VOCAB, model_type="bpe", byte_fallback=True,
                                             minloglevel=2, num_threads=1)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == VOCAB, len(tokenizer)
    tokenizer.save_pretrained(folder)
    return folder


def byte_level_tokenizer(folder: Path, specials: tuple[str, ...] = ("<|endoftext|>",)) -> Path:
    """A byte-level BPE of VOCAB tokens (GPT-2's pre-tokenizer, the special tokens `specials`) trained on the
    documentation, saved by transformers (tokenizer.json, tokenizer_config.json: GPT2Tokenizer)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(_documentation_lines(), trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=list(specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer = transformers.GPT2Tokenizer(tokenizer_object=bpe)
    assert len(tokenizer) == VOCAB, len(tokenizer)
    tokenizer.save_pretrained(folder)
    return folder


def save_checkpoint(model: Model, folder: Path, tokenizer: Path) -> Path:
    """`model` with random weights (seeded, bfloat16) saved by `save_pretrained` into `folder`, with the tokenizer's
    files beside it."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, model.config_class)(**model.config)
    network = getattr(transformers, model.model_class)(config).to(torch.bfloat16)
    network.save_pretrained(folder)
    for path in tokenizer.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    if model.hub_keys:
        edit_config(folder, lambda config: {**config, **model.hub_keys})
    return folder


def read_config(folder: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return loaded


def edit_config(folder: Path, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    (folder / "config.json").write_text(json.dumps(edit(read_config(folder)), indent=2))


def edited_copy(checkpoint: Path, folder: Path, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> Path:
    """The checkpoint with its config.json changed by `edit` (the weights and tokenizer linked, not copied): what a
    user who edited config.json before converting hands the tool."""
    folder.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.is_file() and path.name != "config.json":
            os.symlink(path, folder / path.name)
    (folder / "config.json").write_text(json.dumps(edit(read_config(checkpoint)), indent=2))
    return folder


def rewrite_weights(folder: Path, rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """`folder`'s model.safetensors (a link to the saved one) replaced by a file of its tensors as `rewrite` gives
    them: the hub's names and layout."""
    import safetensors.torch

    path = folder / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    path.unlink()
    safetensors.torch.save_file(rewrite(tensors), str(path), metadata={"format": "pt"})
