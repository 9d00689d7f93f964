"""The XSpace protobuf classes (`.xplane.pb`, the profiler's trace format) for the tests and benches
that write or edit traces, without TensorFlow: `from xplane_proto import xplane_pb2`.

`xplane.proto` is TensorFlow's own schema, printed back from the descriptor compiled into an
installed TensorFlow, under TensorFlow's file name and package: the descriptor is TensorFlow's byte
for byte, so the messages are the same on the wire and this module and TensorFlow's load in one
process. `xplane_pb2.py` is generated from it by `python tests/support/xplane_proto/regenerate.py` (see its
docstring), never edited by hand. devprof itself does not use it: `analysis.read.xplane_wire`
decodes traces from the wire format.
"""
