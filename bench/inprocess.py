"""The in-process anchors of the inference benchmarks: onnxruntime as a user would run it in-process (default
session options), I/O binding on CUDA, and torch eager (the module the graphs were exported from; optional)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from bench.harness import model_config, repository
from posenc.models.graph_rule import STANDARD_FILE, cpu_forms_of, file_for

CUDA = "CUDAExecutionProvider"


def require_cuda() -> None:
    """--device cuda: onnxruntime-gpu with a CUDA provider and a CUDA device for torch, or a clear exit."""
    problems = []
    if CUDA not in ort.get_available_providers():
        problems.append(f"onnxruntime {ort.__version__} has no {CUDA} (install onnxruntime-gpu)")
    try:
        import torch
        if not torch.cuda.is_available():
            problems.append("torch sees no CUDA device")
    except ImportError:
        problems.append("torch is not installed (the torch eager column runs on the device too)")
    if problems:
        raise SystemExit("--device cuda: " + "; ".join(problems))


def model_file(model: str, device: str, seq: int) -> str:
    """The graph the server runs for a sequence of `seq` on `device`: on the CPU, the one config.json's rule names
    for `seq` (the run's calibrated repository: bench/harness.py `calibrated_repository`; the servers pin that
    rule, POSENC_CPU_FORM_FROM=config), else model.onnx (posenc.service.inference.runtime.graph_forms)."""
    rule = cpu_forms_of(model_config(model))[1]
    if device != "cpu" or rule is None:
        return STANDARD_FILE
    return file_for(rule, seq)


LEVELS = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def ort_session_at(path: str, threads: int = 0, config: dict[str, str] | None = None,
                   level: str | None = None) -> ort.InferenceSession:
    """A CPU session on the graph at `path` with onnxruntime's default options but `threads` intra-op threads
    (0: its own default), the session config entries `config` and the optimization `level` (LEVELS)."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if level:
        options.graph_optimization_level = LEVELS[level]
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def graph_path(model: str, device: str = "cpu", seq: int = 0) -> str:
    """The file of the graph the server runs for `model` at a sequence of `seq` on `device`."""
    return str(repository() / model / model_file(model, device, seq))


def ort_session(model: str, device: str = "cpu", seq: int = 0) -> ort.InferenceSession:
    """The anchor: a session with onnxruntime's default options (its own thread pool size, spinning on), as a
    user running the model in-process gets it, on the graph the server runs for a sequence of `seq`
    (`model_file`); the CUDA provider first with device cuda. The server chooses its own options
    (service/inference/runtime/repository.py); the anchor never copies them."""
    options = ort.SessionOptions()
    providers = [CUDA, "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    path = repository() / model / model_file(model, device, seq)
    session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    if device == "cuda" and session.get_providers()[0] != CUDA:
        raise SystemExit(f"--device cuda: onnxruntime did not put {model} on {CUDA}: {session.get_providers()}")
    return session


def ort_call(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> Callable[[], object]:
    """One `session.run` with numpy in and out."""
    return lambda: session.run(["output"], inputs)


def io_binding_call(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> Callable[[], object]:
    """onnxruntime with inputs and output as OrtValues on the GPU, bound once (no host copies per call)."""
    binding = session.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0) for name, array in inputs.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    output = ort.OrtValue.ortvalue_from_shape_and_type(list(inputs["query"].shape), np.float32, "cuda", 0)
    binding.bind_ortvalue_output("output", output)

    def call() -> object:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return output
    return call


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def torch_call(model: str, inputs: dict[str, np.ndarray], device: str, threads: int) -> Callable[[], object] | None:
    """The torch module `model` was exported from, eager, on `device` with `threads` threads (0: torch's default);
    None without torch."""
    try:
        import torch

        from posenc.models.export.exporter import default_specs
    except ImportError:
        return None
    if threads:
        torch.set_num_threads(threads)
    spec = {s.name: s for s in default_specs()}[model]
    module = spec.module().to(device).eval()
    tensors = [torch.from_numpy(inputs[k]).to(device) for k in ("query", "key", "value", "position_ids")]

    def call() -> object:
        with torch.no_grad():
            out = module(*tensors)
        if device == "cuda":
            torch.cuda.synchronize()
        return out
    return call
