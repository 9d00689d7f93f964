"""XSpace as protobuf messages, for tools that write or edit traces (test fixtures, benches).

Reading a trace does not use this module (`analysis.trace` decodes the file itself). Editing
one needs message classes: the test suite's own `xplane_proto` (TensorFlow's schema, vendored),
so that no TensorFlow is needed.
"""

from __future__ import annotations

from pathlib import Path

from analysis.read.trace import TraceUnreadable


def _xplane_module():
    """The generated XSpace module (tests/support/xplane_proto), the same messages as TensorFlow's."""
    from xplane_proto import xplane_pb2

    return xplane_pb2


def load_xspace(xplane: str | Path):
    """Parse one `.xplane.pb` into an XSpace message; a truncated or foreign file raises `TraceUnreadable`."""
    xplane = Path(xplane)
    data = xplane.read_bytes()
    if not data:
        raise TraceUnreadable(f"{xplane} is empty (0 bytes): the profiler did not finish writing it")
    space = _xplane_module().XSpace()
    try:
        space.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeWarning-like errors
        raise TraceUnreadable(
            f"{xplane} is not a readable XSpace trace ({len(data)} bytes, truncated or corrupt): {exc}"
        ) from None
    if not space.planes:
        raise TraceUnreadable(
            f"{xplane} holds no profiler planes ({len(data)} bytes): truncated or not an XSpace trace"
        )
    return space
