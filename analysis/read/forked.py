"""Part of a numpy computation in a forked child, sent back through a pipe.

Reading and analysing a trace is numpy work on one core; part of it (some of the events'
decoding, some analysis stages) can run on another core in a child forked from this process,
which sees the trace and what was computed before without a copy. The child's arrays come back
out of band (pickle protocol 5), copied once from its memory into their final buffers here
(`process_vm_readv`: one copy, no turns of writer and reader), or, where the system refuses that
(a container's seccomp, not Linux), through the pipe.

Whatever goes wrong in the child (an exception, a kill, memory) reads as no answer: the caller
computes that half itself, so the result and its errors are those of one process.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Generic, TypeVar, cast

Placer = Callable[[list[int]], "list[memoryview] | None"]
ENV_VAR = "DEVPROF_FORK"  # 0: all the reading and analysis in this one process
_COUNT = struct.Struct("<Q")
_COPIED, _USE_PIPE = b"c", b"p"  # this process's word to the child once it has its addresses
IOV_MAX = 1024  # iovecs per process_vm_readv call (Linux's UIO_MAXIOV)


def without(trick: str) -> bool:
    """Whether the speed trick `trick` is switched off for a benchmark (DEVPROF_WITHOUT=halves,early,...)."""
    return trick in os.environ.get("DEVPROF_WITHOUT", "").split(",")


def can_fork() -> bool:
    """Whether a forked child can share the work: Linux's fork, two cores or more, and no other Python
    thread or TensorFlow in this process (a lock one of their threads held stays held in the child)."""
    if os.environ.get(ENV_VAR, "").strip() == "0" or not hasattr(os, "fork"):
        return False
    if threading.active_count() != 1 or "tensorflow" in sys.modules:
        return False
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        return False  # a pool's worker: its siblings have the other cores
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except (AttributeError, OSError):
        return False


_WHEN_A_CHILD_ENDS: list[tuple[int, Callable[[], object]]] = []  # (the registering process, callback)


def call_when_a_child_ends(callback: Callable[[], object]) -> None:
    """Call `callback()` once, the first time a forked child of this process has answered and ended: its
    core and its memory are free, so a helper kept idle while both cores were busy (and the memory at
    its peak) can start its work. Errors of the callback are the helper's to report, not the caller's."""
    _WHEN_A_CHILD_ENDS.append((os.getpid(), callback))


def _a_child_ended() -> None:
    pid = os.getpid()
    due = [callback for owner, callback in _WHEN_A_CHILD_ENDS if owner == pid]  # not a forked child's copies
    _WHEN_A_CHILD_ENDS.clear()
    for callback in due:
        try:
            callback()
        except Exception:  # noqa: BLE001 - see call_when_a_child_ends
            pass


class ForkedHalf:
    """A child running `work()` (it returns picklable data, numpy arrays out of band); `result()` is
    its answer or None, `close()` ends and reaps it."""

    def __init__(self, work: Callable[[], object]):
        self.pid = 0
        self.back = -1
        read_fd, write_fd = os.pipe()
        back_read, back_write = os.pipe()  # this process's word to the child: copied, or send through the pipe
        _widen(read_fd)
        try:
            pid = os.fork()
        except OSError:
            for fd in (read_fd, write_fd, back_read, back_write):
                os.close(fd)
            self.fd = -1
            return
        if pid == 0:  # the child: never returns into the caller's code
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends this one
                os.close(read_fd)
                os.close(back_write)
                _send(write_fd, work(), back_read)
                code = 0
            except BaseException:  # noqa: BLE001 - the parent computes this half itself
                pass
            finally:
                os._exit(code)  # not the parent's atexit handlers nor its buffered output
        os.close(write_fd)
        os.close(back_read)
        self.pid, self.fd, self.back = pid, read_fd, back_write

    def result(self, place: Placer | None = None) -> object | None:
        """The child's answer, or None where it gave none (it failed, was killed, or never started).
        `place(sizes)`: where its out-of-band buffers (their sizes in bytes, in pickling order) are to be
        read, writable memoryviews of those sizes (the arrays it sent are then views of them), or None
        for buffers of their own."""
        if self.fd < 0:
            return None
        try:
            return _receive(self.fd, place, self.pid, self.back)
        except (OSError, EOFError, ValueError, pickle.UnpicklingError, struct.error):
            return None
        finally:
            self.close()
            _a_child_ended()

    def close(self) -> None:
        for fd in (self.fd, self.back):
            if fd >= 0:
                os.close(fd)
        self.fd = self.back = -1
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0


T = TypeVar("T")


class Beside(Generic[T]):
    """`work(given)` computed by a forked child while this process goes on (`fork`), or here, when
    `result()` asks for it, where it was not forked or the child gave no answer. `given()` is what this
    process `give`s once it has it (the child waits for it there): the work that needs it can begin
    before it is known. Warnings the child's work raised are raised again here, so that they are
    reported as if the work had run here."""

    def __init__(self, work: Callable[[Callable[[], object]], T], fork: bool):
        self.work = work
        self._given: list[object] = []
        self._to_child = -1
        self.child: ForkedHalf | None = None
        if not fork:
            return
        from_parent, to_child = os.pipe()
        _widen(from_parent)

        def in_child() -> tuple[object, list[Warning]]:
            os.close(to_child)
            return _with_warnings(lambda: work(lambda: _receive(from_parent)))

        self.child = ForkedHalf(in_child)
        os.close(from_parent)
        self._to_child = to_child

    def give(self, value: object) -> None:
        """What `given()` returns, to the child (and kept here, should the work be done here)."""
        self._given = [value]
        if self._to_child >= 0:
            try:
                _send(self._to_child, value)
            except (OSError, pickle.PicklingError):  # the child is gone, or cannot have it: done here
                if self.child is not None:
                    self.child.close()
                    self.child = None
            finally:
                os.close(self._to_child)
                self._to_child = -1

    def result(self) -> T:
        answer = self.child.result() if self.child is not None else None
        self.close()
        if not isinstance(answer, tuple):
            return self.work(self._given_here)
        value, caught = answer
        for message in caught:
            warnings.warn(message, stacklevel=2)
        return cast(T, value)

    def _given_here(self) -> object:
        if not self._given:
            raise RuntimeError("the work asked for what was never given")
        return self._given[0]

    def close(self) -> None:
        if self._to_child >= 0:
            os.close(self._to_child)
            self._to_child = -1
        if self.child is not None:
            self.child.close()
            self.child = None

    def __enter__(self) -> Beside[T]:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _with_warnings(work: Callable[[], object]) -> tuple[object, list[Warning]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = work()
    return value, [item.message for item in caught if isinstance(item.message, Warning)]


def _send(fd: int, value: object, back: int = -1) -> None:
    """`value` pickled, then its buffers' addresses: the parent copies them from here and says so on
    `back`, or asks for them through the pipe. The buffers live until then."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(header), *(buffer.raw() for buffer in buffers)]
    _write(fd, _COUNT.pack(len(views)) + b"".join(_COUNT.pack(view.nbytes) for view in views))
    _write(fd, views[0])
    if back >= 0 and len(views) > 1:
        _write(fd, b"".join(_COUNT.pack(_address(view)) for view in views[1:]))
        if os.read(back, 1) == _COPIED:
            return
    for view in views[1:]:
        _write(fd, view)


def _write(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _receive(fd: int, place: Placer | None = None, pid: int = 0, back: int = -1) -> object:
    (count,) = _COUNT.unpack(_read(fd, _COUNT.size))
    sizes = struct.unpack(f"<{count}Q", _read(fd, _COUNT.size * count))
    header = _read(fd, sizes[0])
    views = place(list(sizes[1:])) if place is not None else None
    buffers: list[bytearray] | list[memoryview]
    if back >= 0 and count > 1:
        addresses = struct.unpack(f"<{count - 1}Q", _read(fd, _COUNT.size * (count - 1)))
        if views is None:
            buffers = [bytearray(size) for size in sizes[1:]]
            views = [memoryview(buffer) for buffer in buffers]
        try:
            copied = _copy_from(pid, addresses, views)
        except Exception:  # noqa: BLE001 - any failure of the copy: the pipe sends it instead
            copied = False
        if copied:
            os.write(back, _COPIED)
            return pickle.loads(header, buffers=views)
        os.write(back, _USE_PIPE)
    if views is None:
        buffers = [_read(fd, size) for size in sizes[1:]]
    else:
        for view in views:
            _read_into(fd, view)
        buffers = views
    return pickle.loads(header, buffers=buffers)


def _copy_from(pid: int, addresses: tuple[int, ...], views: list[memoryview]) -> bool:
    """Whether the child's buffers at `addresses` were copied into `views` whole (process_vm_readv, in
    batches of IOV_MAX); False where the system refuses it (a container's seccomp, no such call)."""
    vm_readv = _process_vm_readv()
    if vm_readv is None or without("vm_copy"):
        return False
    import ctypes

    class IOVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]

    pairs = [(_address(view), address, view.nbytes) for view, address in zip(views, addresses) if view.nbytes]
    for first in range(0, len(pairs), IOV_MAX):
        batch = pairs[first:first + IOV_MAX]
        local = (IOVec * len(batch))(*[IOVec(here, size) for here, _, size in batch])
        remote = (IOVec * len(batch))(*[IOVec(there, size) for _, there, size in batch])
        if vm_readv(pid, local, len(batch), remote, len(batch), 0) != sum(size for *_, size in batch):
            return False  # refused, or short: the pipe sends it all again
    return True


def _address(view: memoryview) -> int:
    """Where the buffer behind `view` starts in this process's memory (0 for an empty one)."""
    import numpy as np

    return np.frombuffer(view, dtype=np.uint8).ctypes.data if view.nbytes else 0


def _process_vm_readv():
    try:
        import ctypes

        call = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):  # not Linux, or a libc without it
        return None
    call.restype = ctypes.c_ssize_t
    call.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    return call


def _read(fd: int, size: int) -> bytearray:
    data = bytearray(size)
    _read_into(fd, memoryview(data))
    return data


def _read_into(fd: int, view: memoryview) -> None:
    view, done = view.cast("B"), 0
    while done < view.nbytes:
        got = os.readv(fd, [view[done:]])
        if not got:
            raise EOFError("the child ended before its answer")
        done += got


def _widen(fd: int) -> None:
    """A pipe of 1 MiB where Linux allows it: 16 times fewer turns of writer and reader than 64 KiB."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass
