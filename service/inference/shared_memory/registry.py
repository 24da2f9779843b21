"""System shared memory (the Triton / KServe v2 `system_shared_memory` extension): the registry of regions.

A client on this host creates a shared-memory object (`shm_open`: a file under /dev/shm, or a memfd),
registers a region of it under a name (`key`, `offset`, `byte_size`), and names that region in infer
requests instead of sending the tensors' bytes; requested outputs are written into it.

The server opens memory that another process controls, so:
* a region belongs to its owner (the peer's uid on the Unix socket, the shared-memory key's holders over
  TCP): names are per owner, and status, unregister and infer see only the caller's owner's regions;
* only a caller entitled to an object gets it registered (`posenc.service.inference.shared_memory.guard`): a
  Unix-socket peer that could open the object itself, or a TCP client with the shared-memory key;
* a key is a shared-memory object name (`name` or `/name`: letters, digits, `_`, `-`, `.`, no leading dot),
  never a path, opened under /dev/shm with O_NOFOLLOW; or, from a Unix-socket peer, `fd:N`: the descriptor
  the peer sent with the request (SCM_RIGHTS; N, its own number, is only the key it is listed under);
* an object sealed against shrinking (a memfd with F_SEAL_SHRINK) is mapped: inputs are views of it and the
  model writes outputs into it (zero copy). Any other object may be truncated by its owner at any moment,
  and touching a mapped page past its new end kills a process with SIGBUS; those are never mapped: inputs
  are read with pread before the run, outputs written with pwrite after it, and a truncation is a 400;
* a region must lie inside the object when registered, and every tensor inside its region; an output is
  written only while the object accepts writes (a seal added later is a 400); each region holds one
  descriptor (a mapped one two), and POSENC_SHARED_MEMORY_MAX_BYTES bounds the bytes of all regions together;
* unregistering removes the name at once and closes the region; a region a request in flight still uses
  (its lease, or arrays viewing the mapping: mmap refuses to close while they export its buffer) is closed
  when that request ends or at the next register or unregister after that, and every mapping at shutdown.

Triton's behaviour is followed where the protocol leaves room: registering a name twice is a 400, the
status of an unknown name a 404, unregistering an unknown name succeeds and changes nothing.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from posenc.service.errors import BadRequest, NotFound, PayloadTooLarge, echo, format_bytes
from posenc.service.inference.shared_memory.guard import (
    OpenedObject,
    adopt_descriptor,
    open_object,
    require_input_access,
    require_output_access,
)
from posenc.service.inference.shared_memory.refs import SHARED_MEMORY_OFF, ShmRef
from posenc.service.inference.shared_memory.region import Region, check_room, map_region
from posenc.service.request_kit.restricted import SharedMemoryCaller
from posenc.service.settings import Settings

if TYPE_CHECKING:
    from posenc.service.inference.runtime.devices import HostPinning

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


def open_key(key: str, caller: SharedMemoryCaller) -> OpenedObject:
    """The object a key names, opened for `caller`: `name` or `/name` under /dev/shm; `fd:N` (Unix-socket
    peers only) the descriptor the peer sent with the request (N is its own number, kept as the key)."""
    if isinstance(key, str) and key.startswith(MEMFD_PREFIX):
        number = key[len(MEMFD_PREFIX):]
        if caller.peer is None:
            raise BadRequest(f"key {echo(key)}: a descriptor of the client ('{MEMFD_PREFIX}N') can be registered "
                             "only over the Unix socket (POSENC_UDS), where the client sends it with the request")
        if not (number.isdigit() and len(number) <= 9):
            raise BadRequest(f"key {echo(key)}: '{MEMFD_PREFIX}' must be followed by a descriptor number")
        return adopt_descriptor(key, caller)
    return open_object(key, shm_file(key), caller)


class SharedMemoryRegistry:
    """The registered regions of one server process, by owner and name; thread-safe (parsing may run in
    worker threads).

    Every call names its caller, and sees only that caller's owner's regions (`SharedMemoryCaller.owner`):
    two owners may register the same name without meeting. `for_caller` gives the `TensorSource` an infer
    request reads its shared-memory inputs from: the caller's regions as it may use them.
    `pinning` (set once a model runs on CUDA): mapped regions are pinned for the device while registered.
    """

    def __init__(self, enabled: bool, max_regions: int = MAX_REGIONS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.pinning: HostPinning | None = None
        self._regions: dict[tuple[str, str], Region] = {}  # (owner, name) -> region
        self._retired: list[Region] = []  # unregistered, still used by a request in flight
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
            if (caller.owner, name) in self._regions:
                raise BadRequest(f"shared-memory region '{name}' is already registered; unregister it first")
            if len(self._regions) >= self.max_regions:
                raise BadRequest(f"{self.max_regions} shared-memory regions are registered, the most this server "
                                 "holds; unregister some first")
            registered = sum(region.byte_size for region in self._regions.values())
            if registered + byte_size > self.max_bytes:
                raise PayloadTooLarge(f"register '{name}': {format_bytes(byte_size)} more would make "
                                      f"{format_bytes(registered + byte_size)} of registered shared memory; this "
                                      f"server allows {format_bytes(self.max_bytes)} (POSENC_SHARED_MEMORY_MAX_BYTES)")
            region = map_region(name, key, offset, byte_size, open_key(key, caller), caller.owner)
            if self.pinning is not None:
                region.pin(self.pinning)
            self._regions[caller.owner, name] = region
        log.info("shared-memory region %r of %s registered: key %r, offset %d, %d bytes, %s%s%s", name, caller.owner,
                 key, offset, byte_size, "zero-copy" if region.mapping is not None else "copied",
                 ", pinned" if region.unpin is not None else "", "" if region.writable else ", read-only")

    def unregister(self, caller: SharedMemoryCaller, name: str | None = None) -> None:
        """Unregister the caller's region `name` (unknown: nothing happens, as in Triton), or every region of
        the caller's (None)."""
        self.require_enabled()
        caller.require("unregister")
        with self._lock:
            keys = [key for key in self._regions if key[0] == caller.owner and name in (None, key[1])]
            for key in keys:
                self._retire(self._regions.pop(key))
            self._sweep()

    def status(self, caller: SharedMemoryCaller, name: str | None = None) -> list[dict[str, Any]]:
        """The caller's regions (all, or `name`: 404 when the caller has none of that name)."""
        self.require_enabled()
        caller.require("status")
        with self._lock:
            if name is None:
                return [region.status() for (owner, _), region in self._regions.items() if owner == caller.owner]
            region = self._regions.get((caller.owner, name))
        if region is None:
            raise NotFound(f"no shared-memory region named {echo(name)} is registered")
        return [region.status()]

    def for_caller(self, caller: SharedMemoryCaller) -> RegionsFor:
        """The caller's regions as it may use them in an infer request."""
        return RegionsFor(self, caller)

    def region(self, owner: str, ref: ShmRef, where: str) -> Region:
        """The region of `owner` that `ref` names (call with the lock held); 400 when it has none of that name."""
        region = self._regions.get((owner, ref.region))
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
        log.info("shared-memory region %r of %s unregistered", region.name, region.owner)

    def _sweep(self) -> None:
        """Close retired mappings no request views any more (call with the lock held)."""
        self._retired = [region for region in self._retired if not region.close()]


class RegionsFor:
    """The caller's registered regions as it may use them (the `TensorSource` of its infer request). A
    region it names must be its owner's, and one the caller could open itself (peers of one uid may differ
    in groups). Every region it hands bytes of is leased to the request until `release` (call it when the
    request's run is over): a region unregistered meanwhile stays mapped and pinned until then."""

    def __init__(self, registry: SharedMemoryRegistry, caller: SharedMemoryCaller) -> None:
        self.registry, self.caller = registry, caller
        self.enabled = registry.enabled
        self._leased: list[Region] = []

    def _region(self, ref: ShmRef, where: str, output: bool) -> Region:
        """The region `ref` names, leased to this request (call with the registry's lock held)."""
        self.caller.require(where)
        region = self.registry.region(self.caller.owner, ref, where)
        if output:
            require_output_access(self.caller, region.info, region.refusal, region.name, where)
        else:
            require_input_access(self.caller, region.info, region.name, where)
        region.leases += 1
        self._leased.append(region)
        return region

    def release(self) -> None:
        """End this request's leases (its run is over: nothing copies from or into its regions any more)."""
        with self.registry._lock:
            for region in self._leased:
                region.leases -= 1
            self._leased.clear()
            self.registry._sweep()  # an unregistered region this request held unmaps (and unpins) now

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
        does not fit or the object refuses writes, 403 when the caller may not write the region."""
        nbytes = check_room(ref, shape, dtype, where)
        owner = self.caller.owner
        with self.registry._lock:
            region = self._region(ref, where, output=True)
            region.check_writable(where)
            raw = region.view(ShmRef(ref.region, ref.offset, nbytes), where)
            if raw is None or any(
                    region.overlaps(ref.offset, nbytes, self.registry.region(owner, other, where), other.offset,
                                    other.byte_size) for other in inputs):
                return None
        return raw.view(dtype).reshape(shape) if raw.ctypes.data % dtype.alignment == 0 else None

    def write_output(self, ref: ShmRef, array: np.ndarray, where: str) -> None:
        """Write `array` (C order, native byte order) to the region at `ref.offset`."""
        check_room(ref, array.shape, array.dtype, where)
        with self.registry._lock:
            self._region(ref, where, output=True).write(
                ref, np.ascontiguousarray(array).reshape(-1).view(np.uint8), where)
