"""What every model of the converter matrix goes through: its correct artifacts audited as correct (the config.json
and checkpoint transformers wrote, the GGUF llama.cpp's converter writes, the ONNX model onnxruntime-genai's builder
writes, each against the config.json and against the catalogue's preset of the real model), and mistakes made with
the tools themselves audited as wrong, the mistake named."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.converters.checkpoints import Model, edited_copy, rewrite_weights, save_checkpoint
from tests.converters.tools import (
    AuditRun,
    Row,
    audit_process,
    build_onnx,
    convert_to_gguf,
    llama_cpp,
    record,
    record_refusal,
    set_gguf_metadata,
)

Tool = Literal["convert_hf_to_gguf.py", "onnxruntime-genai builder"]
TOOL_OF = {".gguf": "convert_hf_to_gguf.py", ".onnx": "onnxruntime-genai builder", ".json": "save_pretrained",
           ".safetensors": "save_pretrained"}


def audited(model: Model, path: Path, reference: list[str], label: str, tool: str | None = None,
            mistake: str = "none") -> AuditRun:
    """`posenc audit PATH REFERENCE` in its own process, recorded in the matrix."""
    run = audit_process(path, reference)
    artifact = "config.json" if path.name == "config.json" else path.suffix.lstrip(".")
    record(Row(model.name, artifact, tool or TOOL_OF[path.suffix], mistake, label, run.verdict, sorted(run.mistakes),
               run.exit, run.seconds, run.peak_rss_mib))
    return run


def references(model: Model, checkpoint: Path) -> list[tuple[list[str], str]]:
    """The references an artifact is audited against: the checkpoint's config.json, and the preset where there is
    one."""
    refs = [(["--config", str(checkpoint / "config.json")], "config.json")]
    if model.preset:
        refs.append((["--preset", model.preset], f"preset {model.preset}"))
    return refs


def assert_correct(model: Model, checkpoint: Path, artifact: Path, tool: str | None = None) -> list[AuditRun]:
    """`artifact` audited as correct (exit status 0, no mistake) against every reference; a checkpoint that stores no
    position tensor (transformers >= 4.31 saves no inv_freq) is consistent, judged from its config.json. The audits,
    one per reference."""
    verdicts = ("correct", "consistent") if artifact.suffix == ".safetensors" else ("correct",)
    runs = []
    for reference, label in references(model, checkpoint):
        run = audited(model, artifact, reference, label, tool)
        assert run.exit == 0 and run.verdict in verdicts and not run.mistakes, (
            f"{artifact.name} against {label}: {run.verdict}, exit {run.exit}\n" + "\n".join(run.failing_facts())
            + run.stderr)
        runs.append(run)
    return runs


def assert_named(run: AuditRun, expected: set[str], what: str) -> None:
    """A wrong verdict (exit status 1) naming exactly the `expected` mistakes."""
    assert run.exit == 1 and run.verdict == "wrong" and run.mistakes == expected, (
        f"{what}: {run.verdict}, exit {run.exit}, named {sorted(run.mistakes)}, expected {sorted(expected)}\n"
        + "\n".join(run.failing_facts()) + run.stderr)


def without(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A config.json edit: `keys` removed from rope_parameters, as a user drops them before converting."""
    def edit(config: dict[str, Any]) -> dict[str, Any]:
        config = copy.deepcopy(config)
        params = config["rope_parameters"]
        for key in keys:
            params.pop(key, None)
        if "rope_type" in keys:
            params["rope_type"] = "default"  # transformers 5 writes a rope_type; unscaled is "default"
        return config
    return edit


def with_rope(**changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A config.json edit: rope_parameters' `changes` made, as a user edits them before converting."""
    def edit(config: dict[str, Any]) -> dict[str, Any]:
        return {**config, "rope_parameters": {**config["rope_parameters"], **changes}}
    return edit


def without_keys(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A config.json edit: top-level `keys` removed (a key transformers 5 writes that the hub's config.json lacks)."""
    def edit(config: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in config.items() if key not in keys}
    return edit


def swapped_longrope(config: dict[str, Any]) -> dict[str, Any]:
    """A config.json edit: longrope's short and long factors exchanged."""
    config = copy.deepcopy(config)
    params = config["rope_parameters"]
    params["short_factor"], params["long_factor"] = params["long_factor"], params["short_factor"]
    return config


@dataclass(frozen=True)
class Mistake:
    """A mistake made with a tool: config.json edited before the tool runs (`edit`), or the GGUF's metadata key
    `key` set to `value` by gguf_set_metadata.py after a correct conversion. `named`: the mistakes the audit of the
    artifact against the true config.json must name; `config_named`: those of the edited config.json itself."""

    label: str
    tool: Tool
    named: frozenset[str]
    edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    key: str | None = None
    value: Any = None
    config_named: frozenset[str] | None = None

    @property
    def id(self) -> str:
        return f"{'gguf' if self.tool.endswith('gguf.py') else 'onnx'}: {self.label}"


def check_mistake(model: Model, checkpoint: Path, correct_gguf: Path | None, folder: Path, mistake: Mistake) -> None:
    """Make `mistake` with the tool, then audit the artifact against the checkpoint's true config.json (and the
    preset): wrong, the mistake named."""
    if mistake.key is not None:
        assert correct_gguf is not None
        artifact = set_gguf_metadata(correct_gguf, folder / "edited.gguf", mistake.key, mistake.value)
        tool = "gguf_set_metadata.py"
    else:
        assert mistake.edit is not None
        edited = edited_copy(checkpoint, folder / "edited", mistake.edit)
        if mistake.config_named is not None:
            for reference, label in references(model, checkpoint):
                assert_named(audited(model, edited / "config.json", reference, label, mistake=mistake.label),
                             set(mistake.config_named), f"the edited config.json against {label}")
        if mistake.tool == "convert_hf_to_gguf.py":
            artifact = convert_to_gguf(edited, folder / "edited.gguf", model.pre_tokenizer, model.config_json)
        else:
            result = build_onnx(edited, folder / "onnx")
            assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
            artifact = folder / "onnx" / "model.onnx"
        tool = mistake.tool
    for reference, label in references(model, checkpoint):
        assert_named(audited(model, artifact, reference, label, tool, mistake.label), set(mistake.named),
                     f"{mistake.id} against {label}")


def gguf_base(arch: str, value: float) -> Mistake:
    """The GGUF's rope.freq_base overwritten with `value` (not the model's) after a correct conversion."""
    return Mistake(f"freq_base overwritten with {value:g}", "convert_hf_to_gguf.py", frozenset({"wrong_freq_base"}),
                   key=f"{arch}.rope.freq_base", value=value)


def gguf_size(arch: str, key: str, value: int, *named: str) -> Mistake:
    """The GGUF's size `key` (after `{arch}.`) overwritten with `value` after a correct conversion: `named` the
    mistakes the audit must name."""
    return Mistake(f"{key} overwritten with {value}", "convert_hf_to_gguf.py", frozenset(named),
                   key=f"{arch}.{key}", value=value)


@dataclass(frozen=True)
class Architecture:
    """One row of the architecture table (tests/converters/test_architectures.py): `model` the checkpoint, `gguf`
    the `general.architecture` llama.cpp's converter writes for it (None: the converter does not convert it),
    `onnx` whether onnxruntime-genai's builder builds it, `tokenizer` the vocabulary beside it (SentencePiece, or a
    byte-level BPE with `model.pre_tokenizer` declared; `-chat`: with a chat turn's special token), `mistakes` those
    planted in what the tools write. `onnx_refusal`: the builder's error where it refuses a model it claims (held
    as a test: a pin that lifts it fails, and the row's ONNX model is audited instead); `hub_config`: the config.json
    the converter is handed, as the hub holds it, where the one transformers 5 saves stops the converter (the GGUF is
    audited against both); `hub_weights`: the checkpoint's tensors as the hub stores them, where the converter reads
    only the hub's names and layout (the tensors transformers saved → those handed over); `gguf_divergence`,
    `onnx_divergence`: a tool's own divergence from the model that no input to it can avoid (the runtime computes
    other tables), which the audit must name instead of passing the artifact."""

    model: Model
    gguf: str | None = None
    onnx: bool = False
    tokenizer: Literal["sentencepiece", "byte-level", "byte-level-chat"] = "sentencepiece"
    mistakes: tuple[Mistake, ...] = ()
    onnx_refusal: str | None = None
    hub_config: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    hub_weights: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    gguf_divergence: frozenset[str] = frozenset()
    onnx_divergence: frozenset[str] = frozenset()

    @property
    def hf_architecture(self) -> str:
        """The class name config.json's `architectures` carries: what both tools dispatch on."""
        return self.model.model_class


class Built:
    """A module's checkpoints and artifacts, each written once, when a test first asks for it: under pytest-xdist's
    loadgroup each row's tests run on one worker (`conftest.pytest_collection_modifyitems`), which builds that row
    alone."""

    def __init__(self, folders: pytest.TempPathFactory, request: pytest.FixtureRequest) -> None:
        self.folders, self.request = folders, request
        self.done: dict[tuple[str, str], Path] = {}

    def _once(self, row: Architecture, what: str, make: Callable[[], Path]) -> Path:
        key = (row.model.name, what)
        if key not in self.done:
            self.done[key] = make()
        return self.done[key]

    def checkpoint(self, row: Architecture) -> Path:
        """The row's checkpoint, in a folder of the row's own (its artifacts beside it)."""
        fixture = f"{row.tokenizer.replace('-', '_')}_files"
        return self._once(row, "checkpoint", lambda: save_checkpoint(
            row.model, self.folders.mktemp(row.model.name) / "checkpoint", self.request.getfixturevalue(fixture)))

    def gguf(self, row: Architecture) -> Path:
        def convert() -> Path:
            checkpoint = self.checkpoint(row)
            handed = self.handed(row)
            return convert_to_gguf(handed, checkpoint.parent / f"{row.model.name}.gguf", row.model.pre_tokenizer,
                                   row.model.config_json)
        return self._once(row, "gguf", convert)

    def handed(self, row: Architecture) -> Path:
        """The checkpoint as the converter is handed it: the saved one, or the hub's form of it (`hub_config`,
        `hub_weights`)."""
        def hub_form() -> Path:
            checkpoint = self.checkpoint(row)
            folder = edited_copy(checkpoint, checkpoint.parent / "hub", row.hub_config or (lambda config: config))
            if row.hub_weights is not None:
                rewrite_weights(folder, row.hub_weights)
            return folder
        if row.hub_config is None and row.hub_weights is None:
            return self.checkpoint(row)
        return self._once(row, "hub", hub_form)

    def onnx(self, row: Architecture) -> Path:
        def build() -> Path:
            checkpoint = self.checkpoint(row)
            result = build_onnx(checkpoint, checkpoint.parent / "onnx")
            assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
            return checkpoint.parent / "onnx" / "model.onnx"
        return self._once(row, "onnx", build)


def assert_judged(model: Model, checkpoint: Path, artifact: Path, divergence: frozenset[str]) -> list[AuditRun]:
    """`artifact` audited correct against every reference, or, where its tool diverges from the model
    (`divergence`), wrong with exactly that named."""
    if not divergence:
        return assert_correct(model, checkpoint, artifact)
    runs = [audited(model, artifact, reference, label) for reference, label in references(model, checkpoint)]
    for run, (_, label) in zip(runs, references(model, checkpoint), strict=True):
        assert_named(run, set(divergence), f"{artifact.name}, the tool's own divergence, against {label}")
    return runs


def check_correct(row: Architecture, built: Built) -> None:
    """The row's config.json and every artifact its tools write, audited correct against the config.json and the
    preset, and the GGUF and the saved config.json against the hub's config.json the converter was handed where
    the row has one; the GGUF of the architecture the row names. (Its safetensors, where transformers 5 stores no
    position tensor, is judged from the config.json alone: the other modules audit that once per tool.)"""
    checkpoint = built.checkpoint(row)
    assert_correct(row.model, checkpoint, checkpoint / "config.json")
    if row.gguf is not None:
        for run in assert_judged(row.model, checkpoint, built.gguf(row), row.gguf_divergence):
            found = (run.report or {}).get("found", {})
            assert found.get("architecture") == row.gguf, found
        if row.hub_config is not None:  # the config.json the converter read, as the hub holds it: read alike
            hub = built.handed(row) / "config.json"
            for artifact in (built.gguf(row), checkpoint / "config.json"):
                run = audited(row.model, artifact, ["--config", str(hub)], "the hub's config.json")
                divergence = row.gguf_divergence if artifact.suffix == ".gguf" else frozenset()
                if divergence:
                    assert_named(run, set(divergence), f"{artifact.name} against the hub's config.json")
                else:
                    assert run.exit == 0 and run.verdict == "correct" and not run.mistakes, (
                        f"{artifact.name} against the hub's config.json: {run.verdict}, exit {run.exit}\n"
                        + "\n".join(run.failing_facts()) + run.stderr)
    if row.onnx:
        assert_judged(row.model, checkpoint, built.onnx(row), row.onnx_divergence)
    if row.onnx_refusal is not None:
        result = build_onnx(checkpoint, checkpoint.parent / "onnx")
        assert result.returncode != 0 and row.onnx_refusal in result.stderr, result.stderr[-3000:]
        record_refusal(row.model, "onnxruntime-genai builder",
                       result.stderr.strip().splitlines()[-1].replace(str(checkpoint), row.model.name))


# What each tool of the pinned versions dispatches on: the class names llama.cpp's converter registers
# (`@ModelBase.register(...)` in convert_hf_to_gguf.py's `conversion` package) and those onnxruntime-genai's builder
# compares `config.architectures[0]` with (onnxruntime_genai/models/builder.py), read from their sources.
_REGISTER = re.compile(r"@ModelBase\.register\(([^)]*)\)")
_BUILDER = re.compile(r"config\.architectures\[0\] == \"(\w+)\"")


@functools.cache
def converter_architectures() -> frozenset[str]:
    folder = llama_cpp()
    sources = [folder / "convert_hf_to_gguf.py", *sorted((folder / "conversion").glob("*.py"))]
    return frozenset(name for path in sources if path.is_file() for args in _REGISTER.findall(path.read_text())
                     for name in re.findall(r"\"(\w+)\"", args))


@functools.cache
def builder_architectures() -> frozenset[str]:
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime_genai")
    assert spec is not None and spec.submodule_search_locations
    source = Path(next(iter(spec.submodule_search_locations))) / "models" / "builder.py"
    return frozenset(_BUILDER.findall(source.read_text()))


@dataclass(frozen=True)
class Unsupported:
    """An architecture the matrix leaves out: `architecture` its transformers class (config.json's `architectures`,
    what both tools dispatch on), `reason` why. `converter`, `builder`: whether the tool supports it (checked
    against its registry); `no_model_class`: transformers has no model class to write its checkpoint with (checked
    against transformers)."""

    name: str
    architecture: str
    reason: str
    converter: bool = False
    builder: bool = False
    no_model_class: bool = False


def assert_unsupported(entry: Unsupported) -> None:
    """The reason `entry` is left out still holds at the pinned versions: a tool that comes to support it, or a
    transformers that comes to have its class, fails this (and the architecture gets a row)."""
    assert (entry.architecture in converter_architectures()) == entry.converter, (
        f"{entry.name}: the converter {'no longer' if entry.converter else 'now'} registers {entry.architecture}")
    assert (entry.architecture in builder_architectures()) == entry.builder, (
        f"{entry.name}: the builder {'no longer' if entry.builder else 'now'} builds {entry.architecture}")
    if entry.no_model_class:
        import transformers

        assert not hasattr(transformers, entry.architecture), (
            f"{entry.name}: transformers now has {entry.architecture}: write its checkpoint and give it a row")


def assert_tools_claim(row: Architecture) -> None:
    """What the row says each tool supports is what the tool's registry says: a tool that drops the row's
    architecture, or comes to claim one the row says it lacks, fails this."""
    assert (row.hf_architecture in converter_architectures()) == (row.gguf is not None), row.model.name
    claimed = row.onnx or row.onnx_refusal is not None
    assert (row.hf_architecture in builder_architectures()) == claimed, row.model.name
