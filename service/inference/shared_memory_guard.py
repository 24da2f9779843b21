"""Who may use which shared-memory object, and opening it with no more access than that.

The server opens the objects, not the client, so it must not lend its own rights: a region is registered
only for a caller entitled to it (`posenc.service.request_kit.restricted.SharedMemoryCaller`):

* a Unix-socket peer gets an object only if it could open the object itself: read for any region, read and
  write for a region that receives outputs. Judged as the kernel would (owner, then group, then other mode
  bits; uid 0 may do anything) on the object the server actually opened, not on a name that could be
  swapped;
* a TCP client that sent the `shared-memory` key of POSENC_RESTRICTED_API is trusted as the operator
  configured it (objects are opened with the server's rights);
* anyone else is refused before anything is opened.

An object is opened read-only first; it is reopened read-write (through /proc/self/fd, so the same object)
only when the caller may write it. Each region then holds one descriptor.
"""

from __future__ import annotations

import errno
import os
import resource
import stat
from dataclasses import dataclass

from posenc.service.errors import BadRequest, Forbidden, InsufficientStorage, Unavailable, echo
from posenc.service.request_kit.restricted import SharedMemoryCaller
from posenc.service.request_kit.unix import Peer


def may_access(peer: Peer, info: os.stat_result, write: bool) -> bool:
    """Whether `peer` could open the object described by `info` for reading (and writing, if `write`)."""
    if peer.uid == 0:
        return True
    if info.st_uid == peer.uid:
        read_bit, write_bit = stat.S_IRUSR, stat.S_IWUSR
    elif info.st_gid in peer.gids:
        read_bit, write_bit = stat.S_IRGRP, stat.S_IWGRP
    else:
        read_bit, write_bit = stat.S_IROTH, stat.S_IWOTH
    return bool(info.st_mode & read_bit) and (not write or bool(info.st_mode & write_bit))


def out_of_descriptors(what: str) -> Unavailable:
    return Unavailable(f"{what}: the server has no file descriptor left for another region (its open-files "
                       "limit, less what it keeps for connections); unregister regions or retry later", retry_after=1)


def descriptor_reserve(soft_limit: int) -> int:
    """Descriptors regions may never take: connections need them (a server out of descriptors cannot accept
    one, and its clients see resets instead of answers)."""
    return max(64, soft_limit // 4)


def require_descriptor_room(what: str) -> None:
    """503 when one more region would eat into the descriptors kept for connections."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        return  # no /proc: EMFILE at open is still a 503
    if open_now + 1 > soft - descriptor_reserve(soft):
        raise out_of_descriptors(what)


@dataclass(frozen=True)
class OpenedObject:
    """A shared-memory object opened for a caller: its one descriptor, its stat, whether it is writable."""

    fd: int
    info: os.stat_result
    writable: bool


def open_object(key: str, path: str, caller: SharedMemoryCaller, *, follow: bool = False) -> OpenedObject:
    """Open the object at `path` for `caller`: 400 when missing or not a regular file, 403 when a Unix-socket
    peer could not read it itself, 503 when the server is out of descriptors. Writable when the caller may
    write it (and the server can)."""
    caller.require("register")
    require_descriptor_room(f"register {echo(key)}")
    flags = os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise BadRequest(f"no shared-memory object {echo(key)} on this host (create it with shm_open before "
                         "registering; the server and the client must share /dev/shm)") from None
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise out_of_descriptors(f"register {echo(key)}") from None
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else os.strerror(exc.errno or 0)
        raise BadRequest(f"cannot open shared-memory object {echo(key)}: {reason}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadRequest(f"shared-memory object {echo(key)} is not a regular shared-memory file")
        peer = caller.peer
        if peer is not None and not caller.has_key and not may_access(peer, info, write=False):
            raise Forbidden(f"register: {peer.describe()} may not read shared-memory object {echo(key)} "
                            f"(owner uid {info.st_uid}, group {info.st_gid}, mode {stat.S_IMODE(info.st_mode):o}), "
                            "so the server does not read it on its behalf")
        writable = peer is None or caller.has_key or may_access(peer, info, write=True)
        if writable:
            fd, writable = _reopen_writable(fd)
        return OpenedObject(fd, info, writable)
    except BaseException:
        os.close(fd)
        raise


def _reopen_writable(fd: int) -> tuple[int, bool]:
    """(descriptor, writable): the same object reopened read-write, or `fd` itself when the server cannot."""
    try:
        writable_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except PermissionError:
        return fd, False
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise out_of_descriptors("register") from None
        return fd, False
    os.close(fd)
    return writable_fd, True


def require_output_access(caller: SharedMemoryCaller, info: os.stat_result, writable: bool, region: str,
                          where: str) -> None:
    """403 unless outputs may go to `region`: the server holds it writable and the caller may write it."""
    if not writable:
        raise Forbidden(f"{where}: region '{region}' was registered read-only (its client may not write the "
                        "object), so no output can be written to it")
    peer = caller.peer
    if peer is not None and not caller.has_key and not may_access(peer, info, write=True):
        raise Forbidden(f"{where}: {peer.describe()} may not write the object of region '{region}'")


def require_input_access(caller: SharedMemoryCaller, info: os.stat_result, region: str, where: str) -> None:
    """403 unless the caller may read the object of `region` (regions are shared by name between clients)."""
    peer = caller.peer
    if peer is not None and not caller.has_key and not may_access(peer, info, write=False):
        raise Forbidden(f"{where}: {peer.describe()} may not read the object of region '{region}'")


def mapping_failed(key: str, exc: OSError) -> Exception:
    """The error for an mmap that failed (address space or map count exhausted: 507, never a 500)."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return out_of_descriptors(f"register {echo(key)}")
    return InsufficientStorage(f"register {echo(key)}: the server cannot map it ({os.strerror(exc.errno or 0)}); "
                               "unregister regions first")
