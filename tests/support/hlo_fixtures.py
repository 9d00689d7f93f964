"""XSpaces whose `/host:metadata` plane holds HloProtos of known shapes, and GPU kernels that name their
instructions."""

from __future__ import annotations

from analysis.read import hlo_costs as hc
from analysis.read.xla_proto import xla_data_pb2
from trace_fixtures import _Plane, _write_space, _xspace_class

BASE_NS = 1_000_000_000


def _type(name: str) -> int:
    return xla_data_pb2.PrimitiveType.Value(name)


class Program:
    """One HloModuleProto built instruction by instruction; ids are unique in the module."""

    def __init__(self, name: str, program_id: int):
        self.proto = hc.hlo_proto_class()()
        self.module = self.proto.hlo_module
        self.module.name, self.module.id = name, program_id
        self._next = 1
        self.entry = None

    def computation(self, name: str, entry: bool = False):
        computation = self.module.computations.add(name=name, id=self._next)
        self._next += 1
        if entry:
            self.module.entry_computation_name, self.module.entry_computation_id = name, computation.id
        return computation

    def add(self, computation, name: str, opcode: str, dtype: str, dims, operands=(), *, tuple_of=None, **fields):
        instruction = computation.instructions.add(name=name, opcode=opcode, id=self._next)
        self._next += 1
        if tuple_of is not None:
            instruction.shape.element_type = _type("TUPLE")
            for leaf_dtype, leaf_dims in tuple_of:
                instruction.shape.tuple_shapes.add(element_type=_type(leaf_dtype), dimensions=list(leaf_dims))
        else:
            instruction.shape.element_type = _type(dtype)
            instruction.shape.dimensions.extend(dims)
        instruction.operand_ids.extend(operand.id for operand in operands)
        for key, value in fields.items():
            setattr(instruction, key, value)
        return instruction

    def bytes(self) -> bytes:
        return self.proto.SerializeToString()


def write_trace(path, programs: dict, kernels=(), device_stats=None):
    """A trace with `programs` ({metadata id: (name, Hlo Proto bytes or None)}) on `/host:metadata`
    and one GPU kernel per (hlo_module, hlo_op, program_id) of `kernels`."""
    space = _xspace_class()()
    metadata = space.planes.add(id=1, name=hc.METADATA_PLANE)
    metadata.stat_metadata[1].id = 1
    metadata.stat_metadata[1].name = hc.HLO_PROTO_STAT
    for key, (name, data) in programs.items():
        entry = metadata.event_metadata[key]
        entry.id, entry.name = key, name
        if data is not None:
            entry.stats.add(metadata_id=1, bytes_value=data)
    gpu = _Plane(space, 2, "/device:GPU:0")
    for number, (stat_name, value) in enumerate((device_stats or {}).items(), start=100):
        gpu.plane.stat_metadata[number].id = number
        gpu.plane.stat_metadata[number].name = stat_name
        stat = gpu.plane.stats.add(metadata_id=number)
        if isinstance(value, str):
            stat.str_value = value
        elif isinstance(value, float):
            stat.double_value = value
        else:
            stat.uint64_value = value
    stream = gpu.line(7, "Stream #7(Kernel)", BASE_NS)
    for index, (module, op, program_id) in enumerate(kernels):
        start = BASE_NS + index * 1_000_000
        gpu.event(
            stream, f"kernel_{index}", start, start + 500_000, hlo_module=module, hlo_op=op, program_id=program_id
        )
    gpu.finish()
    return _write_space(space, path)


def matmul_program(m: int, n: int, k: int, program_id: int = 7, dtype: str = "BF16") -> Program:
    program = Program("jit_matmul", program_id)
    entry = program.computation("main", entry=True)
    lhs = program.add(entry, "a", "parameter", dtype, [m, k])
    rhs = program.add(entry, "b", "parameter", dtype, [k, n])
    dot = program.add(entry, "dot.1", "dot", dtype, [m, n], (lhs, rhs))
    dot.dot_dimension_numbers.lhs_contracting_dimensions.append(1)
    dot.dot_dimension_numbers.rhs_contracting_dimensions.append(0)
    return program
