"""What devprof knows about each kind of device and precision, in one table.

Advice and comparisons read these facts instead of comparing device names: which
mixed-precision policy to suggest, whether XLA is worth suggesting, which peak FLOP/s
a precision is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceFacts:
    kind: str
    mixed_precision: str  # the `--precision` policy with fast matrix units on this kind
    precision_note: str  # why, shown beside the suggestion ("" when nothing to add)
    xla_helps: bool  # on CPUs TensorFlow's oneDNN convolutions beat XLA's (about 3x for the seed CNN)
    float16_is_slow: bool  # float16 has no fast kernels (emulated, often 10-100x slower)


DEVICE_FACTS = {
    "cpu": DeviceFacts(
        "cpu", "mixed_bfloat16", "bfloat16 matrix units on recent CPUs", xla_helps=False, float16_is_slow=True
    ),
    "gpu": DeviceFacts("gpu", "mixed_float16", "", xla_helps=True, float16_is_slow=False),
    "tpu": DeviceFacts("tpu", "mixed_bfloat16", "", xla_helps=True, float16_is_slow=True),
}
UNKNOWN = DeviceFacts("unknown", "mixed_bfloat16", "", xla_helps=True, float16_is_slow=False)

# The dtype of `devprof peak` a run's precision is measured against.
PEAK_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def kind_of(device: str | None) -> str:
    """`cpu`, `gpu` or `tpu` from a device label such as `gpu x8`; other labels pass through."""
    return str(device or "").split(" ")[0].lower()


def facts_for(device: str | None) -> DeviceFacts:
    return DEVICE_FACTS.get(kind_of(device), UNKNOWN)


def peak_dtype(precision: str | None) -> str:
    return PEAK_DTYPE.get(precision or "float32", "float32")
