"""The third-party tools of the converter matrix, run as their users run them, and `posenc audit` run on what they
write, each in a process of its own.

The tools: llama.cpp's `convert_hf_to_gguf.py` and gguf-py's `gguf_set_metadata.py` from the pinned llama-cpp-python
source distribution (the folder POSENC_LLAMA_CPP names; scripts/converter-matrix-test.sh fills it), and
onnxruntime-genai's builder (`python -m onnxruntime_genai.models.builder`). A tool that is not there skips the tests
that need it, or fails them where POSENC_REQUIRE_CONVERTERS=1 (the script sets it: there a missing tool is a broken
step, not a reason to pass). Every audit is recorded (artifact, tool, reference, verdict, exit status, wall time,
the audit process's peak RSS) for the matrix the session writes to POSENC_CONVERTER_MATRIX_REPORT.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "POSENC_REQUIRE_CONVERTERS"
LLAMA_CPP_ENV = "POSENC_LLAMA_CPP"
REPORT_ENV = "POSENC_CONVERTER_MATRIX_REPORT"
TOOL_TIMEOUT = 300  # seconds for one conversion or build (each takes about 10 s on two cores)
AUDIT_TIMEOUT = 120


def llama_cpp() -> Path:
    """The llama.cpp folder of the pinned source distribution: convert_hf_to_gguf.py, its `conversion` package and
    gguf-py (POSENC_LLAMA_CPP, else where the script caches it)."""
    named = os.environ.get(LLAMA_CPP_ENV)
    if named:
        return Path(named)
    cached = sorted((ROOT / ".cache" / "converters").glob("llama.cpp-*"))
    return cached[-1] if cached else ROOT / ".cache" / "converters" / "llama.cpp"


def unavailable(reason: str) -> None:
    """A tool the test needs is missing: a failure where the converter matrix is required, a skip elsewhere."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} (POSENC_REQUIRE_CONVERTERS=1: scripts/converter-matrix-test.sh installs it)")
    pytest.skip(reason)


def need_modules(*names: str) -> None:
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        unavailable(f"not importable: {', '.join(missing)}")


def need_llama_cpp() -> Path:
    """The llama.cpp folder, its converter and what the converter imports, or the test is skipped (failed)."""
    need_modules("torch", "transformers", "sentencepiece", "gguf")
    folder = llama_cpp()
    if not (folder / "convert_hf_to_gguf.py").is_file():
        unavailable(f"llama.cpp's convert_hf_to_gguf.py is not in {folder} (set {LLAMA_CPP_ENV})")
    return folder


def need_builder() -> None:
    need_modules("torch", "transformers", "onnxruntime_genai")


def run_tool(args: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """A tool's command, which must succeed (the failure shows the end of its output)."""
    result = subprocess.run(args, capture_output=True, text=True, timeout=TOOL_TIMEOUT)
    if result.returncode != 0:
        raise AssertionError(f"{what} failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
    return result


# The converter, launched with two of its steps changed where a checkpoint needs it (the audit reads neither):
# - `pre`: a byte-level BPE vocabulary trained here has no pre-tokenizer hash llama.cpp knows (the converter hashes
#   the token ids of a probe text to recognise a released model's pre-tokenizer, and refuses any other), so the
#   pre-tokenizer of the real model is declared;
# - `config_json`: the converter reads a checkpoint's hyperparameters through transformers' AutoConfig (to_dict),
#   which in transformers 5 drops keys of the hub's config.json that it renamed (GPT-NeoX's `rotary_pct`), keys the
#   converter still reads (its requirements pin transformers 4.57); made to fail, AutoConfig leaves the converter to
#   its own fallback, config.json read as it is (only the converter's own read: AutoTokenizer reads the config too).
LAUNCHER_CONVERT = """
import runpy, sys
folder, pre, config_json = sys.argv[1:4]
sys.path[:0] = [folder, folder + "/gguf-py"]
from conversion import base
if pre:
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
if config_json == "1":
    auto_config = base.AutoConfig.from_pretrained
    def refuse(*args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__") == "conversion.base":
            raise ValueError("config.json read as it is")
        return auto_config(*args, **kwargs)
    base.AutoConfig.from_pretrained = refuse
sys.argv = [folder + "/convert_hf_to_gguf.py", *sys.argv[4:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def converter_command(checkpoint: Path, out: Path, pre_tokenizer: str | None = None,
                      config_json: bool = False) -> list[str]:
    """`convert_hf_to_gguf.py CHECKPOINT --outfile OUT --outtype f16` (the pinned llama.cpp); through the launcher
    above where a step is changed."""
    folder = need_llama_cpp()
    args = [str(checkpoint), "--outfile", str(out), "--outtype", "f16"]
    if pre_tokenizer is None and not config_json:
        return [sys.executable, str(folder / "convert_hf_to_gguf.py"), *args]
    return [sys.executable, "-c", LAUNCHER_CONVERT, str(folder), pre_tokenizer or "", "1" if config_json else "0",
            *args]


def convert_to_gguf(checkpoint: Path, out: Path, pre_tokenizer: str | None = None, config_json: bool = False) -> Path:
    run_tool(converter_command(checkpoint, out, pre_tokenizer, config_json), "convert_hf_to_gguf.py")
    return out


def set_gguf_metadata(source: Path, out: Path, key: str, value: Any) -> Path:
    """A copy of `source` with one metadata value changed by gguf-py's `gguf_set_metadata.py KEY VALUE --force`."""
    folder = need_llama_cpp()
    shutil.copyfile(source, out)
    script = folder / "gguf-py" / "gguf" / "scripts" / "gguf_set_metadata.py"
    run_tool([sys.executable, str(script), str(out), key, str(value), "--force"], "gguf_set_metadata.py")
    return out


def build_onnx(checkpoint: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`python -m onnxruntime_genai.models.builder -i CHECKPOINT -o OUT -p fp32 -e cpu`; the result, success or not
    (a builder that does not support an architecture says so)."""
    need_builder()
    return subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o",
                           str(out), "-p", "fp32", "-e", "cpu", "-c", str(out.parent / f"{out.name}-cache")],
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT)


@dataclass
class AuditRun:
    """One `posenc audit FILE --json` process: its exit status, report, wall time and peak resident memory."""

    exit: int
    report: dict[str, Any] | None
    stderr: str
    seconds: float
    peak_rss_mib: float

    @property
    def verdict(self) -> str:
        return "unreadable" if self.report is None else str(self.report["verdict"])

    @property
    def mistakes(self) -> set[str]:
        return set() if self.report is None else set(self.report["mistakes"])

    def failing_facts(self) -> list[str]:
        """The failing facts, for a failure message."""
        sections = [self.report or {}, *((self.report or {}).get("layer_types") or [])]
        return [f"{f['name']}: {f['verdict']} {f.get('mistake')} {f.get('explanation')}" for section in sections
                for f in section.get("facts", []) if f["verdict"] in ("wrong", "missing")]


# A lean process that starts each audit and reaps it with wait4: an audit forked straight from pytest would count
# pytest's resident set (torch, transformers, the models) as its own until it execs (the kernel keeps the larger
# high-water mark across exec), so its peak RSS would be pytest's, not the audit's. Forked from this launcher, an
# audit starts from the launcher's few MiB. One JSON line in (the command, the timeout), one out.
LAUNCHER = """
import json, os, subprocess, sys, tempfile, threading, time
for line in sys.stdin:
    args, timeout = json.loads(line)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        _, status, usage = os.wait4(process.pid, 0)
        timer.cancel()
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        print(json.dumps({"exit": process.returncode, "seconds": seconds, "maxrss_kib": usage.ru_maxrss,
                          "stdout": out.read().decode(errors="replace"),
                          "stderr": err.read().decode(errors="replace")}), flush=True)
"""
_launcher: subprocess.Popen[str] | None = None


def _launched(args: list[str]) -> dict[str, Any]:
    global _launcher
    if _launcher is None or _launcher.poll() is not None:
        _launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT)
        atexit.register(_launcher.kill)
    assert _launcher.stdin is not None and _launcher.stdout is not None
    _launcher.stdin.write(json.dumps([args, AUDIT_TIMEOUT]) + "\n")
    _launcher.stdin.flush()
    done: dict[str, Any] = json.loads(_launcher.stdout.readline())
    return done


def audit_process(path: Path, reference: list[str]) -> AuditRun:
    """`python -m posenc.service.cli audit PATH --json REFERENCE...` in a process of its own, started by the
    launcher above and reaped with wait4 for its own resource usage (ru_maxrss: its peak resident set, KiB)."""
    done = _launched([sys.executable, "-m", "posenc.service.cli", "audit", str(path), "--json", *reference])
    report = json.loads(done["stdout"]) if done["exit"] in (0, 1) else None
    return AuditRun(done["exit"], report, done["stderr"], done["seconds"], done["maxrss_kib"] / 1024)


@dataclass
class Row:
    """One line of the matrix: an audit, or a tool's refusal (`exit` None: no artifact, no audit)."""

    model: str
    artifact: str
    tool: str
    mistake: str
    reference: str
    verdict: str
    named: list[str] = field(default_factory=list)
    exit: int | None = None
    seconds: float = 0.0
    peak_rss_mib: float = 0.0


def records_path() -> Path | None:
    report = os.environ.get(REPORT_ENV)
    return Path(report + ".jsonl") if report else None


def record(row: Row) -> None:
    """Append `row` to the session's records (one JSON line in one write: whole, whichever process appends), where
    a report is asked for."""
    path = records_path()
    if path is not None:
        with path.open("a") as out:
            out.write(json.dumps(asdict(row)) + "\n")


def record_refusal(model: Any, tool: str, error: str) -> None:
    """A tool that refused the model: a line of the matrix with its error and no audit."""
    record(Row(model.name, "—", tool, f"refused: {error[:200]}", "—", "—"))


def write_report(path: Path) -> None:
    """The recorded rows as a markdown table at `path`, by model (the script prints it)."""
    records = records_path()
    rows = [json.loads(line) for line in records.read_text().splitlines()] if records and records.exists() else []
    rows.sort(key=lambda row: row["model"])
    lines = ["| model | artifact | tool | mistake made | reference | verdict | named | exit | s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = ("—", "—", "—") if r["exit"] is None else (r["exit"], f"{r['seconds']:.2f}",
                                                               f"{r['peak_rss_mib']:.0f}")
        lines.append(f"| {r['model']} | {r['artifact']} | {r['tool']} | {r['mistake']} | {r['reference']} | "
                     f"{r['verdict']} | {', '.join(r['named']) or '—'} | {' | '.join(map(str, measured))} |")
    audits = [r for r in rows if r["exit"] is not None]
    lines.append(f"\n{len(audits)} audits in {sum(r['seconds'] for r in audits):.1f} s, the largest peak RSS "
                 f"{max((r['peak_rss_mib'] for r in audits), default=0.0):.0f} MiB; "
                 f"{len(rows) - len(audits)} refusals by the tools")
    path.write_text("\n".join(lines) + "\n")
