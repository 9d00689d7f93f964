"""Cloud TPU planes: no streams; `XLA Ops` is the device's activity, `XLA Modules` its programs."""

import re

from analysis.producers import Producer

PRODUCER = Producer(
    name="tpu",
    device_input=r"infeed",
    device_copy=r"outfeed|^(?:copy-start|copy-done)",
)

PLANE = re.compile(r"^/device:TPU")
ACTIVITY_LINE = "XLA Ops"
PROGRAM_LINE = "XLA Modules"
