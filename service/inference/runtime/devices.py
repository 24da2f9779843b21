"""The execution providers, how much memory they have (the CUDA device's, or the RAM of this process), and host
memory pinned for the CUDA device."""

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
# cudaHostRegister flags (cuda_runtime_api.h): pinned for every context; the memory may be mapped read-only
HOST_REGISTER_PORTABLE, HOST_REGISTER_READ_ONLY = 0x01, 0x08


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


def cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library onnxruntime-gpu uses (the nvidia-* wheels' if installed), or None."""
    preload = getattr(ort, "preload_dlls", None)  # loads the CUDA runtime of the nvidia-* wheels, if installed
    if preload is not None and CUDA in ort.get_available_providers():
        try:
            preload(cuda=True, cudnn=False, msvc=False)
        except Exception:  # best effort: the system library may still be found below
            log.debug("onnxruntime.preload_dlls failed", exc_info=True)
    for name in CUDA_RUNTIME_NAMES:
        try:
            return ctypes.CDLL(name)  # the library already loaded under that name, if onnxruntime loaded it
        except OSError:
            continue
    return None


def cuda_memory_info(device_id: int = 0) -> tuple[int, int] | None:
    """(free, total) bytes of CUDA device `device_id`, the whole device's (every process); None: no runtime or
    no such device."""
    runtime = cuda_runtime()
    if runtime is None or runtime.cudaSetDevice(device_id) != 0:
        return None
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if runtime.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        return None
    return int(free.value), int(total.value)


def cuda_memory_bytes(device_id: int = 0) -> int | None:
    """Total memory of CUDA device `device_id` from the CUDA runtime onnxruntime-gpu uses (None: no runtime)."""
    info = cuda_memory_info(device_id)
    return info[1] if info is not None else None


class HostPinning:
    """Page-locks host memory for the CUDA device (`cudaHostRegister`), so copies between it and the device are
    one DMA each instead of a copy through the driver's staging buffer.

    Registered shared memory that the server maps is pinned while registered: inputs then reach the device
    and outputs come back with one copy each, straight from and into the region."""

    def __init__(self, runtime: ctypes.CDLL) -> None:
        self.runtime = runtime
        self.runtime.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        self.runtime.cudaHostUnregister.argtypes = [ctypes.c_void_p]

    @classmethod
    def open(cls) -> HostPinning | None:
        """Pinning through the CUDA runtime onnxruntime uses; None without one."""
        runtime = cuda_runtime()
        return cls(runtime) if runtime is not None else None

    def pin(self, address: int, size: int, read_only: bool) -> bool:
        """Page-lock [address, address + size) for every CUDA context; False when the driver refuses (the memory
        stays pageable: copies still work, through the staging buffer)."""
        flags = HOST_REGISTER_PORTABLE | (HOST_REGISTER_READ_ONLY if read_only else 0)
        code = self.runtime.cudaHostRegister(address, size, flags)
        if code != 0:
            self.runtime.cudaGetLastError()  # clear the sticky error so the next runtime call does not report it
            log.info("cudaHostRegister of %d bytes failed (CUDA error %d): copied through the staging buffer",
                     size, code)
        return code == 0

    def unpin(self, address: int) -> None:
        """Make memory pinned by `pin` pageable again (before it is unmapped)."""
        if self.runtime.cudaHostUnregister(address) != 0:
            self.runtime.cudaGetLastError()
            log.warning("cudaHostUnregister at %#x failed", address)
