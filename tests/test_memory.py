"""Where the memory goes: the allocators' events read once, each allocator's peak and what held it,
per step, the batch headroom, the memory findings and their outputs. Synthetic traces with numbers
worked out by hand (tests/memory_fixtures.py); XProf's Memory Profile tool is the oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest
from memory_fixtures import GPU, PINNED, MiB, write_memory_trace

from analysis.read.trace import read_trace
from analysis.read.view import TraceView


@pytest.fixture(scope="module")
def memory_trace(tmp_path_factory):
    return write_memory_trace(tmp_path_factory.mktemp("memory") / "plugins" / "profile" / "s" / "memory-host.xplane.pb")


def test_the_allocator_events_are_read_once_into_one_table(memory_trace):
    view = TraceView(read_trace(memory_trace.path))
    memory = view.memory
    gpu = memory[memory["allocator"] == GPU]
    # 3 steps x (conv, temp, matmul, grad: 4 allocations and 4 frees) + the extra Fill and its free
    assert len(gpu) == 26 and len(memory[memory["allocator"] == PINNED]) == 6
    assert (np.diff(memory["start_ns"].to_numpy()) >= 0).all()
    first = gpu.iloc[0]
    assert first["allocation"] and first["op"] == "model/conv/Conv2D" and first["shape"] == "[8,64,32,32]"
    assert first["dtype"] == "float" and first["region"] == "output" and first["group_id"] == 0
    assert first["bytes_in_use"] == 4 * MiB + 2 * MiB and first["allocation_bytes"] == 2 * MiB
    assert first["bytes_available"] == memory_trace.capacity_bytes - 6 * MiB
    temp = gpu[gpu["shape"] == "[1048576]"].iloc[0]
    assert temp["dtype"] == "uint8" and temp["region"] == "temp"
    freed = gpu[~gpu["allocation"]].iloc[0]
    # a deallocation names no op, type or shape: empty, not made up
    assert freed["op"] == "" and freed["dtype"] == "" and freed["shape"] == "" and freed["address"] == 2000
    assert gpu["bytes_in_use"].max() == memory_trace.peak_bytes
    # the lifetime peak is the allocator's own stat, above the window's
    assert gpu["peak_bytes_in_use"].max() == 13 * MiB


def test_a_trace_without_allocator_events_has_an_empty_memory_table(tmp_path):
    from trace_fixtures import write_grouped_host_trace

    view = TraceView(read_trace(write_grouped_host_trace(tmp_path / "t.xplane.pb")))
    assert view.memory.empty and "bytes_in_use" in view.memory


def test_an_event_that_does_not_state_its_bytes_has_none_not_zero(tmp_path):
    from trace_fixtures import _Plane, _write_space, _xspace_class

    space = _xspace_class()()
    host = _Plane(space, 0, "/host:CPU")
    line = host.line(1, "tf_Compute/1", 10**9)
    host.event(line, "MemoryAllocation", 10**9 + 1, 10**9 + 1, allocator_name="mklcpu", requested_bytes=4,
               allocation_bytes=256, tf_op="Cast")
    host.event(line, "MemoryAllocation", 10**9 + 5, 10**9 + 5, allocator_name="mklcpu", bytes_allocated=512,
               bytes_reserved=0, allocation_bytes=256)
    host.event(line, "ExecutorState::Process", 10**9, 10**9 + 9)
    host.finish()
    memory = TraceView(read_trace(_write_space(space, tmp_path / "t.xplane.pb"))).memory
    assert len(memory) == 2 and math.isnan(memory["bytes_in_use"].iat[0]) and math.isnan(memory["fragmentation"].iat[0])
    assert memory["bytes_in_use"].iat[1] == 512 and memory["op"].iat[0] == "Cast"
