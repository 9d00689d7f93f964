"""An out-of-memory error that ends a run: TensorFlow's `ResourceExhaustedError` read into run.json's
`oom` (the allocation that failed: bytes, shape, dtype, op, allocator, device).

No TensorFlow import: the error is known by its class name, and its message is parsed as text.
"""

from __future__ import annotations

import math
import re
import time

OOM_ERRORS = ("ResourceExhaustedError",)  # tf.errors; XLA's and JAX's OOMs say RESOURCE_EXHAUSTED in the text

# Bytes per element of TensorFlow's DataTypeString names; string, resource and variant have none.
DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "half": 2,
    "bfloat16": 2,
    "float8_e5m2": 1,
    "float8_e4m3fn": 1,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "qint8": 1,
    "quint8": 1,
    "int16": 2,
    "uint16": 2,
    "qint16": 2,
    "quint16": 2,
    "int32": 4,
    "uint32": 4,
    "qint32": 4,
    "int64": 8,
    "uint64": 8,
    "complex64": 8,
    "complex128": 16,
    "int4": 0.5,
    "uint4": 0.5,
}

# "OOM when allocating tensor with shape[256,64,112,112] and type float on /job:.../device:GPU:0 by
# allocator GPU_0_bfc" (TF 1.x: "tensor of shape [..]")
_ALLOCATING = re.compile(
    r"OOM when allocating tensor (?:with|of) shape\s*\[(?P<shape>[^\]]*)\]"
    r"(?:\s+and type (?P<dtype>\w+))?(?:\s+on (?P<device>\S+?))?(?:\s+by allocator (?P<allocator>[^\s\[]+))?"
    r"(?=[\s\[]|$)"
)
_XLA_BYTES = re.compile(r"(?:trying to allocate|allocate) (?P<bytes>\d+) bytes")
_NODE = re.compile(r"\{\{node (?P<op>[^}\s]+)\s*\}\}|\[\[node (?P<op1>[^\s\]]+)|Node: '(?P<op2>[^']+)'")
_OP = re.compile(r"\[Op:(?P<op>[^\]\s]+)\]")


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` is TensorFlow's out-of-memory error (by class name: TensorFlow need not be loaded)."""
    return any(cls.__name__ in OOM_ERRORS for cls in type(exc).__mro__)


def shape_bytes(shape: list[int] | None, dtype: str | None) -> int | None:
    """The bytes of a dense tensor of `shape` and `dtype`; None where either is unknown."""
    width = DTYPE_BYTES.get(dtype or "")
    if shape is None or width is None:
        return None
    return int(math.ceil(math.prod(shape) * width))


def parse_oom(message: str) -> dict | None:
    """run.json's `oom` from the error's text: {bytes, shape, dtype, op, allocator, device}, null where the
    message lacks a part; None where the text is no out-of-memory error."""
    found = _ALLOCATING.search(message)
    xla = _XLA_BYTES.search(message)
    if found is None and xla is None and "RESOURCE_EXHAUSTED" not in message and "Out of memory" not in message:
        return None
    shape = dtype = device = allocator = None
    if found is not None:
        dims = [d.strip() for d in found.group("shape").split(",") if d.strip()]
        shape = [int(d) for d in dims] if all(d.isdigit() for d in dims) else None
        dtype, device, allocator = found.group("dtype"), found.group("device"), found.group("allocator")
    size = shape_bytes(shape, dtype)
    if size is None and xla is not None:
        size = int(xla.group("bytes"))
    # the graph's node is the op that allocated; [Op:...] is the eager op, or the tf.function that ran it
    node = _NODE.search(message)
    eager = _OP.search(message)
    op = next((v for v in node.groups() if v), None) if node is not None else eager.group("op") if eager else None
    return {"bytes": size, "shape": shape, "dtype": dtype, "op": op, "allocator": allocator, "device": device}


def oom_record(exc: BaseException, at_s: float | None = None) -> dict | None:
    """run.json's `oom` for an error that ends a run, with `time_s` (the samplers' clock: Unix seconds)
    when it ended it; None for any other error."""
    if not is_oom(exc):
        return None
    parsed = parse_oom(str(getattr(exc, "message", None) or exc)) or {
        "bytes": None,
        "shape": None,
        "dtype": None,
        "op": None,
        "allocator": None,
        "device": None,
    }
    return {**parsed, "time_s": time.time() if at_s is None else at_s}
