"""The tests' XSpace classes (tests/support/xplane_proto, vendored so the fast tier needs no TensorFlow)
are TensorFlow's own: the same descriptor byte for byte, and both load in one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from xplane_proto import xplane_pb2
from xplane_proto.regenerate import UPSTREAM_NAME, serialized_descriptor


def test_the_vendored_schema_keeps_tensorflows_file_name_and_package():
    assert xplane_pb2.DESCRIPTOR.name == UPSTREAM_NAME
    assert xplane_pb2.DESCRIPTOR.package == "tensorflow.profiler"
    assert xplane_pb2.XSpace.DESCRIPTOR.full_name == "tensorflow.profiler.XSpace"


@pytest.mark.slow
def test_the_vendored_descriptor_is_tensorflows_byte_for_byte():
    pytest.importorskip("tensorflow")
    from tensorflow.tsl.profiler.protobuf import xplane_pb2 as theirs  # imports TensorFlow

    assert serialized_descriptor(Path(xplane_pb2.__file__).read_text(encoding="utf-8")) == serialized_descriptor(
        Path(theirs.__file__).read_text(encoding="utf-8")
    )
    space = theirs.XSpace(hostnames=["host"])
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.event_metadata[7].name = "train"
    plane.stat_metadata[3].name = "step_num"
    event = plane.lines.add(id=2, timestamp_ns=5).events.add(metadata_id=7, offset_ps=9, duration_ps=11)
    event.stats.add(metadata_id=3, int64_value=4)
    data = space.SerializeToString()
    assert xplane_pb2.XSpace.FromString(data).SerializeToString() == data
