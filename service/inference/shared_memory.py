"""System shared memory (the Triton / KServe v2 `system_shared_memory` extension): the registry of regions.

A client on this host creates a POSIX shared-memory object (`shm_open`: a file under /dev/shm), registers a
region of it under a name (`key`, `offset`, `byte_size`), and names that region in infer requests: inputs are
numpy views of the mapping (their bytes never cross the socket); requested outputs are written into it, by
the model itself where it can (`output_array`), else copied in after the run (`write_output`).

The server maps memory that another process controls, so:
* a key is a shared-memory object name (`name` or `/name`: letters, digits, `_`, `-`, `.`, no leading dot),
  never a path; it is opened under /dev/shm with O_NOFOLLOW and must be a regular file;
* a region must lie inside the object when registered, and every tensor inside its region;
* before every read or write, the object's current size is checked (fstat) against the region: an object
  the client truncated after registering is a 400, not a SIGBUS on a page past its new end. (A truncation
  while a model reads its inputs cannot be seen this way; see the README, "Shared memory".)
* unregistering removes the name at once and closes the mapping; one that a request in flight still views
  (mmap refuses to close while arrays export its buffer) is closed at the next register or unregister after
  that, and every mapping at shutdown.

Triton's behaviour is followed where the protocol leaves room: registering a name twice is a 400, the
status of an unknown name a 404, unregistering an unknown name succeeds and changes nothing.
"""

from __future__ import annotations

import errno
import logging
import math
import mmap
import os
import re
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import BadRequest, NotFound, echo
from service.inference.kserve import SHARED_MEMORY_OFF, ShmRef

log = logging.getLogger("posenc.inference.shared_memory")

SHM_DIR = "/dev/shm"
MAX_KEY_LENGTH = 255  # NAME_MAX of the file under /dev/shm
MAX_NAME_LENGTH = 255
MAX_REGIONS = 1024
_KEY_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_REGISTER_KEYS = {"key", "offset", "byte_size"}


def shm_file(key: Any) -> str:
    """The file of shared-memory object `key` (`name` or `/name`, as shm_open takes it); 400 for anything else."""
    if not isinstance(key, str):
        raise BadRequest(f"'key' must be a string naming a POSIX shared-memory object (got {key!r})")
    name = key[1:] if key.startswith("/") else key
    if not (0 < len(name) <= MAX_KEY_LENGTH and _KEY_NAME.fullmatch(name)) or name.startswith("."):
        raise BadRequest(f"'key' {echo(key)} is not a shared-memory object name: 1 to {MAX_KEY_LENGTH} letters, "
                         "digits, '_', '-' or '.' after an optional leading '/', not starting with '.' "
                         "(a name under /dev/shm, never a path)")
    return os.path.join(SHM_DIR, name)


def _region_name(name: str) -> str:
    if not (0 < len(name) <= MAX_NAME_LENGTH and name.isprintable()):
        raise BadRequest(f"region name {echo(name)} must be 1 to {MAX_NAME_LENGTH} printable characters")
    return name


def _non_negative(body: dict[str, Any], key: str, minimum: int) -> int:
    value = body.get(key, 0 if key == "offset" else None)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BadRequest(f"register: '{key}' must be an integer >= {minimum} (got {value!r})")
    return value


def parse_register(body: Any) -> tuple[str, int, int]:
    """(key, offset, byte_size) of a register request body `{"key", "offset", "byte_size"}`."""
    if not isinstance(body, dict):
        raise BadRequest("register: the body must be a JSON object with 'key', 'offset' and 'byte_size'")
    unknown = set(body) - _REGISTER_KEYS
    if unknown:
        raise BadRequest(f"register: unknown keys {sorted(unknown)}; allowed: {sorted(_REGISTER_KEYS)}")
    if "key" not in body or "byte_size" not in body:
        raise BadRequest("register: 'key' and 'byte_size' are required ('offset' defaults to 0)")
    return body["key"], _non_negative(body, "offset", 0), _non_negative(body, "byte_size", 1)


@dataclass(eq=False)
class Region:
    """A registered region: object bytes [offset, offset + byte_size) of `key`, mapped from file byte
    `offset - start` (mmap offsets are multiples of the allocation granularity)."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    mapping: mmap.mmap
    start: int
    file_id: tuple[int, int]  # (st_dev, st_ino) of the object: regions of one object can alias each other
    closed: bool = field(default=False)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def bytes_at(self, ref: ShmRef, where: str) -> np.ndarray:
        """[ref.byte_size] uint8 view of the mapping at `ref.offset` of the region, after checking that the
        range is inside the region and that the object still holds the whole region."""
        if ref.offset + ref.byte_size > self.byte_size:
            raise BadRequest(f"{where}: shared_memory_offset {ref.offset} + shared_memory_byte_size {ref.byte_size} "
                             f"is past the end of region '{self.name}' ({self.byte_size} bytes)")
        try:
            size = os.fstat(self.fd).st_size
        except OSError:
            raise BadRequest(f"{where}: region '{self.name}' can no longer be read; register it again") from None
        if size < self.offset + self.byte_size:
            raise BadRequest(f"{where}: shared-memory object {echo(self.key)} of region '{self.name}' now has "
                             f"{size} bytes, the region needs {self.offset + self.byte_size}; register it again")
        return np.frombuffer(self.mapping, dtype=np.uint8, count=ref.byte_size, offset=self.start + ref.offset)

    def overlaps(self, offset: int, size: int, other: Region, other_offset: int, other_size: int) -> bool:
        """Whether bytes [offset, offset + size) of this region and [other_offset, ...) of `other` share memory."""
        start, other_start = self.offset + offset, other.offset + other_offset  # offsets in the objects
        return (self.file_id == other.file_id and start < other_start + other_size
                and other_start < start + size)

    def close(self) -> bool:
        """Unmap and close; False while arrays still view the mapping (a request in flight): try again later."""
        if not self.closed:
            try:
                self.mapping.close()
            except BufferError:
                return False
            os.close(self.fd)
            self.closed = True
        return True


def _check_room(ref: ShmRef, shape: tuple[int, ...], dtype: np.dtype, where: str) -> int:
    """The bytes of a [shape] `dtype` output; 400 when `ref` is smaller."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > ref.byte_size:
        raise BadRequest(f"{where}: shared_memory_byte_size is {ref.byte_size} bytes, the output "
                         f"{list(shape)} {dtype} needs {nbytes}")
    return nbytes


def _open(key: str, path: str) -> tuple[int, os.stat_result]:
    """(fd, stat) of the shared-memory object, opened read-write without following a symbolic link."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadRequest(f"no shared-memory object {echo(key)} on this host (create it with shm_open before "
                         "registering; the server and the client must share /dev/shm)") from None
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else os.strerror(exc.errno or 0)
        raise BadRequest(f"cannot open shared-memory object {echo(key)}: {reason}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise BadRequest(f"shared-memory object {echo(key)} is not a regular shared-memory file")
    return fd, info


def map_region(name: str, key: str, offset: int, byte_size: int) -> Region:
    """Open `key` and map [offset, offset + byte_size) of it; 400 when the object is missing or too small."""
    fd, info = _open(key, shm_file(key))
    try:
        if offset + byte_size > info.st_size:
            raise BadRequest(f"region '{name}': offset {offset} + byte_size {byte_size} = {offset + byte_size} "
                             f"bytes, but shared-memory object {echo(key)} has {info.st_size}")
        start = offset % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(fd, start + byte_size, flags=mmap.MAP_SHARED,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset - start)
    except BaseException:
        os.close(fd)
        raise
    return Region(name, key, offset, byte_size, fd, mapping, start, (info.st_dev, info.st_ino))


class SharedMemoryRegistry:
    """The registered regions of one server process; thread-safe (parsing may run in worker threads).

    Also the `TensorSource` infer requests read shared-memory inputs from.
    """

    def __init__(self, enabled: bool, max_regions: int = MAX_REGIONS) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self._regions: dict[str, Region] = {}
        self._retired: list[Region] = []  # unregistered, still viewed by a request in flight
        self._lock = threading.Lock()

    def require_enabled(self) -> None:
        if not self.enabled:
            raise BadRequest(SHARED_MEMORY_OFF)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.require_enabled()
        name = _region_name(name)
        with self._lock:
            self._sweep()
            if name in self._regions:
                raise BadRequest(f"shared-memory region '{name}' is already registered; unregister it first")
            if len(self._regions) >= self.max_regions:
                raise BadRequest(f"{self.max_regions} shared-memory regions are registered, the most this server "
                                 "holds; unregister some first")
            self._regions[name] = map_region(name, key, offset, byte_size)
        log.info("shared-memory region %r registered: key %r, offset %d, %d bytes", name, key, offset, byte_size)

    def unregister(self, name: str | None = None) -> None:
        """Unregister `name` (unknown: nothing happens, as in Triton), or every region (None)."""
        self.require_enabled()
        with self._lock:
            names = list(self._regions) if name is None else [name] if name in self._regions else []
            for each in names:
                self._retire(self._regions.pop(each))
            self._sweep()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        self.require_enabled()
        with self._lock:
            if name is None:
                return [region.status() for region in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"no shared-memory region named {echo(name)} is registered")
        return [region.status()]

    def _region(self, ref: ShmRef, where: str) -> Region:
        region = self._regions.get(ref.region)
        if region is None:
            raise BadRequest(f"{where}: no shared-memory region named {echo(ref.region)} is registered")
        return region

    def input_array(self, ref: ShmRef, dtype: np.dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
        """Read-only [shape] `dtype` view of the region (a copy only when the bytes are not aligned for it)."""
        with self._lock:  # a concurrent unregister cannot close the mapping between lookup and view
            raw = self._region(ref, where).bytes_at(ref, where)
        array = raw.view(dtype).reshape(shape) if raw.ctypes.data % dtype.alignment == 0 else (
            raw.copy().view(dtype).reshape(shape))  # [shape]
        array.flags.writeable = False
        return array

    def output_array(self, ref: ShmRef, dtype: np.dtype, shape: tuple[int, ...], where: str,
                     inputs: Sequence[ShmRef]) -> np.ndarray | None:
        """Writeable [shape] `dtype` view of the region at `ref.offset` for a model to write its output into, or
        None where the output must be copied in after the run instead (bytes not aligned for `dtype`, or
        overlapping the shared-memory `inputs`, which the run reads while it writes). 400 when it does not fit."""
        nbytes = _check_room(ref, shape, dtype, where)
        with self._lock:
            region = self._region(ref, where)
            raw = region.bytes_at(ShmRef(ref.region, ref.offset, nbytes), where)
            if any(region.overlaps(ref.offset, nbytes, self._region(other, where), other.offset, other.byte_size)
                   for other in inputs):
                return None
        return raw.view(dtype).reshape(shape) if raw.ctypes.data % dtype.alignment == 0 else None

    def write_output(self, ref: ShmRef, array: np.ndarray, where: str) -> None:
        """Copy `array` (C order, native byte order) to the region at `ref.offset`."""
        _check_room(ref, array.shape, array.dtype, where)
        with self._lock:
            target = self._region(ref, where).bytes_at(ShmRef(ref.region, ref.offset, array.nbytes), where)
        np.copyto(target, np.ascontiguousarray(array).reshape(-1).view(np.uint8))

    def close(self) -> None:
        """Unregister everything (shutdown); mappings still viewed are left to the process exit."""
        with self._lock:
            for region in self._regions.values():
                self._retire(region)
            self._regions.clear()
            self._sweep()
            if self._retired:
                log.info("%d shared-memory mappings still viewed at shutdown: unmapped at exit", len(self._retired))

    def _retire(self, region: Region) -> None:
        self._retired.append(region)
        log.info("shared-memory region %r unregistered", region.name)

    def _sweep(self) -> None:
        """Close retired mappings no request views any more (call with the lock held)."""
        self._retired = [region for region in self._retired if not region.close()]
