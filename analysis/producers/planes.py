"""The profiler's own planes and lines (TSL/XProf), whatever program was traced.

The profiler writes one `/host:CPU` plane of host threads and one plane per device;
XProf's converter derives lines from a device's activity (`Steps`, `XLA Ops`, ...) that
would count it twice if read as activity.
"""

import re

HOST_PLANE = re.compile(r"^/host:")
# GPU and TPU planes; `/device:CUSTOM:*` planes (e.g. "Megascale Trace") are not devices.
DEVICE_PLANE = re.compile(r"^/device:(GPU|TPU)(?::|_)", re.IGNORECASE)
STREAM_LINE = re.compile(r"^Stream #\d+")
DERIVED_LINE_MIN_ID = 0xDEADBEEF
DERIVED_LINE_NAMES = frozenset(
    {
        "Steps",
        "XLA Modules",
        "XLA Ops",
        "TensorFlow Ops",
        "TensorFlow Name Scope",
        "Launch Stats",
        "Framework Ops",
        "Framework Name Scope",
        "Source code",
        "XLA TraceMe",
        "Async XLA Ops",
        "Sparse Core Steps",
    }
)
# The device's own step line (XProf's step grouping on a device plane).
STEPS_LINE = "Steps"
