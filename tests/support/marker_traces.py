"""CPU traces of steps with `train` markers and known times, written with the vendored XSpace classes."""

from __future__ import annotations

from pathlib import Path

from trace_fixtures import _Plane, _write_space, _xspace_class

MS = 1_000_000  # ns
BASE_NS = 1_700_000_000 * 10**9


def marker_trace(path: Path, edit=None, steps: int = 6) -> Path:
    """Steps of exactly 10 ms with `train` markers: input 2 ms (IteratorGetNext), compute 5 ms
    (ExecutorState::Process on a worker thread), host 3 ms. `edit(space)` changes the message."""
    space = _xspace_class()()
    space.hostnames.append("host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    worker = host.line(101, "tf_Compute/1", BASE_NS)
    for k in range(steps):
        t = BASE_NS + 10 * MS + k * 10 * MS
        host.event(python, "train", t, t + 10 * MS, step_num=k, _r=1)
        host.event(python, "IteratorGetNext", t, t + 2 * MS)
        host.event(worker, "ExecutorState::Process", t + 2 * MS, t + 7 * MS)
    host.finish()
    if edit is not None:
        edit(space)
    return _write_space(space, path)


# OSC 0 retitles the terminal, OSC 52 writes its clipboard, CSI 31m recolours it, a bidi override reorders it
HOSTILE_OP = "net/\x1b]0;pwned\x07conv\x1b]52;c;cm0gLXJmIH4=\x07/\x1b[31mConv2D\u202e\x9b:Conv2D"
ACTIVE = ("\x1b", "\x07", "\u202e", "\x9b")


def steps_trace(
    path: Path, *, op: str = "model/conv:Conv2D", steps: int = 6, base_ns: int = BASE_NS, hostname: str = "host"
) -> Path:
    """Steps of 10 ms with `train` markers from `base_ns`: 2 ms of IteratorGetNext, then `op` for 5 ms."""
    space = _xspace_class()()
    space.hostnames.append(hostname)
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", base_ns)
    worker = host.line(101, "tf_Compute/1", base_ns)
    for k in range(steps):
        t = base_ns + 10 * MS + k * 10 * MS
        host.event(python, "train", t, t + 10 * MS, step_num=k, _r=1)
        host.event(python, "IteratorGetNext", t, t + 2 * MS)
        host.event(worker, op, t + 2 * MS, t + 7 * MS)
    host.finish()
    return _write_space(space, path)


def hostile_trace(path: Path) -> Path:
    """`steps_trace` whose op has `HOSTILE_OP` for a name, and the host's own name a newline."""
    return steps_trace(path, op=HOSTILE_OP, hostname="host\nfake line")


def assert_inert(text: str, where: str) -> None:
    found = [repr(c) for c in ACTIVE if c in text]
    assert not found, f"{where} carries {', '.join(found)}"
