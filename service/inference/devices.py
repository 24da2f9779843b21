"""The execution providers and how much memory they have: the CUDA device's, or the RAM of this process."""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import onnxruntime as ort

log = logging.getLogger("posenc.inference.devices")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
CUDA_RUNTIME_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12")


def process_memory_bytes() -> int:
    """Memory this process may use: the cgroup (v2 or v1) limit if set and smaller, else physical RAM."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(physical, int(text))
    return physical


def cuda_memory_bytes(device_id: int = 0) -> int | None:
    """Total memory of CUDA device `device_id` from the CUDA runtime onnxruntime-gpu uses (None: no runtime)."""
    preload = getattr(ort, "preload_dlls", None)  # loads the CUDA runtime of the nvidia-* wheels, if installed
    if preload is not None and CUDA in ort.get_available_providers():
        try:
            preload(cuda=True, cudnn=False, msvc=False)
        except Exception:  # best effort: the system library may still be found below
            log.debug("onnxruntime.preload_dlls failed", exc_info=True)
    for name in CUDA_RUNTIME_NAMES:
        try:
            runtime = ctypes.CDLL(name)
        except OSError:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if runtime.cudaSetDevice(device_id) != 0:
            continue
        if runtime.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0:
            return int(total.value)
    return None
