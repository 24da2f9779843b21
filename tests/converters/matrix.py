"""What every model of the converter matrix goes through: its correct artifacts audited as correct (the config.json
and checkpoint transformers wrote, the GGUF llama.cpp's converter writes, the ONNX model onnxruntime-genai's builder
writes, each against the config.json and against the catalogue's preset of the real model), and mistakes made with
the tools themselves audited as wrong, the mistake named."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tests.converters.checkpoints import Model, edited_copy
from tests.converters.tools import AuditRun, Row, audit_process, build_onnx, convert_to_gguf, record, set_gguf_metadata

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


def assert_correct(model: Model, checkpoint: Path, artifact: Path, tool: str | None = None) -> None:
    """`artifact` audited as correct (exit status 0, no mistake) against every reference; a checkpoint that stores no
    position tensor (transformers >= 4.31 saves no inv_freq) is consistent, judged from its config.json."""
    verdicts = ("correct", "consistent") if artifact.suffix == ".safetensors" else ("correct",)
    for reference, label in references(model, checkpoint):
        run = audited(model, artifact, reference, label, tool)
        assert run.exit == 0 and run.verdict in verdicts and not run.mistakes, (
            f"{artifact.name} against {label}: {run.verdict}, exit {run.exit}\n" + "\n".join(run.failing_facts())
            + run.stderr)


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
