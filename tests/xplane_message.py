"""XSpace as protobuf messages, for tools that write or edit traces (test fixtures, benches).

Reading a trace does not use this module (`analysis.trace` decodes the file itself). Editing
one needs message classes: TensorFlow's generated `xplane_pb2.py` is loaded from the installed
TensorFlow package by file, without importing TensorFlow.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from analysis.read.trace import TraceError, TraceUnreadable


def _xplane_module():
    """TensorFlow's generated XSpace module, without importing TensorFlow."""
    loaded = sys.modules.get("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    if loaded is not None:
        return loaded
    cached = sys.modules.get("_devprof_xplane_pb2")
    if cached is not None:
        return cached
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise TraceError("editing traces needs the XSpace protobuf shipped with TensorFlow; TensorFlow is not installed")
    module_path = Path(list(spec.submodule_search_locations)[0]) / "tsl" / "profiler" / "protobuf" / "xplane_pb2.py"
    module_spec = importlib.util.spec_from_file_location("_devprof_xplane_pb2", module_path)
    if module_spec is None or not module_path.exists():
        raise TraceError(f"TensorFlow's XSpace protobuf module is missing: looked for {module_path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    sys.modules["_devprof_xplane_pb2"] = module
    return module


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
        raise TraceUnreadable(f"{xplane} is not a readable XSpace trace ({len(data)} bytes, truncated or corrupt): {exc}") from None
    if not space.planes:
        raise TraceUnreadable(f"{xplane} holds no profiler planes ({len(data)} bytes): truncated or not an XSpace trace")
    return space
