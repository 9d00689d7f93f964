"""Round four of hostile inputs: files that are not traces, whatever their size."""

from __future__ import annotations

import os

import pytest

import analysis
from analysis.read.trace import TraceError


def _sparse(path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)  # no data written: a file of zeros that takes no disk


@pytest.mark.parametrize("size", [4096, 3 * 2**30])
def test_a_file_of_zeros_of_any_size_is_refused_at_its_first_byte(tmp_path, size):
    trace = tmp_path / "z.xplane.pb"
    _sparse(trace, size)
    with pytest.raises(TraceError, match=r"field number 0 at byte 0: not a protobuf message"):
        analysis.analyze(trace)


def test_a_file_whose_top_level_is_no_xspace_is_refused_before_it_is_decoded(tmp_path):
    trace = tmp_path / "t.xplane.pb"
    # A well-formed first field (planes, empty), then field 9: no XSpace has it. Then 64 MiB of zeros
    # that the decoder would otherwise walk.
    with open(trace, "wb") as handle:
        handle.write(bytes([0x0A, 0x00, (9 << 3) | 2, 0x01, 0x41]))
        handle.truncate(64 * 2**20)
    with pytest.raises(TraceError, match=r"field 9 \(wire type 2\) at the top level: not an XSpace trace"):
        analysis.analyze(trace)
    assert os.path.getsize(trace) == 64 * 2**20
