"""Part of a numpy computation in a forked child, sent back through a pipe.

Reading and analysing a trace is numpy work on one core; part of it (some of the events'
decoding, some analysis stages) can run on another core in a child forked from this process,
which sees the trace and what was computed before without a copy. The child's arrays come back
through a pipe out of band (pickle protocol 5), written once and read once into their final
buffers.

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


class ForkedHalf:
    """A child running `work()` (it returns picklable data, numpy arrays out of band); `result()` is
    its answer or None, `close()` ends and reaps it."""

    def __init__(self, work: Callable[[], object]):
        self.pid = 0
        read_fd, write_fd = os.pipe()
        _widen(read_fd)
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            self.fd = -1
            return
        if pid == 0:  # the child: never returns into the caller's code
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends this one
                os.close(read_fd)
                _send(write_fd, work())
                code = 0
            except BaseException:  # noqa: BLE001 - the parent computes this half itself
                pass
            finally:
                os._exit(code)  # not the parent's atexit handlers nor its buffered output
        os.close(write_fd)
        self.pid, self.fd = pid, read_fd

    def result(self, place: Placer | None = None) -> object | None:
        """The child's answer, or None where it gave none (it failed, was killed, or never started).
        `place(sizes)`: where its out-of-band buffers (their sizes in bytes, in pickling order) are to be
        read, writable memoryviews of those sizes (the arrays it sent are then views of them), or None
        for buffers of their own."""
        if self.fd < 0:
            return None
        try:
            return _receive(self.fd, place)
        except (OSError, EOFError, ValueError, pickle.UnpicklingError, struct.error):
            return None
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
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


def _send(fd: int, value: object) -> None:
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(header), *(buffer.raw() for buffer in buffers)]
    _write(fd, _COUNT.pack(len(views)) + b"".join(_COUNT.pack(view.nbytes) for view in views))
    for view in views:
        _write(fd, view)


def _write(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _receive(fd: int, place: Placer | None = None) -> object:
    (count,) = _COUNT.unpack(_read(fd, _COUNT.size))
    sizes = struct.unpack(f"<{count}Q", _read(fd, _COUNT.size * count))
    header = _read(fd, sizes[0])
    views = place(list(sizes[1:])) if place is not None else None
    buffers: list[bytearray] | list[memoryview]
    if views is None:
        buffers = [_read(fd, size) for size in sizes[1:]]
    else:
        for view in views:
            _read_into(fd, view)
        buffers = views
    return pickle.loads(header, buffers=buffers)


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
