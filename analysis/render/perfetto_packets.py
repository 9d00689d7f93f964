"""Many TrackEvent packets at once: slices, instants and counters encoded with numpy, a chunk at a time.

The `perfetto` package's protobuf classes cost a few microseconds a packet, so a trace of millions of
op events would take many seconds through them; the events here have a handful of scalar fields, so a
chunk of packets is one byte matrix, one row a packet. Every varint of a chunk's column is written at
the column's widest (a smaller value with redundant continuation bytes, which the protobuf wire format
allows), and a slice's end, which has no name, carries its type at the width of the name it lacks (the
fields of a message may come in any order, so the type and the name come first): so every packet of a
chunk has the same length and the chunk is the matrix's bytes. Field numbers and enum
values come from the package's own descriptors; tests/test_perfetto.py parses these bytes with its
`Trace` class and compares them with the packets its builder makes.
"""

from __future__ import annotations

import numpy as np

MAX_VARINT = 10


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _tag(field, wire_type: int) -> bytes:
    return _varint((field.number << 3) | wire_type)


class Fields:
    """Tags and enum values of the messages written here, from the package's descriptors."""

    def __init__(self):
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

        packet = TracePacket.DESCRIPTOR.fields_by_name
        event = TrackEvent.DESCRIPTOR.fields_by_name
        self.trace_packet = _tag(Trace.DESCRIPTOR.fields_by_name["packet"], 2)
        self.timestamp = _tag(packet["timestamp"], 0)
        self.track_event = _tag(packet["track_event"], 2)
        self.sequence_id = _tag(packet["trusted_packet_sequence_id"], 0)
        self.sequence_flags = _tag(packet["sequence_flags"], 0)
        self.type = _tag(event["type"], 0)
        self.track_uuid = _tag(event["track_uuid"], 0)
        self.name_iid = _tag(event["name_iid"], 0)
        self.double_counter_value = _tag(event["double_counter_value"], 1)
        self.SLICE_BEGIN = TrackEvent.Type.Value("TYPE_SLICE_BEGIN")
        self.SLICE_END = TrackEvent.Type.Value("TYPE_SLICE_END")
        self.INSTANT = TrackEvent.Type.Value("TYPE_INSTANT")
        self.COUNTER = TrackEvent.Type.Value("TYPE_COUNTER")
        self.NEEDS_INCREMENTAL_STATE = TracePacket.SequenceFlags.Value("SEQ_NEEDS_INCREMENTAL_STATE")


def width(values: np.ndarray) -> int:
    """Bytes of the widest varint among `values` (1 for none)."""
    if not values.size:
        return 1
    largest = int(np.asarray(values).max())
    return max(1, (largest.bit_length() + 6) // 7)


def varints(values: np.ndarray, size: int) -> np.ndarray:
    """Each value (below 2**64) as a varint of exactly `size` bytes: one row each."""
    values = np.asarray(values).astype(np.uint64, copy=False)
    out = np.empty((values.size, size), dtype=np.uint8)
    for k in range(size):
        out[:, k] = ((values >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
    out[:, : size - 1] |= 0x80
    return out


def _bytes(*parts: bytes) -> np.ndarray:
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


class _Rows:
    """A chunk's matrix filled left to right, a column block at a time."""

    def __init__(self, rows: int, length: int):
        self.data = np.empty((rows, length), dtype=np.uint8)
        self.at = 0

    def put(self, block: np.ndarray) -> None:
        size = block.shape[-1]
        self.data[:, self.at : self.at + size] = block
        self.at += size


def track_events(
    fields: Fields,
    timestamps: np.ndarray,
    types: np.ndarray,
    track_uuids: np.ndarray,
    name_iids: np.ndarray,
    sequence_id: int,
) -> bytes:
    """Slice begins, ends and instants: `types` per row (TrackEvent.Type); `name_iids` 0 leaves the name
    out (a slice's end). The names are interned on the sequence, so every packet needs its state."""
    rows = len(timestamps)
    if not rows:
        return b""
    name_iids = np.asarray(name_iids)
    named = name_iids > 0
    time_size, uuid_size = width(np.asarray(timestamps)), width(np.asarray(track_uuids))
    iid_size = width(name_iids)
    # a named event: type (1 byte), name; an unnamed one: its type as long as both (fields in any order)
    lead_size = 1 + len(fields.name_iid) + iid_size
    if lead_size > MAX_VARINT:
        raise ValueError("name ids too large for one packet width")
    event_length = len(fields.type) + lead_size + len(fields.track_uuid) + uuid_size
    tail = _bytes(
        fields.sequence_id, _varint(sequence_id), fields.sequence_flags, _varint(fields.NEEDS_INCREMENTAL_STATE)
    )
    packet_length = len(fields.timestamp) + time_size + len(fields.track_event) + 1 + event_length + tail.size
    assert event_length < 128 and packet_length < 128  # one-byte lengths
    kinds = np.asarray(types, dtype=np.uint64)
    lead = varints(kinds, lead_size)
    if named.any():
        with_name = np.empty_like(lead)
        with_name[:, 0] = kinds.astype(np.uint8)
        with_name[:, 1 : 1 + len(fields.name_iid)] = _bytes(fields.name_iid)
        with_name[:, 1 + len(fields.name_iid) :] = varints(name_iids, iid_size)
        lead = np.where(named[:, None], with_name, lead)
    out = _Rows(rows, len(fields.trace_packet) + 1 + packet_length)
    out.put(_bytes(fields.trace_packet, _varint(packet_length), fields.timestamp))
    out.put(varints(timestamps, time_size))
    out.put(_bytes(fields.track_event, _varint(event_length), fields.type))
    out.put(lead)
    out.put(_bytes(fields.track_uuid))
    out.put(varints(track_uuids, uuid_size))
    out.put(tail)
    return out.data.tobytes()


def counters(fields: Fields, timestamps: np.ndarray, track_uuid: int, values: np.ndarray, sequence_id: int) -> bytes:
    """One counter track's values at `timestamps`, as doubles."""
    rows = len(timestamps)
    if not rows:
        return b""
    time_size = width(np.asarray(timestamps))
    event = _bytes(
        fields.type, _varint(fields.COUNTER), fields.track_uuid, _varint(int(track_uuid)), fields.double_counter_value
    )
    event_length = event.size + 8
    tail = _bytes(fields.sequence_id, _varint(sequence_id))
    packet_length = len(fields.timestamp) + time_size + len(fields.track_event) + 1 + event_length + tail.size
    assert event_length < 128 and packet_length < 128
    out = _Rows(rows, len(fields.trace_packet) + 1 + packet_length)
    out.put(_bytes(fields.trace_packet, _varint(packet_length), fields.timestamp))
    out.put(varints(timestamps, time_size))
    out.put(_bytes(fields.track_event, _varint(event_length)))
    out.put(event)
    out.put(np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(-1, 8))
    out.put(tail)
    return out.data.tobytes()
