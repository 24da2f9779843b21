"""System shared memory (the Triton / KServe v2 `system_shared_memory` extension): the registry of regions.

A client on this host creates a shared-memory object (`shm_open`: a file under /dev/shm, or a memfd),
registers a region of it under a name (`key`, `offset`, `byte_size`), and names that region in infer
requests instead of sending the tensors' bytes; requested outputs are written into it.

The server opens memory that another process controls, so:
* only a caller entitled to an object gets it registered (`posenc.service.inference.shared_memory_guard`): a
  Unix-socket peer that could open the object itself, or a TCP client with the shared-memory key;
* a key is a shared-memory object name (`name` or `/name`: letters, digits, `_`, `-`, `.`, no leading dot),
  never a path, opened under /dev/shm with O_NOFOLLOW; or, from a Unix-socket peer, `fd:N`, the peer's own
  descriptor N (a memfd);
* an object sealed against shrinking (a memfd with F_SEAL_SHRINK) is mapped: inputs are views of it and the
  model writes outputs into it (zero copy). Any other object may be truncated by its owner at any moment,
  and touching a mapped page past its new end kills a process with SIGBUS; those are never mapped: inputs
  are read with pread before the run, outputs written with pwrite after it, and a truncation is a 400;
* a region must lie inside the object when registered, and every tensor inside its region; each region
  holds one descriptor, and POSENC_SHARED_MEMORY_MAX_BYTES bounds the bytes of all regions together;
* unregistering removes the name at once and closes the region; a mapping that a request in flight still
  views (mmap refuses to close while arrays export its buffer) is closed at the next register or unregister
  after that, and every mapping at shutdown.

Triton's behaviour is followed where the protocol leaves room: registering a name twice is a 400, the
status of an unknown name a 404, unregistering an unknown name succeeds and changes nothing.
"""

from __future__ import annotations

import fcntl
import logging
import math
import mmap
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posenc.service.errors import BadRequest, NotFound, PayloadTooLarge, echo, format_bytes
from posenc.service.inference.kserve_request import SHARED_MEMORY_OFF, ShmRef
from posenc.service.inference.shared_memory_guard import (
    mapping_failed,
    open_object,
    require_input_access,
    require_output_access,
)
from posenc.service.request_kit.restricted import SharedMemoryCaller
from posenc.service.settings import Settings

log = logging.getLogger("posenc.inference.shared_memory")

SHM_DIR = "/dev/shm"
MAX_KEY_LENGTH = 255  # NAME_MAX of the file under /dev/shm
MAX_NAME_LENGTH = 255
MAX_REGIONS = 1024
DEFAULT_MAX_BYTES: int = Settings.model_fields["shared_memory_max_bytes"].default
MEMFD_PREFIX = "fd:"  # a key naming a descriptor of the Unix-socket peer (a sealed memfd: zero copy)
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
    """A registered region: object bytes [offset, offset + byte_size) of `key`.

    Two ways to reach the bytes, one descriptor either way:
    * `mapping` (zero copy): the object is sealed against shrinking (a memfd with F_SEAL_SHRINK), so no page
      of the mapping can vanish under a run; the mapping starts at file byte `offset - start` (mmap offsets
      are multiples of the allocation granularity) and holds the only descriptor;
    * `fd` (copying): any other object. A client may truncate it at any moment, and a mapped page past the
      new end would kill the process with SIGBUS, so inputs are read with pread before the run and outputs
      written with pwrite after it: a truncation is then a short read, answered 400.
    """

    name: str
    key: str
    offset: int
    byte_size: int
    info: os.stat_result  # of the object when registered: owner, group and mode judge later callers
    writable: bool  # opened read-write: outputs may be written to it
    fd: int | None = None
    mapping: mmap.mmap | None = None
    start: int = 0
    closed: bool = field(default=False)

    @property
    def file_id(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the object: regions of one object can alias each other."""
        return (self.info.st_dev, self.info.st_ino)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def _object_size(self, where: str) -> int:
        try:
            return self.mapping.size() if self.mapping is not None else os.fstat(self.fd).st_size  # type: ignore[arg-type]
        except (OSError, ValueError):
            raise BadRequest(f"{where}: region '{self.name}' can no longer be read; register it again") from None

    def _check_range(self, ref: ShmRef, where: str) -> None:
        """400 unless `ref` lies inside the region and the object still holds the whole region."""
        if ref.offset + ref.byte_size > self.byte_size:
            raise BadRequest(f"{where}: shared_memory_offset {ref.offset} + shared_memory_byte_size {ref.byte_size} "
                             f"is past the end of region '{self.name}' ({self.byte_size} bytes)")
        size = self._object_size(where)
        if size < self.offset + self.byte_size:
            raise _shrunk(where, self, size)

    def view(self, ref: ShmRef, where: str) -> np.ndarray | None:
        """[ref.byte_size] uint8 view of the mapping at `ref.offset` (zero-copy regions), else None."""
        self._check_range(ref, where)
        if self.mapping is None:
            return None
        return np.frombuffer(self.mapping, dtype=np.uint8, count=ref.byte_size, offset=self.start + ref.offset)

    def read(self, ref: ShmRef, where: str) -> np.ndarray:
        """[ref.byte_size] uint8: a view of the mapping, or a copy read with pread (400 when the object shrank
        meanwhile: the read comes up short instead of faulting)."""
        view = self.view(ref, where)
        if view is not None:
            return view
        assert self.fd is not None  # a region without a mapping reads and writes through its descriptor
        out = np.empty(ref.byte_size, dtype=np.uint8)
        done, position, target = 0, self.offset + ref.offset, out.data
        while done < ref.byte_size:
            got = os.preadv(self.fd, [target[done:]], position + done)
            if got == 0:
                raise _shrunk(where, self, position + done)
            done += got
        return out

    def write(self, ref: ShmRef, data: np.ndarray, where: str) -> None:
        """Write uint8 `data` at `ref.offset` of the region (into the mapping, or with pwrite)."""
        view = self.view(ShmRef(ref.region, ref.offset, data.nbytes), where)
        if view is not None:
            np.copyto(view, data)
            return
        assert self.fd is not None  # a region without a mapping reads and writes through its descriptor
        done, position, source = 0, self.offset + ref.offset, data.data
        while done < data.nbytes:
            done += os.pwrite(self.fd, source[done:], position + done)

    def overlaps(self, offset: int, size: int, other: Region, other_offset: int, other_size: int) -> bool:
        """Whether bytes [offset, offset + size) of this region and [other_offset, ...) of `other` share memory."""
        start, other_start = self.offset + offset, other.offset + other_offset  # offsets in the objects
        return (self.file_id == other.file_id and start < other_start + other_size
                and other_start < start + size)

    def close(self) -> bool:
        """Unmap and close; False while arrays still view the mapping (a request in flight): try again later."""
        if not self.closed:
            if self.mapping is not None:
                try:
                    self.mapping.close()
                except BufferError:
                    return False
            if self.fd is not None:
                os.close(self.fd)
            self.closed = True
        return True


def _shrunk(where: str, region: Region, size: int) -> BadRequest:
    return BadRequest(f"{where}: shared-memory object {echo(region.key)} of region '{region.name}' now has {size} "
                      f"bytes, the region needs {region.offset + region.byte_size}; register it again")


def _check_room(ref: ShmRef, shape: tuple[int, ...], dtype: np.dtype, where: str) -> int:
    """The bytes of a [shape] `dtype` output; 400 when `ref` is smaller."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > ref.byte_size:
        raise BadRequest(f"{where}: shared_memory_byte_size is {ref.byte_size} bytes, the output "
                         f"{list(shape)} {dtype} needs {nbytes}")
    return nbytes


def sealed_against_shrinking(fd: int) -> bool:
    """Whether the object can never shrink (F_SEAL_SHRINK, only memfds carry seals)."""
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
    except OSError:
        return False


def object_path(key: str, caller: SharedMemoryCaller) -> tuple[str, bool]:
    """(path, follow) of a key: `name` or `/name` under /dev/shm; `fd:N` (Unix-socket peers only) is the
    peer's descriptor N, typically a sealed memfd, reached through /proc/<pid>/fd."""
    if isinstance(key, str) and key.startswith(MEMFD_PREFIX):
        number = key[len(MEMFD_PREFIX):]
        if caller.peer is None:
            raise BadRequest(f"key {echo(key)}: a descriptor of the client ('{MEMFD_PREFIX}N') can be registered "
                             "only over the Unix socket (POSENC_UDS), where the server knows the client's process")
        if not (number.isdigit() and len(number) <= 9):
            raise BadRequest(f"key {echo(key)}: '{MEMFD_PREFIX}' must be followed by a descriptor number")
        return f"/proc/{caller.peer.pid}/fd/{int(number)}", True
    return shm_file(key), False


def map_region(name: str, key: str, offset: int, byte_size: int, caller: SharedMemoryCaller) -> Region:
    """Open `key` for `caller` and reach [offset, offset + byte_size) of it: mapped when the object is sealed
    against shrinking, else read and written through its descriptor. 400 when the object is missing or too
    small, 403 when the caller may not read it, 503/507 when the server runs out of descriptors or mappings."""
    path, follow = object_path(key, caller)
    opened = open_object(key, path, caller, follow=follow)
    fd, info = opened.fd, opened.info
    try:
        if offset + byte_size > info.st_size:
            raise BadRequest(f"region '{name}': offset {offset} + byte_size {byte_size} = {offset + byte_size} "
                             f"bytes, but shared-memory object {echo(key)} has {info.st_size}")
        if not sealed_against_shrinking(fd):
            return Region(name, key, offset, byte_size, info, opened.writable, fd=fd)  # keeps the descriptor
        start = offset % mmap.ALLOCATIONGRANULARITY
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if opened.writable else 0)
        mapping = mmap.mmap(fd, start + byte_size, flags=mmap.MAP_SHARED, prot=prot, offset=offset - start)
    except OSError as exc:
        os.close(fd)
        raise mapping_failed(key, exc) from None
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)  # the mapping keeps its own descriptor (Python's mmap duplicates it): one per region
    return Region(name, key, offset, byte_size, info, opened.writable, mapping=mapping, start=start)


class SharedMemoryRegistry:
    """The registered regions of one server process; thread-safe (parsing may run in worker threads).

    `for_caller` gives the `TensorSource` an infer request reads its shared-memory inputs from: the regions
    as that caller may use them.
    """

    def __init__(self, enabled: bool, max_regions: int = MAX_REGIONS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self._regions: dict[str, Region] = {}
        self._retired: list[Region] = []  # unregistered, still viewed by a request in flight
        self._lock = threading.Lock()

    def require_enabled(self) -> None:
        if not self.enabled:
            raise BadRequest(SHARED_MEMORY_OFF)

    def register(self, name: str, key: str, offset: int, byte_size: int, caller: SharedMemoryCaller) -> None:
        self.require_enabled()
        caller.require("register")
        name = _region_name(name)
        with self._lock:
            self._sweep()
            if name in self._regions:
                raise BadRequest(f"shared-memory region '{name}' is already registered; unregister it first")
            if len(self._regions) >= self.max_regions:
                raise BadRequest(f"{self.max_regions} shared-memory regions are registered, the most this server "
                                 "holds; unregister some first")
            registered = sum(region.byte_size for region in self._regions.values())
            if registered + byte_size > self.max_bytes:
                raise PayloadTooLarge(f"register '{name}': {format_bytes(byte_size)} more would make "
                                      f"{format_bytes(registered + byte_size)} of registered shared memory; this "
                                      f"server allows {format_bytes(self.max_bytes)} (POSENC_SHARED_MEMORY_MAX_BYTES)")
            region = map_region(name, key, offset, byte_size, caller)
            self._regions[name] = region
        log.info("shared-memory region %r registered: key %r, offset %d, %d bytes, %s%s", name, key, offset,
                 byte_size, "zero-copy" if region.mapping is not None else "copied",
                 "" if region.writable else ", read-only")

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

    def for_caller(self, caller: SharedMemoryCaller) -> RegionsFor:
        """The regions as `caller` may use them in an infer request."""
        return RegionsFor(self, caller)

    def region(self, ref: ShmRef, where: str) -> Region:
        """The region `ref` names (call with the lock held); 400 when none is registered under that name."""
        region = self._regions.get(ref.region)
        if region is None:
            raise BadRequest(f"{where}: no shared-memory region named {echo(ref.region)} is registered")
        return region

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


class RegionsFor:
    """The registered regions as one caller may use them (the `TensorSource` of its infer request): every
    region it names must be one that caller could open itself (regions are shared by name between clients)."""

    def __init__(self, registry: SharedMemoryRegistry, caller: SharedMemoryCaller) -> None:
        self.registry, self.caller = registry, caller
        self.enabled = registry.enabled

    def _region(self, ref: ShmRef, where: str, output: bool) -> Region:
        self.caller.require(where)
        region = self.registry.region(ref, where)
        if output:
            require_output_access(self.caller, region.info, region.writable, region.name, where)
        else:
            require_input_access(self.caller, region.info, region.name, where)
        return region

    def input_array(self, ref: ShmRef, dtype: np.dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
        """Read-only [shape] `dtype` array of the region: a view of the mapping (zero-copy regions, unless the
        bytes are not aligned for `dtype`), else a copy read before the run."""
        with self.registry._lock:  # a concurrent unregister cannot close the region between lookup and read
            raw = self._region(ref, where, output=False).read(ref, where)
        array = raw.view(dtype).reshape(shape) if raw.ctypes.data % dtype.alignment == 0 else (
            raw.copy().view(dtype).reshape(shape))  # [shape]
        array.flags.writeable = False
        return array

    def output_array(self, ref: ShmRef, dtype: np.dtype, shape: tuple[int, ...], where: str,
                     inputs: Sequence[ShmRef]) -> np.ndarray | None:
        """Writeable [shape] `dtype` view of the region at `ref.offset` for a model to write its output into, or
        None where the output must be written after the run instead (a copied region, bytes not aligned for
        `dtype`, or overlapping the shared-memory `inputs`, which the run reads while it writes). 400 when it
        does not fit, 403 when the caller may not write the region."""
        nbytes = _check_room(ref, shape, dtype, where)
        with self.registry._lock:
            region = self._region(ref, where, output=True)
            raw = region.view(ShmRef(ref.region, ref.offset, nbytes), where)
            if raw is None or any(
                    region.overlaps(ref.offset, nbytes, self.registry.region(other, where), other.offset,
                                    other.byte_size) for other in inputs):
                return None
        return raw.view(dtype).reshape(shape) if raw.ctypes.data % dtype.alignment == 0 else None

    def write_output(self, ref: ShmRef, array: np.ndarray, where: str) -> None:
        """Write `array` (C order, native byte order) to the region at `ref.offset`."""
        _check_room(ref, array.shape, array.dtype, where)
        with self.registry._lock:
            self._region(ref, where, output=True).write(
                ref, np.ascontiguousarray(array).reshape(-1).view(np.uint8), where)
