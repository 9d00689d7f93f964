"""FLOPs and bytes of XLA programs (JAX, `jit_compile=True`), from the HLO stored in the trace.

XLA writes each compiled program's `HloProto` into the trace, as the `Hlo Proto` stat of one
event metadata entry per program on the `/host:metadata` plane. The device kernels name the
instruction they run (`hlo_op` stat) and its program (`hlo_module`, `program_id`). This module
gives one cost row per kernel-level instruction of each program (the instructions of the
entry computation and of the computations it runs through `while`, `conditional`, `call` and
async wrappers: never the instructions a fusion fuses, which are counted in their fusion):
the columns of the cost table (`COST_COLUMNS`), plus `program_id`.

The rules (docs/rules.md, "FLOPs of XLA programs"):
- `dot`: 2 x output elements x the product of the lhs contracting dimensions.
- `convolution`: 2 x output elements x kernel spatial elements x kernel input features (the
  input features / `feature_group_count`); padded positions count as computed.
- GEMM library calls (`__cublas$gemm`, `__cublas$lt$matmul`, hipBLASLt): a dot of operands 0
  and 1 with the backend config's `dot_dimension_numbers`; without them the lhs's last
  dimension is contracted (XLA's canonical `[batch..., M, K] x [batch..., K, N]`).
  Convolution library calls (`__cudnn$conv*`, MIOpen's): the convolution rule on the forward
  convolution the call computes (its output is operand 0 for `BackwardInput`, operand 1 for
  `BackwardFilter`, else the result). Other custom-calls: unknown (NaN).
- `fusion`: the sum over the instructions it fuses, nested fusions included.
- `reduce`: 1 FLOP per reduced input element; `reduce-window`: output elements x window
  elements; `select-and-scatter`: source elements x window elements; `scatter`: 1 per update
  element; `sort`: elements x log2(sorted dimension) comparisons.
- data movement (copy, broadcast, transpose, slice, gather, concatenate, pad, collectives, ...):
  0 FLOPs; every other opcode (elementwise arithmetic, compare, select, convert,
  transcendentals): 1 FLOP per output element.
- bytes: the kernel-level instruction's operands + outputs (tuples summed), each at its element
  type's width, without the scratch workspace a library call asks for as its last output
  (a 1-D s8/u8 buffer: cuBLAS' and cuDNN's scratch, often larger than the matrices, and not
  traffic of the math).

The HloProto classes are devprof's own (`analysis.read.xla_proto`, generated from a trimmed,
wire-compatible copy of XLA's schema), so the costs need no TensorFlow. Without a protobuf runtime
they can load with, the costs are unknown, with one note.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

import numpy as np
import pandas as pd

from analysis.read import trace as trace_reader
from analysis.read.run_files import warn

METADATA_PLANE = "/host:metadata"
HLO_PROTO_STAT = "Hlo Proto"

# The cost table's columns (the contract with TensorFlow's op costs), then this source's own.
COST_COLUMNS = (
    "function",
    "op",
    "type",
    "dtype",
    "kind",
    "input_shapes",
    "output_shapes",
    "flops",
    "bytes",
    "flops_source",
    "chain_flops",
    "chain_bytes",
)
COLUMNS = COST_COLUMNS + ("program_id",)

# Computations whose instructions launch their own kernels: the calling opcode's called computations.
KERNEL_LEVEL_CALLERS = frozenset({"while", "conditional", "call", "async-start", "async-update", "async-done"})
# Instructions that launch no kernel: no row.
NO_KERNEL = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
        "partition-id",
        "replica-id",
        "while",
        "conditional",
        "call",
        "async-start",
        "async-update",
        "async-done",
    }
)
# Data movement: 0 FLOPs.
DATA_MOVEMENT = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "bitcast-convert",
        "broadcast",
        "reshape",
        "dynamic-reshape",
        "transpose",
        "copy",
        "copy-start",
        "copy-done",
        "slice",
        "dynamic-slice",
        "dynamic-update-slice",
        "concatenate",
        "pad",
        "gather",
        "iota",
        "reverse",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
        "partition-id",
        "replica-id",
        "get-dimension-size",
        "set-dimension-size",
        "send",
        "send-done",
        "recv",
        "recv-done",
        "infeed",
        "outfeed",
        "all-gather",
        "all-gather-start",
        "all-gather-done",
        "all-reduce",
        "all-reduce-start",
        "all-reduce-done",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
        "collective-permute-start",
        "collective-permute-done",
        "collective-broadcast",
        "ragged-all-to-all",
        "while",
        "conditional",
        "call",
        "async-start",
        "async-update",
        "async-done",
    }
)
GEMM_TARGET = re.compile(r"gemm|matmul", re.IGNORECASE)
CONV_TARGET = re.compile(r"^__(cudnn|miopen)\$conv", re.IGNORECASE)

# XLA element type names (xla_data.proto's PrimitiveType) -> the dtype names devprof uses.
DTYPE_NAMES = {
    "PRED": "bool",
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "C128": "complex128",
}
_WIDTH = re.compile(r"^[A-Z]+?(\d+)")
_SMALL_FLOAT = re.compile(r"^F(\d+)(E\d+M\d+\w*)$")


# ---------------------------------------------------------------- the HloProto classes


class _Unavailable(Exception):
    """The HloProto classes cannot be had here."""


@functools.lru_cache(maxsize=1)
def _protos() -> tuple[Any, Any]:
    """devprof's generated `hlo_pb2` and `xla_data_pb2`, imported on first use (protobuf costs import
    time that traces without XLA programs need not pay); raises `_Unavailable`."""
    try:
        from analysis.read.xla_proto import hlo_pb2, xla_data_pb2
    except Exception as exc:  # no protobuf, or one older than the generated code (its VersionError)
        raise _Unavailable(f"XLA's HloProto classes could not be loaded ({type(exc).__name__}: {exc})") from None
    return hlo_pb2, xla_data_pb2


def hlo_proto_class() -> Any:
    """XLA's `HloProto` message class; raises `_Unavailable`."""
    return _protos()[0].HloProto


# ---------------------------------------------------------------- shapes


@functools.lru_cache(maxsize=None)
def _type_info(element_type: int) -> tuple[str, float]:
    """(dtype name, bytes per element) of an xla PrimitiveType number; ("", nan) for tuples and tokens."""
    name = _protos()[1].PrimitiveType.DESCRIPTOR.values_by_number.get(element_type)
    label = name.name if name is not None else ""
    if label == "PRED":
        return "bool", 1.0
    width = _WIDTH.match(label)
    if not width or label in ("TUPLE", "OPAQUE_TYPE", "TOKEN"):
        return "", math.nan
    bits = int(width.group(1))
    if label in DTYPE_NAMES:
        dtype = DTYPE_NAMES[label]
    elif label[0] in "SU" and label[1:].isdigit():
        dtype = ("int" if label[0] == "S" else "uint") + label[1:]
    else:  # F8E4M3FN -> float8_e4m3fn, as ml_dtypes names them
        small_float = _SMALL_FLOAT.match(label)
        dtype = f"float{small_float.group(1)}_{small_float.group(2).lower()}" if small_float else label.lower()
    return dtype, bits / 8


def _leaves(shape) -> list:
    if shape.tuple_shapes:
        return [leaf for inner in shape.tuple_shapes for leaf in _leaves(inner)]
    return [shape]


def _elements(shape) -> int:
    return int(np.prod([int(d) for d in shape.dimensions], dtype=np.float64)) if shape.dimensions else 1


def _bytes(shapes) -> float:
    total = 0.0
    for leaf in shapes:
        width = _type_info(leaf.element_type)[1]
        if not math.isnan(width):  # tokens carry no data
            total += math.ceil(_elements(leaf) * width)
    return total


def _shape_text(shapes) -> str:
    return ";".join("x".join(str(int(d)) for d in leaf.dimensions) for leaf in shapes)


def _dtype(shape) -> str:
    for leaf in _leaves(shape):
        dtype = _type_info(leaf.element_type)[0]
        if dtype:
            return dtype
    return ""


# ---------------------------------------------------------------- FLOPs


class _Module:
    """One HloModuleProto's instructions by id, and the FLOPs rules."""

    def __init__(self, module):
        self.module = module
        self.computations = {c.id: c for c in module.computations}
        self.instructions = {i.id: i for c in module.computations for i in c.instructions}

    def operand(self, instruction, index: int):
        return self.instructions.get(instruction.operand_ids[index]) if index < len(instruction.operand_ids) else None

    def operand_shapes(self, instruction) -> list:
        operands = [self.instructions.get(key) for key in instruction.operand_ids]
        return [leaf for operand in operands if operand is not None for leaf in _leaves(operand.shape)]

    def flops(self, instruction) -> tuple[float, str, str]:
        """FLOPs of one execution, the dtype its math runs in ("" when it has no matrix math) and its
        kind ("matrix" | "vector" | "")."""
        opcode = instruction.opcode
        if opcode == "fusion":
            total, dtype, kind = 0.0, "", ""
            for key in instruction.called_computation_ids:
                for inner in self.computations[key].instructions if key in self.computations else ():
                    flops, inner_dtype, inner_kind = self.flops(inner)
                    total += flops
                    if inner_kind == "matrix" and kind != "matrix":
                        kind, dtype = "matrix", inner_dtype
                    elif inner_kind == "vector" and not kind:
                        kind = "vector"
            return total, dtype, kind
        if opcode == "dot":
            return self._dot(instruction, instruction.dot_dimension_numbers.lhs_contracting_dimensions)
        if opcode == "convolution":
            return self._convolution(instruction, _leaves(instruction.shape)[0], self.operand(instruction, 1))
        if opcode == "custom-call":
            return self._custom_call(instruction)
        if opcode in DATA_MOVEMENT:
            return 0.0, "", ""
        output = sum(_elements(leaf) for leaf in _leaves(instruction.shape))
        if opcode == "reduce":
            inputs = self.operand_shapes(instruction)
            flops = float(sum(_elements(leaf) for leaf in inputs[: max(len(inputs) // 2, 1)]))
        elif opcode == "reduce-window":
            window = np.prod([d.size for d in instruction.window.dimensions], dtype=np.float64)
            flops = float(output * window)
        elif opcode == "select-and-scatter":
            source = self.operand(instruction, 1)
            window = np.prod([d.size for d in instruction.window.dimensions], dtype=np.float64)
            flops = float(_elements(source.shape) * window) if source is not None else math.nan
        elif opcode == "scatter":
            updates = self.operand_shapes(instruction)
            flops = float(sum(_elements(leaf) for leaf in updates[len(updates) // 2 + 1 :])) if updates else math.nan
        elif opcode == "sort":
            first = _leaves(instruction.shape)[0]
            size = (
                int(first.dimensions[instruction.dimensions[0]]) if instruction.dimensions and first.dimensions else 1
            )
            flops = float(_elements(first) * math.log2(max(size, 2)))
        else:
            flops = float(output)
        return flops, "", "vector" if flops else ""

    def _dot(self, instruction, contracting, lhs=None) -> tuple[float, str, str]:
        lhs = lhs if lhs is not None else self.operand(instruction, 0)
        if lhs is None:
            return math.nan, "", "matrix"
        output = _leaves(instruction.shape)[0]
        depth = np.prod([int(lhs.shape.dimensions[d]) for d in contracting], dtype=np.float64)
        return float(2 * _elements(output) * depth), _dtype(lhs.shape), "matrix"

    def _convolution(self, instruction, output, kernel) -> tuple[float, str, str]:
        numbers = instruction.convolution_dimension_numbers
        if kernel is None or output is None:
            return math.nan, "", "matrix"
        shape = kernel.shape if hasattr(kernel, "shape") else kernel
        dims = [int(d) for d in shape.dimensions]
        spatial = np.prod([dims[d] for d in numbers.kernel_spatial_dimensions], dtype=np.float64)
        features = dims[numbers.kernel_input_feature_dimension]  # the input features / feature_group_count
        lhs = self.operand(instruction, 0)
        return float(2 * _elements(output) * spatial * features), _dtype(lhs.shape if lhs else shape), "matrix"

    def _custom_call(self, instruction) -> tuple[float, str, str]:
        target = instruction.custom_call_target
        results = _leaves(instruction.shape)
        if CONV_TARGET.search(target):
            if "BackwardFilter" in target:
                output, kernel = self.operand(instruction, 1), results[0]
                output = output.shape if output is not None else None
            elif "BackwardInput" in target:
                output, kernel = self.operand(instruction, 0), self.operand(instruction, 1)
                output = output.shape if output is not None else None
            else:
                output, kernel = results[0], self.operand(instruction, 1)
            return self._convolution(instruction, output, kernel)
        if GEMM_TARGET.search(target) and "triangular" not in target.lower():
            lhs = self.operand(instruction, 0)
            if lhs is None:
                return math.nan, "", "matrix"
            contracting = _gemm_contracting(instruction.backend_config)
            if contracting is None:
                contracting = [len(lhs.shape.dimensions) - 1]
            flops, dtype, kind = self._dot(instruction, contracting, lhs)
            return flops, dtype, kind
        return math.nan, "", ""


def _gemm_contracting(config: bytes) -> list[int] | None:
    """The lhs contracting dimensions a GEMM custom-call's backend config states (None: it does not)."""
    try:
        parsed = json.loads(config or b"{}")
        numbers = parsed["gemm_backend_config"]["dot_dimension_numbers"]
        return [int(d) for d in numbers["lhs_contracting_dimensions"]]
    except (ValueError, KeyError, TypeError):
        return None


def _is_scratch(leaf) -> bool:
    return len(leaf.dimensions) == 1 and _type_info(leaf.element_type)[0] in ("int8", "uint8")


def _kernel_level(module: _Module) -> list:
    """Instructions that launch kernels: those of the entry computation and of the computations it
    runs through control flow or async wrappers, in program order."""
    entry = module.module.entry_computation_id
    if entry not in module.computations:
        named = [c for c in module.module.computations if c.name == module.module.entry_computation_name]
        if not named:
            return []
        entry = named[0].id
    found, seen, pending = [], {entry}, [entry]
    while pending:
        for instruction in module.computations[pending.pop(0)].instructions:
            if instruction.opcode in KERNEL_LEVEL_CALLERS:
                for key in instruction.called_computation_ids:
                    if key in module.computations and key not in seen:
                        seen.add(key)
                        pending.append(key)
            if instruction.opcode not in NO_KERNEL:
                found.append(instruction)
    return found


def _row(module: _Module, instruction, program_id: float) -> dict:
    flops, dtype, kind = module.flops(instruction)
    outputs = _leaves(instruction.shape)
    if instruction.opcode == "custom-call" and kind == "matrix" and len(outputs) > 1 and _is_scratch(outputs[-1]):
        outputs = outputs[:-1]
    inputs = module.operand_shapes(instruction)
    if math.isnan(flops):
        source = ""
    else:
        source = "hlo" if flops else "none"
    return {
        "function": module.module.name,
        "op": instruction.name,
        "type": instruction.opcode,
        "dtype": dtype or _dtype(instruction.shape),
        "kind": kind,
        "input_shapes": _shape_text(inputs),
        "output_shapes": _shape_text(outputs),
        "flops": flops,
        "bytes": _bytes(inputs) + _bytes(outputs),
        "flops_source": source,
        "chain_flops": math.nan,
        "chain_bytes": math.nan,
        "program_id": program_id,
    }


def module_costs(hlo_proto, named=(), program_id: float = math.nan) -> list[dict]:
    """Cost rows of one parsed HloProto: its kernel-level instructions, and the instructions
    `named` (by name: the ones the trace's kernels name) that are not among them."""
    module = _Module(hlo_proto.hlo_module)
    chosen = _kernel_level(module)
    have = {instruction.name for instruction in chosen}
    by_name = {instruction.name: instruction for instruction in module.instructions.values()}
    chosen += [by_name[name] for name in sorted(set(named) - have) if name in by_name]
    return [_row(module, instruction, program_id) for instruction in chosen]


def _empty(note: str = "") -> pd.DataFrame:
    table = pd.DataFrame(
        {
            column: pd.Series(
                dtype=float if column in ("flops", "bytes", "chain_flops", "chain_bytes", "program_id") else object
            )
            for column in COLUMNS
        }
    )
    table.attrs["note"] = note
    return table


def _named_ops(trace) -> dict[float, set[str]]:
    """Per program id (NaN: unknown), the instruction names the trace's kernels carry in `hlo_op`."""
    events = getattr(trace, "events", None)
    if events is None or "hlo_op" not in events:
        return {}
    has_op = events["hlo_op"].notna().to_numpy(dtype=bool)
    if not has_op.any():
        return {}
    ops = events["hlo_op"].to_numpy(dtype=object)[has_op]
    programs = (
        events["program_id"].to_numpy(dtype=np.float64, na_value=np.nan)[has_op]
        if "program_id" in events
        else np.full(ops.size, np.nan)
    )
    named: dict[float, set[str]] = {}
    for program, op in set(zip(programs.tolist(), ops.tolist())):
        named.setdefault(-1.0 if math.isnan(program) else program, set()).add(str(op))
    return named


def hlo_costs(source) -> pd.DataFrame:
    """The cost table (`COLUMNS`) of the XLA programs a trace stores, one row per kernel-level
    instruction of each program.

    `source`: the `Trace` the read stage made (its file's metadata is read again, a scan that
    skips every event; the instructions its kernels name in `hlo_op` get rows too), or a trace
    file's path, XSpace bytes or message. A trace without HLO gives no rows. Where the rows are
    not all there, `table.attrs["note"]` says why in one line ("" otherwise): the HloProto classes
    not loadable (no protobuf runtime they accept: no rows at all), programs whose `Hlo Proto` could not be parsed (also one
    warning).
    """
    planes = trace_reader.plane_metadata(source, lambda name: name == METADATA_PLANE, (HLO_PROTO_STAT,))
    programs = [
        (key, name, stats[HLO_PROTO_STAT])
        for plane in planes
        for key, (name, stats) in sorted(plane.event_stats.items())
        if isinstance(stats.get(HLO_PROTO_STAT), bytes)
    ]
    if not programs:
        return _empty()
    try:
        message = hlo_proto_class()
    except _Unavailable as exc:
        return _empty(f"FLOPs and bytes of XLA programs unknown: {exc}")
    named = _named_ops(source) if isinstance(source, trace_reader.Trace) else {}
    rows, broken = [], []
    for key, name, data in programs:
        try:
            proto = message.FromString(data)
            if not proto.hlo_module.computations:
                raise ValueError("no computations")
        except Exception:  # protobuf's DecodeError, or a message with no program in it
            broken.append(name or str(key))
            continue
        program = float(proto.hlo_module.id or key)
        wanted = named.get(program, set()) | named.get(-1.0, set())
        rows += module_costs(proto, wanted, program)
    note = ""
    if broken:
        shown = ", ".join(repr(n) for n in broken[:3]) + (", ..." if len(broken) > 3 else "")
        note = (
            f"{len(broken)} of {len(programs)} XLA programs' Hlo Proto could not be parsed ({shown}): "
            "their ops' FLOPs and bytes are unknown"
        )
        warn(f"{getattr(source, 'source', source)}: {note}")
    table = pd.DataFrame(rows, columns=list(COLUMNS)) if rows else _empty()
    for column in ("flops", "bytes", "chain_flops", "chain_bytes", "program_id"):
        table[column] = table[column].astype(float)
    table.attrs["note"] = note
    return table
