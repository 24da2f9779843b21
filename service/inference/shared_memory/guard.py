"""Who may use which shared-memory object, and opening it with no more access than that.

The server opens the objects, not the client, so it must not lend its own rights: a region is registered
only for a caller entitled to it (`posenc.service.request_kit.restricted.SharedMemoryCaller`):

* a Unix-socket peer gets an object only if it could open the object itself: read for any region, read and
  write for a region that receives outputs. Judged as the kernel would (owner, then group, then other mode
  bits; uid 0 may do anything) on the object the server actually opened, not on a name that could be
  swapped;
* a TCP client that sent the `shared-memory` key of POSENC_RESTRICTED_API is trusted as the operator
  configured it (objects are opened with the server's rights);
* a Unix-socket peer that registers `fd:N` hands over its descriptor itself (SCM_RIGHTS,
  `posenc.service.request_kit.descriptors`): it has what that descriptor gives, no more (a read-only descriptor,
  or a memfd sealed against writing, makes a read-only region). Nothing is opened through its pid;
* anyone else is refused before anything is opened.

An object by name is opened read-only first; it is reopened read-write (through /proc/self/fd, so the same
object) only when the caller may write it. A region that outputs may not go to carries why
(`WriteRefusal`): the caller may not write the object (403), or the object refuses writes (400).
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import stat
from dataclasses import dataclass

from posenc.service.errors import BadRequest, Forbidden, InsufficientStorage, ServiceError, Unavailable, echo
from posenc.service.request_kit.descriptors import MAX_DESCRIPTORS
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


F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)  # Linux 5.1


@dataclass(frozen=True)
class WriteRefusal:
    """Why no output may be written to a region: `cause` names it; `forbidden` when it is the caller's rights
    (403), not the object's (400)."""

    cause: str
    forbidden: bool = False


def write_refusal(fd: int) -> WriteRefusal | None:
    """Why the object behind `fd` refuses writes through it now (seals, a read-only descriptor), or None."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0  # not a memfd: no seals
    if seals & fcntl.F_SEAL_WRITE:
        return WriteRefusal("it is sealed against writing (F_SEAL_WRITE)")
    if seals & F_SEAL_FUTURE_WRITE:
        return WriteRefusal("it is sealed against writing (F_SEAL_FUTURE_WRITE)")
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
        return WriteRefusal("its descriptor is open read-only")
    return None


@dataclass(frozen=True)
class OpenedObject:
    """A shared-memory object opened for a caller: its descriptor, its stat, why outputs may not go to it."""

    fd: int
    info: os.stat_result
    refusal: WriteRefusal | None


def open_object(key: str, path: str, caller: SharedMemoryCaller, *, follow: bool = False) -> OpenedObject:
    """Open the object at `path` for `caller`: 400 when missing or not a regular file, 403 when a Unix-socket
    peer could not read it itself, 503 when the server is out of descriptors. Writable when the caller may
    write it (and the server can)."""
    caller.require("register")
    require_descriptor_room(f"register {echo(key)}")
    # O_NONBLOCK: a FIFO planted as the object opens at once (and is refused below, not a regular file) instead of
    # blocking the caller until a writer comes; on a regular file it changes nothing.
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
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
        if peer is not None and not caller.has_key and not may_access(peer, info, write=True):
            return OpenedObject(fd, info, WriteRefusal(f"{peer.describe()} may not write it", forbidden=True))
        fd, writable = _reopen_writable(fd)
        return OpenedObject(fd, info, write_refusal(fd) if writable else WriteRefusal("the server cannot open it "
                                                                                      "for writing"))
    except BaseException:
        os.close(fd)
        raise


def adopt_descriptor(key: str, caller: SharedMemoryCaller) -> OpenedObject:
    """The descriptor the peer sent with this request (SCM_RIGHTS) for key `fd:N`: 400 when none came, or
    when it is not a regular file (a memfd or a /dev/shm object); 503 when the server is out of descriptors."""
    caller.require("register")
    passed = caller.descriptors
    fd = passed.take() if passed is not None else None
    if fd is None:
        more = passed is not None and passed.refused
        raise BadRequest(f"register {echo(key)}: " + (
            f"more than {MAX_DESCRIPTORS} descriptor came with the request; send one" if more else
            "no descriptor came with the request. Send the object's descriptor itself as SCM_RIGHTS ancillary "
            "data of the request's first bytes, on a new connection to the Unix socket (socket.send_fds; "
            "posenc.service.testing.register_memfd does it)"))
    try:
        require_descriptor_room(f"register {echo(key)}")
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadRequest(f"register {echo(key)}: the descriptor sent is not a shared-memory object (a memfd "
                             "or a file under /dev/shm)")
        return OpenedObject(fd, info, write_refusal(fd))
    except BaseException:
        os.close(fd)
        raise


def _reopen_writable(fd: int) -> tuple[int, bool]:
    """(descriptor, writable): the same object reopened read-write, or `fd` itself when the server cannot."""
    try:
        writable_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except PermissionError:
        return fd, False
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise out_of_descriptors("register") from None
        return fd, False
    os.close(fd)
    return writable_fd, True


def require_output_access(caller: SharedMemoryCaller, info: os.stat_result, refusal: WriteRefusal | None,
                          region: str, where: str) -> None:
    """Unless outputs may go to `region`: 403 when the caller may not write the object, 400 when the object
    refuses writes (sealed, read-only descriptor); its cause named."""
    if refusal is not None:
        error: type[ServiceError] = Forbidden if refusal.forbidden else BadRequest
        raise error(f"{where}: region '{region}' was registered read-only ({refusal.cause}), so no output can "
                    "be written to it")
    peer = caller.peer
    if peer is not None and not caller.has_key and not may_access(peer, info, write=True):
        raise Forbidden(f"{where}: {peer.describe()} may not write the object of region '{region}'")


def require_input_access(caller: SharedMemoryCaller, info: os.stat_result, region: str, where: str) -> None:
    """403 unless the caller may read the object of `region` (regions are shared by name between clients)."""
    peer = caller.peer
    if peer is not None and not caller.has_key and not may_access(peer, info, write=False):
        raise Forbidden(f"{where}: {peer.describe()} may not read the object of region '{region}'")


def mapping_failed(key: str, exc: OSError) -> Exception:
    """The error for an mmap that failed, naming its cause: the object refuses the mapping (400), the server
    is out of descriptors (503) or of address space or mappings (507); never a 500."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return out_of_descriptors(f"register {echo(key)}")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.ENODEV, errno.EINVAL):
        return BadRequest(f"register {echo(key)}: the object cannot be mapped as registered "
                          f"({os.strerror(exc.errno or 0)}: a seal or its descriptor's access refuses it)")
    if exc.errno == errno.ENOMEM:
        return InsufficientStorage(f"register {echo(key)}: the server's address space or its count of mappings "
                                   "(vm.max_map_count) is exhausted; unregister regions first")
    return InsufficientStorage(f"register {echo(key)}: the server cannot map it ({os.strerror(exc.errno or 0)})")
