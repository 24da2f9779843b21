"""One registered shared-memory region: the bytes it reaches, and how (mapped, or read and written through
its descriptor), with every read and write checked against what the object allows at that moment.

The registry of regions is `posenc.service.inference.shared_memory.registry`; who may open which object is
`posenc.service.inference.shared_memory.guard`.
"""

from __future__ import annotations

import fcntl
import functools
import math
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from posenc.service.errors import BadRequest, echo
from posenc.service.inference.shared_memory.guard import OpenedObject, WriteRefusal, mapping_failed, write_refusal
from posenc.service.inference.shared_memory.refs import ShmRef

if TYPE_CHECKING:
    from posenc.service.inference.runtime.devices import HostPinning


@dataclass(eq=False)
class Region:
    """A registered region of `owner`: object bytes [offset, offset + byte_size) of `key`.

    Two ways to reach the bytes:
    * `mapping` (zero copy): the object is sealed against shrinking (a memfd with F_SEAL_SHRINK), so no page
      of the mapping can vanish under a run; the mapping starts at file byte `offset - start` (mmap offsets
      are multiples of the allocation granularity);
    * copying: any other object. A client may truncate it at any moment, and a mapped page past the new end
      would kill the process with SIGBUS, so inputs are read with pread before the run and outputs written
      with pwrite after it: a truncation is then a short read, answered 400.
    Either way the region keeps `fd`, the descriptor it was opened with (a mapping holds a second one): the
    object's seals are read from it before every write, since a client may seal a memfd after registering it.
    On a CUDA server a mapping is also pinned (`pin`): the device copies from and into it directly. `leases`
    counts the requests whose runs may still be copying from or into it; it is unpinned and unmapped only at
    none.
    """

    name: str
    key: str
    offset: int
    byte_size: int
    info: os.stat_result  # of the object when registered: owner, group and mode judge later callers
    refusal: WriteRefusal | None  # why outputs may not go to it (None: they may)
    fd: int
    owner: str = ""
    mapping: mmap.mmap | None = None
    start: int = 0
    closed: bool = field(default=False)
    unpin: Callable[[], None] | None = None  # set while the mapping is pinned for the CUDA device
    leases: int = 0

    @property
    def writable(self) -> bool:
        return self.refusal is None

    @property
    def file_id(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the object: regions of one object can alias each other."""
        return (self.info.st_dev, self.info.st_ino)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def _object_size(self, where: str) -> int:
        try:
            return os.fstat(self.fd).st_size
        except (OSError, ValueError):
            raise BadRequest(f"{where}: region '{self.name}' can no longer be read; register it again") from None

    def _check_range(self, ref: ShmRef, where: str) -> None:
        """400 unless `ref` lies inside the region and the object still holds the whole region."""
        if ref.offset + ref.byte_size > self.byte_size:
            raise BadRequest(f"{where}: shared_memory_offset {ref.offset} + shared_memory_byte_size {ref.byte_size} "
                             f"is past the end of region '{self.name}' ({self.byte_size} bytes)")
        size = self._object_size(where)
        if size < self.offset + self.byte_size:
            raise shrunk(where, self, size)

    def check_writable(self, where: str) -> None:
        """400 when the object refuses writes now (a seal added after registration), naming it and the seal."""
        refusal = write_refusal(self.fd)
        if refusal is not None:
            raise BadRequest(f"{where}: shared-memory object {echo(self.key)} of region '{self.name}' refuses "
                             f"writes: {refusal.cause}; write outputs to another region")

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
        out = np.empty(ref.byte_size, dtype=np.uint8)
        done, position, target = 0, self.offset + ref.offset, out.data
        while done < ref.byte_size:
            try:
                got = os.preadv(self.fd, [target[done:]], position + done)
            except OSError as exc:
                raise self._refused(where, "read", exc) from None
            if got == 0:
                raise shrunk(where, self, position + done)
            done += got
        return out

    def write(self, ref: ShmRef, data: np.ndarray, where: str) -> None:
        """Write uint8 `data` at `ref.offset` of the region (into the mapping, or with pwrite); 400 when the
        object refuses it."""
        self.check_writable(where)
        view = self.view(ShmRef(ref.region, ref.offset, data.nbytes), where)
        if view is not None:
            np.copyto(view, data)
            return
        done, position, source = 0, self.offset + ref.offset, data.data
        while done < data.nbytes:
            try:
                done += os.pwrite(self.fd, source[done:], position + done)
            except OSError as exc:  # sealed or truncated between the check and the write
                raise self._refused(where, "write", exc) from None

    def _refused(self, where: str, action: str, exc: OSError) -> BadRequest:
        return BadRequest(f"{where}: cannot {action} shared-memory object {echo(self.key)} of region "
                          f"'{self.name}': {os.strerror(exc.errno or 0)}")

    def overlaps(self, offset: int, size: int, other: Region, other_offset: int, other_size: int) -> bool:
        """Whether bytes [offset, offset + size) of this region and [other_offset, ...) of `other` share memory."""
        start, other_start = self.offset + offset, other.offset + other_offset  # offsets in the objects
        return (self.file_id == other.file_id and start < other_start + other_size
                and other_start < start + size)

    def pin(self, pinning: HostPinning) -> None:
        """Page-lock the whole mapping for the CUDA device (nothing for a copied region, or when the driver
        refuses: copies then go through its staging buffer)."""
        if self.mapping is None:
            return
        view = np.frombuffer(self.mapping, dtype=np.uint8)
        address = view.ctypes.data
        del view  # an exported buffer would keep the mapping from closing
        if pinning.pin(address, len(self.mapping), read_only=not self.writable):
            self.unpin = functools.partial(pinning.unpin, address)

    def close(self) -> bool:
        """Unpin, unmap and close; False while a request holds a lease or arrays still view the mapping (a
        request in flight): try again later."""
        if self.leases:
            return False
        if self.unpin is not None:
            self.unpin()  # while still mapped; no run copies from or into it any more (no lease)
            self.unpin = None
        if not self.closed:
            if self.mapping is not None:
                try:
                    self.mapping.close()
                except BufferError:
                    return False
            os.close(self.fd)
            self.closed = True
        return True


def shrunk(where: str, region: Region, size: int) -> BadRequest:
    return BadRequest(f"{where}: shared-memory object {echo(region.key)} of region '{region.name}' now has {size} "
                      f"bytes, the region needs {region.offset + region.byte_size}; register it again")


def check_room(ref: ShmRef, shape: tuple[int, ...], dtype: np.dtype, where: str) -> int:
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


def map_region(name: str, key: str, offset: int, byte_size: int, opened: OpenedObject, owner: str) -> Region:
    """Reach [offset, offset + byte_size) of the opened object: mapped when it is sealed against shrinking,
    else read and written through its descriptor. 400 when the object is too small, 507 when the server
    cannot map it. Takes `opened.fd` (closed on failure)."""
    fd, info = opened.fd, opened.info
    try:
        if offset + byte_size > info.st_size:
            raise BadRequest(f"region '{name}': offset {offset} + byte_size {byte_size} = {offset + byte_size} "
                             f"bytes, but shared-memory object {echo(key)} has {info.st_size}")
        if not sealed_against_shrinking(fd):
            return Region(name, key, offset, byte_size, info, opened.refusal, fd, owner)
        start = offset % mmap.ALLOCATIONGRANULARITY
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if opened.refusal is None else 0)
        mapping = mmap.mmap(fd, start + byte_size, flags=mmap.MAP_SHARED, prot=prot, offset=offset - start)
    except OSError as exc:
        os.close(fd)
        raise mapping_failed(key, exc) from None
    except BaseException:
        os.close(fd)
        raise
    return Region(name, key, offset, byte_size, info, opened.refusal, fd, owner, mapping=mapping, start=start)
