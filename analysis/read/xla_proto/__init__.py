"""devprof's own classes of the part of XLA's HLO schema it reads (`HloProto` down to shapes,
metadata and backend configs), so XLA programs are read without TensorFlow.

`hlo.proto` and `xla_data.proto` are wire-compatible trims of XLA's own files at a pinned commit
(their headers say which); `hlo_pb2.py` and `xla_data_pb2.py` are generated from them by
`python -m analysis.read.xla_proto.regenerate` (see its docstring), never edited by hand.
"""
