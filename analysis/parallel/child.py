"""A forked child and the one pipe protocol between it and this process.

The child runs `work(receive)`: `receive()` waits for the next value this process `send`s. Its
answer comes back pickled (protocol 5, its numpy arrays out of band, each read straight into its
own buffer or into one this process gives: `result(place)`). Whatever goes wrong in the child (an
exception, a kill, memory) reads as no answer, and the caller does that work itself, so the result
and its errors are those of one process. Warnings the child's work raised come back with its answer.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import warnings
from collections.abc import Callable
from typing import Generic, TypeVar, cast

Placer = Callable[[list[int]], "list[memoryview] | None"]
_COUNT = struct.Struct("<Q")


class Child:
    """A child forked to run `work(receive)`; `result()` is its answer or None, `close()` ends and reaps
    it. `on_end()` is called once its answer is in (its core and memory are free)."""

    def __init__(self, work: Callable[[Callable[[], object]], object], on_end: Callable[[], object] | None = None):
        self.pid, self.fd, self.to_child = 0, -1, -1
        self.on_end = on_end
        self.rusage: object = None
        try:
            from_child, to_parent = os.pipe()
            from_parent, to_child = os.pipe()
        except OSError:
            return
        for fd in (from_child, from_parent):
            _widen(fd)
        try:
            pid = os.fork()
        except OSError:
            for fd in (from_child, to_parent, from_parent, to_child):
                os.close(fd)
            return
        if pid == 0:  # the child: never returns into the caller's code
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends this one
                os.close(from_child)
                os.close(to_child)
                _send(to_parent, _with_warnings(lambda: work(lambda: _receive(from_parent))))
                code = 0
            except BaseException:  # noqa: BLE001 - the parent does this work itself
                pass
            finally:
                os._exit(code)  # not the parent's atexit handlers nor its buffered output
        os.close(to_parent)
        os.close(from_parent)
        self.pid, self.fd, self.to_child = pid, from_child, to_child

    @property
    def started(self) -> bool:
        return self.fd >= 0

    def send(self, value: object) -> bool:
        """`value` to the child's next `receive()`; False where the child is gone or cannot have it."""
        if self.to_child < 0:
            return False
        try:
            _send(self.to_child, value)
            return True
        except (OSError, pickle.PicklingError):
            self.close()
            return False

    def result(
        self, place: Placer | None = None, timeout_s: float | None = None
    ) -> tuple[object, list[Warning]] | None:
        """The child's answer and the warnings its work raised, or None where it gave none (it failed, was
        killed, or never started). `place(sizes)`: where its out-of-band buffers (their sizes in bytes, in
        pickling order) are to be read, writable memoryviews of those sizes, or None for buffers of their own.
        `timeout_s`: how long it may take to begin its answer (None: as long as it takes)."""
        if self.fd < 0:
            return None
        try:
            answer = _receive(self.fd, place) if _ready(self.fd, timeout_s) else None
        except (OSError, EOFError, ValueError, pickle.UnpicklingError, struct.error):
            answer = None
        finally:
            self.close()
        if self.on_end is not None:
            on_end, self.on_end = self.on_end, None
            try:
                on_end()
            except Exception:  # noqa: BLE001 - the callback's errors are its own to report
                pass
        return cast("tuple[object, list[Warning]]", answer) if isinstance(answer, tuple) and len(answer) == 2 else None

    def close(self) -> None:
        if self.pid:  # ended before its pipes close: it never sees them closed (and has nothing to say of it)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        for fd in (self.fd, self.to_child):
            if fd >= 0:
                os.close(fd)
        self.fd = self.to_child = -1
        if self.pid:
            try:
                self.rusage = os.wait4(self.pid, 0)[2]  # its CPU time and peak RSS, for the benchmarks
            except ChildProcessError:
                pass
            self.pid = 0


T = TypeVar("T")


class Beside(Generic[T]):
    """`work(given)` computed by a forked child while this process goes on, or here, when `result()` asks
    for it, where no child was forked or it gave no answer. `given()` is what this process `give`s once
    it has it (the child waits for it there): the work that needs it can begin before it is known."""

    def __init__(self, work: Callable[[Callable[[], object]], T], fork: Callable[..., Child | None]):
        self.work = work
        self._given: list[object] = []
        self.child = fork(work)

    def give(self, value: object) -> None:
        """What `given()` returns, to the child (and kept here, should the work be done here)."""
        self._given = [value]
        if self.child is not None and not self.child.send(value):
            self.child = None

    def result(self) -> T:
        answer = self.child.result() if self.child is not None else None
        self.close()
        if answer is None:
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
    """`value` pickled: the count and sizes of its pieces, the pickle, then its out-of-band buffers."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(header), *(buffer.raw() for buffer in buffers)]
    _write(fd, _COUNT.pack(len(views)) + b"".join(_COUNT.pack(view.nbytes) for view in views))
    for view in views:
        _write(fd, view)


def _write(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int, place: Placer | None = None) -> object:
    (count,) = _COUNT.unpack(_read(fd, _COUNT.size))
    sizes = struct.unpack(f"<{count}Q", _read(fd, _COUNT.size * count))
    header = _read(fd, sizes[0])
    views = place(list(sizes[1:])) if place is not None and count > 1 else None
    if views is None:
        return pickle.loads(header, buffers=[_read(fd, size) for size in sizes[1:]])
    for view in views:
        _read_into(fd, view)
    return pickle.loads(header, buffers=views)


def _ready(fd: int, timeout_s: float | None) -> bool:
    """Whether `fd` has something to read (or its writer is gone) within `timeout_s`."""
    if timeout_s is None:
        return True
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    return bool(poller.poll(timeout_s * 1000))


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
