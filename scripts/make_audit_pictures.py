"""Regenerate the audit pictures in docs/img/ and print the reports docs/audit.md shows (no server, no downloads).

    .venv/bin/python scripts/make_audit_pictures.py          # from the repository root (needs the audit extra)

Each example file is written here the way the tests write theirs (tests/audit_files.py): a Llama-3.1 GGUF
without its frequency factors, an onnxruntime-genai export whose caches stop short of the context, a checkpoint
whose inv_freq buffers have another base, and a Llama-3.1 config.json that lost its rope_scaling. Each picture is
what `posenc audit FILE --png PATH` writes (and `POST /v1/audit?format=png` answers).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from posenc.models.presets import find_preset  # noqa: E402
from posenc.models.rope import inv_freq_and_attention_factor  # noqa: E402
from posenc.models.rope_config import rope_parameters_from_config  # noqa: E402
from posenc.service.audit.report import picture, text  # noqa: E402
from posenc.service.audit.run import parse_config, read_path, run  # noqa: E402
from posenc.service.settings import Settings  # noqa: E402
from tests.audit_files import SMALL_LLAMA3, caches_of, genai_onnx, llama_gguf_meta, write_gguf  # noqa: E402


def examples(folder: Path) -> list[tuple[str, Path, list[str], dict[str, object] | None]]:
    """(picture name, file, the command's options, the --config document) of each worked example."""
    gguf = write_gguf(folder / "Llama-3.1-8B-Q4_K_M.gguf", "llama", llama_gguf_meta(131072, 500000.0))
    cos, sin = caches_of(SMALL_LLAMA3, 1024)
    onnx = folder / "model.onnx"
    onnx.write_bytes(genai_onnx(cos, sin))
    (folder / "config.json").write_text(json.dumps(SMALL_LLAMA3))
    params, _ = rope_parameters_from_config(SMALL_LLAMA3)
    wrong, _ = inv_freq_and_attention_factor(dataclasses.replace(params, rope_theta=10000.0))
    checkpoint = folder / "model.safetensors"
    save_file({f"model.layers.{i}.self_attn.rotary_emb.inv_freq": wrong for i in range(4)}, str(checkpoint))
    lost = folder / "llama-3.1-config.json"
    lost.write_text(json.dumps({k: v for k, v in find_preset("llama-3.1-8b").config.items() if k != "rope_scaling"}))
    return [("audit-gguf.png", gguf, ["--preset", "llama-3.1-8b"], None),
            ("audit-onnx.png", onnx, ["--config", "config.json"], SMALL_LLAMA3),
            ("audit-safetensors.png", checkpoint, ["--config", "config.json"], SMALL_LLAMA3),
            ("audit-config.png", lost, ["--preset", "llama-3.1-8b"], None)]


def main() -> int:
    out = ROOT / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, options, config in examples(Path(tmp)):
            preset = options[1] if options[:1] == ["--preset"] else None
            result = run(read_path(path, Settings()), preset, parse_config(json.dumps(config)) if config else None)
            (out / name).write_bytes(picture(result, path.name))
            print(f"$ posenc audit {path.name} {' '.join(options)}".rstrip())
            print(text(result.document(), path.name))
            print(f"(exit status {1 if result.verdict == 'wrong' else 0}; docs/img/{name})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
