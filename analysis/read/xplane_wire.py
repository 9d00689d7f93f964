"""Decode an XSpace (`*.xplane.pb`) straight from the protobuf wire format into columns.

Only the fields the analysis reads are decoded; everything else is skipped by its wire type.
Field numbers, from the profiler's `xplane.proto` (package `tensorflow.profiler`):

    XSpace         planes=1 hostnames=4                     (errors=2, warnings=3 skipped)
    XPlane         id=1 name=2 lines=3 event_metadata=4 stat_metadata=5   (stats=6 skipped)
    XLine          id=1 name=2 timestamp_ns=3 events=4 display_name=11
    XEvent         metadata_id=1 offset_ps=2 | num_occurrences=5 (oneof) duration_ps=3 stats=4
    XStat          metadata_id=1, oneof value: double=2 uint64=3 int64=4 str=5 bytes=6 ref=7
    XEventMetadata id=1 name=2       XStatMetadata id=1 name=2
    map<int64, M>  entries of key=1 value=2

Planes, lines and metadata are few and are read by a small Python scanner. Events and
their stats are many: a line's events are located by one tight loop over their length
prefixes, then all events of a batch of lines are decoded together, one field position at
a time, with numpy (every event's first field, then every event's second field, ...), so
no Python object is made per event field.
"""

from __future__ import annotations

import gc
import itertools
import mmap
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WIRE_VARINT, WIRE_FIXED64, WIRE_LEN, WIRE_FIXED32 = 0, 1, 2, 5

# XStat value kinds (their field numbers); 0: no value.
STAT_DOUBLE, STAT_UINT64, STAT_INT64, STAT_STR, STAT_BYTES, STAT_REF = 2, 3, 4, 5, 6, 7

# The largest trace devprof reads (docs/run-directory.md): reading takes about 8 bytes of memory per
# byte of trace, so a bigger one would not fit in a large machine's memory anyway.
TRACE_MAX_BYTES = 16 * 2**30
# Events decoded in one go inside a batch: small enough that numpy's temporaries stay in the
# CPU's cache (the decoder is bound by memory traffic, not by arithmetic).
CHUNK_EVENTS = 1 << 15


class WireError(ValueError):
    """The bytes are not a well-formed XSpace message (truncated or another format)."""


@dataclass
class PlaneInfo:
    plane_id: int
    name: str
    event_names: dict[int, str]  # XEventMetadata id -> name
    stat_names: dict[int, str]  # XStatMetadata id -> name


@dataclass
class LineInfo:
    plane: int
    line: int
    line_id: int
    name: str
    display_name: str
    timestamp_ns: int
    events: int


@dataclass
class EventColumns:
    """Events in file order (plane, line, event), and the wanted stats of those events."""

    line_row: np.ndarray  # int64: row of the event's line in `lines`
    metadata_id: np.ndarray  # int64
    offset_ps: np.ndarray  # int64 (0 where the event has num_occurrences instead)
    duration_ps: np.ndarray  # int64
    stat_event: np.ndarray  # int64: event row of each kept stat, in file order
    stat_metadata_id: np.ndarray  # int64
    stat_kind: np.ndarray  # int8: STAT_* of the value, 0 for none
    stat_number: np.ndarray  # uint64: varint value, or a double's 8 bytes
    stat_start: np.ndarray  # int64: str/bytes value start in the file
    stat_stop: np.ndarray  # int64

    def release(self, *names: str) -> None:
        """Let go of columns the events table has taken, so both are not held whole."""
        for name in names:
            setattr(self, name, None)


@dataclass
class DecodedSpace:
    planes: list[PlaneInfo]
    lines: list[LineInfo]
    hostnames: list[str]
    events: EventColumns
    stat_values: np.ndarray  # object: each kept stat's value as protobuf gives it (bytes as hex, a ref as its name)
    stat_name_code: np.ndarray  # int64 code of each kept stat's name in `stat_names`
    stat_names: list[str]  # sorted; an id without metadata is named by its number


# ---------------------------------------------------------------- scalar scanner (small messages)


def _varint(buf, pos: int) -> tuple[int, int]:
    """One varint at `pos` (a Python int, unsigned), and the position after it."""
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(buf, pos: int, end: int):
    """(field number, wire type, value or start, end) of each field of one message, in order.

    For LEN fields the value is the payload's start and `end` its end; for others `end` is
    the position after the field.
    """
    try:
        while pos < end:
            tag, pos = _varint(buf, pos)
            number, wire = tag >> 3, tag & 7
            if number == 0:  # no protobuf field is numbered 0: zeros, or not a message at all
                raise WireError(f"field number 0 at byte {pos - 1}: not a protobuf message (zeros?)")
            if wire == WIRE_VARINT:
                value, pos = _varint(buf, pos)
                yield number, wire, value, pos
            elif wire == WIRE_LEN:
                size, pos = _varint(buf, pos)
                start, pos = pos, pos + size
                if pos > end:
                    raise WireError("field runs past the end of its message")
                yield number, wire, start, pos
            elif wire == WIRE_FIXED64:
                pos += 8
                yield number, wire, pos - 8, pos
            elif wire == WIRE_FIXED32:
                pos += 4
                yield number, wire, pos - 4, pos
            else:
                raise WireError(f"wire type {wire} (field {number}) is not used by XSpace")
    except IndexError:
        raise WireError("message cut short") from None
    if pos != end:
        raise WireError("field runs past the end of its message")


# Characters a terminal, a CSV reader or a browser acts on rather than shows: C0 and C1 controls, DEL,
# line and paragraph separators, the bidirectional overrides and isolates. A trace from anyone may hold
# them in its names (an ESC sequence retitles a terminal or writes its clipboard): each is kept, as a
# visible escape, so every output shows what the trace says and none of them acts.
_INVISIBLE = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_VISIBLE = {code: (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}") for code in _INVISIBLE}


def visible(text: str) -> str:
    """`text` with the characters that act instead of showing (`_INVISIBLE`) as visible escapes."""
    return text.translate(_VISIBLE) if not text.isprintable() else text


def _text(buf, start: int, stop: int) -> str:
    # a name that is not UTF-8 keeps its odd bytes as `\xNN`: shown, not a reason to refuse the trace
    return visible(bytes(buf[start:stop]).decode("utf-8", errors="backslashreplace"))


def _name_of(buf, start: int, stop: int) -> tuple[int, str]:
    """id (field 1) and name (field 2) of an XEventMetadata or XStatMetadata."""
    key, name = 0, ""
    for number, wire, value, end in _fields(buf, start, stop):
        if number == 1 and wire == WIRE_VARINT:
            key = _signed(value)
        elif number == 2 and wire == WIRE_LEN:
            name = _text(buf, value, end)
    return key, name


def _map_entry_names(buf, start: int, stop: int) -> tuple[int, str]:
    """A map<int64, XEventMetadata|XStatMetadata> entry: its key and its value's name."""
    key, name = 0, ""
    for number, wire, value, end in _fields(buf, start, stop):
        if number == 1 and wire == WIRE_VARINT:
            key = _signed(value)
        elif number == 2 and wire == WIRE_LEN:
            name = _name_of(buf, value, end)[1]
    return key, name


# ---------------------------------------------------------------- events


def _event_tags_serial(buf, pos: int, end: int, limit: int | None = None) -> tuple[list[int], int]:
    """Tag positions of consecutive events (field 4) from `pos`, one Python step each, and where they stop.

    Stops at another field, at `end`, or (with `limit`) at the first event at or past `limit`.
    """
    tags: list[int] = []
    append = tags.append
    limit = end if limit is None else limit
    try:
        while pos < limit and buf[pos] == 0x22:
            append(pos)
            size = buf[pos + 1]
            if size < 0x80:
                pos += 2 + size
            else:
                size, pos = _varint(buf, pos + 1)
                pos += size
    except IndexError:
        raise WireError("message cut short") from None
    return tags, pos


# Events of a line are located window by window; in a window, one chain of events is followed
# from a guessed start in every block, all chains a step at a time, and then joined.
SERIAL_BYTES = 1 << 13
WINDOW_BYTES = 1 << 23
BLOCK_BYTES = 1 << 12
_LOOKAHEAD = np.arange(64)


def _event_tags(buf, data: np.ndarray, pos: int, end: int) -> tuple[np.ndarray, int]:
    """Tag positions of the events (field 4) that follow one another from `pos`, and where they stop.

    Events are length-prefixed, so where one starts depends on all before it. Instead of one
    Python step per event, each block of a window follows its own chain from a guessed event
    start; a chain that started in the middle of an event (at one of its stats) falls back in
    step at the next event boundary, so every block's chain is checked against where the
    previous block's chain really ended and used from that point on (a block that never falls
    in step is walked again one event at a time).
    """
    if end - pos <= SERIAL_BYTES:
        serial, after = _event_tags_serial(buf, pos, end)
        return np.array(serial, dtype=np.int64), after
    parts = []
    while True:
        window_end = min(pos + WINDOW_BYTES, end)
        tags, after, stopped = _window_tags(buf, data, pos, window_end)
        parts.append(tags)
        pos = after
        if stopped or pos >= end:
            break
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), pos


def _window_tags(buf, data: np.ndarray, start: int, window_end: int) -> tuple[np.ndarray, int, bool]:
    """Events whose tags lie in [start, window_end), `start` being an event's (or the region's end);
    returns their tags, where the chain leaves the window, and whether the events stopped there."""
    last = data.size - 1
    nominal = np.arange(start + BLOCK_BYTES, window_end, BLOCK_BYTES, dtype=np.int64)
    near = nominal[:, None] + _LOOKAHEAD
    bytes_near = data[np.minimum(near, last - 2)]
    after_near = data[np.minimum(near + 2, last)]
    plausible = (
        (bytes_near == 0x22) & (data[np.minimum(near + 1, last)] < 0x80) & (after_near == 0x08) & (near < window_end)
    )
    found = plausible.any(axis=1)
    guesses = near[found, plausible[found].argmax(axis=1)]
    starts = np.unique(np.concatenate(([start], guesses)))
    limits = np.append(starts[1:], window_end)
    blocks = starts.size

    # Every chain a step at a time until it reaches the next block's guess or leaves the events.
    cursor = starts.copy()
    active = np.arange(blocks)
    steps: list[tuple[np.ndarray, np.ndarray]] = []
    while active.size:
        at = cursor[active]
        going = (at < limits[active]) & (data[np.minimum(at, last)] == 0x22)
        active, at = active[going], at[going]
        if not active.size:
            break
        steps.append((active, at))
        size = data[np.minimum(at + 1, last)].astype(np.int64)
        nxt = at + 2 + size
        long_size = np.flatnonzero(size >= 0x80)
        if long_size.size:
            value, after = _varints(data, at[long_size] + 1)
            nxt[long_size] = after + value.astype(np.int64)
        cursor[active] = nxt
    counts = np.zeros(blocks, dtype=np.int64)
    for chains, _ in steps:
        counts[chains] += 1
    first = np.concatenate(([0], np.cumsum(counts)))
    tags = np.empty(first[-1], dtype=np.int64)
    for step, (chains, at) in enumerate(steps):
        tags[first[chains] + step] = at
    del steps

    # Join: block j is used from the point where the previous chain really entered it.
    keep = []
    expected = start
    for block in range(blocks):
        if expected >= limits[block]:
            continue  # one event spans the whole block
        chain = tags[first[block] : first[block + 1]]
        if expected == starts[block]:
            offset = 0
        else:
            offset = int(np.searchsorted(chain, expected))
            if offset >= chain.size or chain[offset] != expected:  # never fell in step: walk it
                walked, expected = _event_tags_serial(buf, expected, int(limits[block]))
                keep.append(np.array(walked, dtype=np.int64))
                if expected < limits[block]:
                    return np.concatenate(keep), expected, True
                continue
        keep.append(chain[offset:])
        expected = int(cursor[block])
        if expected < limits[block]:  # the events stop inside this block
            return np.concatenate(keep), expected, True
    return (np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64)), expected, False


_CONTINUE = np.uint64(0x8080808080808080)
_PAYLOAD = np.uint64(0x7F7F7F7F7F7F7F7F)
_ONE = np.uint64(1)


def _varints(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints at positions `at` of `data`, all at once: values (uint64) and the positions after them.

    One-byte varints (most tags, lengths and ids) are read as bytes; the others as one
    unaligned 8-byte word whose 7-bit groups are packed with shifts and masks, the 9th and
    10th bytes of long varints (negative int64s, 64-bit ids) added after. An overlong
    varint gets a position past any end.
    """
    if not at.size:
        return np.zeros(0, dtype=np.uint64), at.copy()
    byte = data[np.minimum(at, data.size - 1)] if at.max() >= data.size else data[at]
    longer = np.flatnonzero(byte >= 0x80)
    if longer.size * 2 > at.size:
        return _word_varints(data, at)
    value, after = byte.astype(np.uint64), at + 1
    if longer.size:
        value[longer], after[longer] = _word_varints(data, at[longer])
    return value, after


def _word_varints(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    word_count = data.size - 9
    if word_count <= 0:
        return _varints_bytewise(data, at)
    words = np.ndarray((word_count,), dtype="<u8", buffer=data, strides=(1,))
    word = words[np.minimum(at, word_count - 1)]
    ends = ~word & _CONTINUE
    first_end = ends & (~ends + _ONE)  # the lowest terminator byte's high bit (0 if none)
    used = (first_end << _ONE) - _ONE  # wraps to all bytes for 8 bytes or more
    value = word & used & _PAYLOAD
    value = (value & np.uint64(0x007F007F007F007F)) | ((value & np.uint64(0x7F007F007F007F00)) >> np.uint64(1))
    value = (value & np.uint64(0x00003FFF00003FFF)) | ((value & np.uint64(0x3FFF00003FFF0000)) >> np.uint64(2))
    value = (value & np.uint64(0x000000000FFFFFFF)) | ((value & np.uint64(0x0FFFFFFF00000000)) >> np.uint64(4))
    after = at + _byte_count(first_end, used)
    longer = np.flatnonzero(first_end == 0)
    if longer.size:  # 9 or 10 bytes
        ninth = data[np.minimum(at[longer] + 8, data.size - 1)]
        tenth = data[np.minimum(at[longer] + 9, data.size - 1)]
        value[longer] |= (ninth & 0x7F).astype(np.uint64) << np.uint64(56)
        tenth_used = ninth >= 0x80
        value[longer[tenth_used]] |= (tenth[tenth_used] & 0x01).astype(np.uint64) << np.uint64(63)
        after[longer] += 1 + tenth_used
        after[longer[tenth_used & (tenth >= 0x80)]] = _PAST_END
    tail = np.flatnonzero(at >= word_count)
    if tail.size:
        value[tail], after[tail] = _varints_bytewise(data, at[tail])
    return value, after


_PAST_END = np.iinfo(np.int64).max // 2


def _byte_count(first_end: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Bytes of each varint in its word (8 where it goes on)."""
    if hasattr(np, "bitwise_count"):  # numpy 2
        return (np.bitwise_count(used) >> 3).astype(np.int64)
    exponent = np.frexp(first_end.astype(np.float64))[1].astype(np.int64)  # 2**(8k+7) -> 8k+8
    return np.where(first_end == 0, 8, exponent >> 3)


def _varints_bytewise(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    last = data.size - 1
    byte = data[np.minimum(at, last)]
    values = (byte & 0x7F).astype(np.uint64)
    after = at + 1
    going = np.flatnonzero(byte >= 0x80)
    shift = 7
    while going.size:
        if shift >= 70:
            after[going] = _PAST_END  # the caller reports it
            break
        byte = data[np.minimum(after[going], last)]
        values[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[going] += 1
        going = going[byte >= 0x80]
        shift += 7
    return values, after


def _next_fields(data: np.ndarray, at: np.ndarray, stops: np.ndarray):
    """Read one field at each position: field number, wire type, varint (a value or a length),
    where its payload starts and where the next field starts."""
    tag = data[at]
    if (tag >= 0x80).any():  # a field number above 15: not in XSpace's messages, but legal
        tag, payload = _varints(data, at)
    else:
        payload = at + 1
    number, wire = tag >> 3, tag & 7
    value = np.zeros(at.size, dtype=np.uint64)
    has_varint = (wire == WIRE_VARINT) | (wire == WIRE_LEN)
    if has_varint.all():
        value, after = _varints(data, payload)
    else:
        after = payload.copy()
        rows = np.flatnonzero(has_varint)
        value[rows], after[rows] = _varints(data, payload[rows])
        after[wire == WIRE_FIXED64] += 8
        after[wire == WIRE_FIXED32] += 4
        if (~has_varint & (wire != WIRE_FIXED64) & (wire != WIRE_FIXED32)).any():
            raise WireError("a wire type XSpace does not use")
    nxt = after
    is_len = wire == WIRE_LEN
    if is_len.any():
        if (value[is_len] > np.uint64(1 << 62)).any():
            raise WireError("field runs past the end of its message")
        nxt = np.where(is_len, after + value.astype(np.int64), after)
    if (nxt > stops).any():
        raise WireError("field runs past the end of its message")
    return number, wire, value, after, nxt


def _decode_events(data: np.ndarray, starts: np.ndarray, stops: np.ndarray):
    """metadata_id, offset_ps, duration_ps of each event, and its stats' (event, start, stop) in file order.

    Field by field for all events at once: each round reads the next field of every event
    that has one left.
    """
    count = starts.size
    columns = {
        1: np.zeros(count, dtype=np.uint64),
        2: np.zeros(count, dtype=np.uint64),
        3: np.zeros(count, dtype=np.uint64),
    }  # metadata_id, offset_ps, duration_ps
    stat_rounds: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    position = starts.copy()
    active = np.flatnonzero(position < stops)
    while active.size:
        number, wire, value, after, nxt = _next_fields(data, position[active], stops[active])
        is_varint = wire == WIRE_VARINT
        for field_number, column in columns.items():
            chosen = is_varint & (number == field_number)
            if chosen.all():
                column[active] = value
            elif chosen.any():
                column[active[chosen]] = value[chosen]
        occurrences = is_varint & (number == 5)  # the oneof's other member: no offset
        if occurrences.any():
            columns[2][active[occurrences]] = 0
        stat = (wire == WIRE_LEN) & (number == 4)
        if stat.any():
            stat_rounds.append((active[stat], after[stat], nxt[stat]))
        position[active] = nxt
        active = active[nxt < stops[active]]
    return columns[1].view(np.int64), columns[2].view(np.int64), columns[3].view(np.int64), stat_rounds


def _file_order(rounds: list[np.ndarray], count: int) -> np.ndarray:
    """Rows of the concatenated `rounds` (each the events that had a stat in that round) in
    (event, round) order, which is file order.

    Each round holds an event at most once, so a counter per event ranks its rows: no sort.
    """
    per_event = np.zeros(count, dtype=np.int64)
    for events in rounds:
        per_event[events] += 1
    slot = np.cumsum(per_event) - per_event  # each event's first row
    order = np.empty(int(per_event.sum()), dtype=np.int64)
    first = 0
    for events in rounds:
        order[slot[events]] = np.arange(first, first + events.size)
        slot[events] += 1
        first += events.size
    return order


def _decode_stats(data: np.ndarray, starts: np.ndarray, stops: np.ndarray, wanted=None):
    """metadata_id, value kind, numeric value (or a double's bits) and str/bytes span of each XStat.

    `wanted(ids, rows) -> bool mask`: after the first field, a stat that began with its metadata id
    (as every profiler writes them) and is not wanted has the rest of its fields skipped; only its
    id is decoded."""
    count = starts.size
    metadata_id = np.zeros(count, dtype=np.uint64)
    kind = np.zeros(count, dtype=np.int8)
    number_value = np.zeros(count, dtype=np.uint64)
    text_start = np.zeros(count, dtype=np.int64)
    text_stop = np.zeros(count, dtype=np.int64)
    position = starts.copy()
    active = np.flatnonzero(position < stops)
    while active.size:
        at = position[active]
        number, wire, value, after, nxt = _next_fields(data, at, stops[active])
        is_varint = wire == WIRE_VARINT
        chosen = is_varint & (number == 1)
        metadata_id[active[chosen]] = value[chosen]
        numeric = is_varint & ((number == STAT_UINT64) | (number == STAT_INT64) | (number == STAT_REF))
        if numeric.any():
            number_value[active[numeric]] = value[numeric]
            kind[active[numeric]] = number[numeric]
        double = (wire == WIRE_FIXED64) & (number == STAT_DOUBLE)
        if double.any():
            bits = data[after[double][:, None] - 8 + np.arange(8)].copy().view("<u8")[:, 0]
            number_value[active[double]] = bits
            kind[active[double]] = STAT_DOUBLE
        text = (wire == WIRE_LEN) & ((number == STAT_STR) | (number == STAT_BYTES))
        if text.any():
            rows = active[text]
            kind[rows] = number[text]
            text_start[rows] = after[text]
            text_stop[rows] = nxt[text]
        position[active] = nxt
        going = nxt < stops[active]
        if wanted is not None:
            named = np.flatnonzero(chosen & going)
            going[named] = wanted(value[named].view(np.int64), active[named])
            wanted = None
        active = active[going]
    return metadata_id.view(np.int64), kind, number_value, text_start, text_stop


# Events from which the last part is decoded by a forked child where one is lent (`decode_xspace`'s
# `child`): below this, the fork and the pipe cost more than the part saves.
HALVES_MIN_EVENTS = 1 << 17
# The child's share of the bytes where both start together: less than half, as its answer still has to
# come back through the pipe.
CHILD_SHARE = 0.4


# A decoded chunk's columns, in the order `_decode_chunk` makes them.
PART_COLUMNS = {
    "line_row": np.int64,
    "metadata_id": np.int64,
    "offset_ps": np.int64,
    "duration_ps": np.int64,
    "stat_event": np.int64,
    "stat_metadata_id": np.int64,
    "stat_kind": np.int8,
    "stat_number": np.uint64,
    "stat_start": np.int64,
    "stat_stop": np.int64,
}
Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]  # an event chunk's tag positions, line rows and planes
ForkChild = Callable[[Callable[[Callable[[], object]], object]], "object | None"]  # `analysis.parallel.Helpers.child`


class _EventBatches:
    """Collects the events' places line by line and decodes them once all are located, a chunk at a time:
    the last part of their bytes by a forked child (`start`) while this process decodes the first."""

    def __init__(self, buf, data: np.ndarray, wanted_stat_names):
        self.buf, self.data, self.wanted_stat_names = buf, data, wanted_stat_names
        self.wanted_ids: list[np.ndarray] = []  # per plane: the stat metadata ids to keep
        self.tags: list[np.ndarray] = []  # event tag positions of the lines located
        self.pending: list[tuple[int, int, int]] = []  # (line row, plane, events) of the lines located
        self.pending_events = 0
        self.mine: list[Chunk] | None = None  # the chunks decoded here (all, where no child shares them)
        self.theirs: list[Chunk] = []  # the child's chunks, decoded here too where it gives no answer
        self.child: Any = None  # an `analysis.parallel.child.Child`

    def add_plane(self, stat_names: dict[int, str]) -> None:
        if self.wanted_stat_names is not None:
            self.wanted_ids.append(
                np.array([key for key, name in stat_names.items() if name in self.wanted_stat_names], dtype=np.int64)
            )

    def add_events(self, line_row: int, plane: int, pos: int, end: int) -> tuple[int, int]:
        """A line's events from `pos` up to its next other field: where that is, and how many."""
        tags, pos = _event_tags(self.buf, self.data, pos, end)
        if tags.size:
            self.tags.append(tags)
            self.pending.append((line_row, plane, tags.size))
            self.pending_events += tags.size
        return pos, tags.size

    def _keep(self, event_plane: np.ndarray, stat_id: np.ndarray) -> np.ndarray:
        if self.wanted_stat_names is None:
            return np.ones(stat_id.size, dtype=bool)
        keep = np.zeros(stat_id.size, dtype=bool)
        for plane, rows in _by_plane(event_plane, None):
            keep[rows] = np.isin(stat_id[rows], self.wanted_ids[plane])
        return keep

    def _chunks(self) -> list[Chunk]:
        """The located events as (tags, line rows, planes) of CHUNK_EVENTS each."""
        if not self.tags:
            return []
        tags = np.concatenate(self.tags)
        rows, planes, counts = (np.array(column, dtype=np.int64) for column in zip(*self.pending))
        self.tags, self.pending = [], []
        line_row, event_plane = np.repeat(rows, counts), np.repeat(planes, counts)
        return [
            (
                tags[first : first + CHUNK_EVENTS],
                line_row[first : first + CHUNK_EVENTS],
                event_plane[first : first + CHUNK_EVENTS],
            )
            for first in range(0, tags.size, CHUNK_EVENTS)
        ]

    def start(self, fork: ForkChild, child_share: float = CHILD_SHARE) -> None:
        """Fork the child that decodes the last `child_share` of the events' bytes (`fork(work)`: a started
        child, or None); `columns()` decodes the rest here."""
        chunks = self._chunks()
        # Split by bytes, not events: the work follows the bytes (events with more stats cost more).
        ends = np.cumsum([int(tags[-1]) - int(tags[0]) + 1 for tags, _, _ in chunks])
        half = int(np.searchsorted(ends, ends[-1] * (1 - child_share))) if chunks else 0
        self.mine, self.theirs = chunks[:half], chunks[half:]
        first = sum(tags.size for tags, _, _ in self.mine)
        self.child = fork(lambda _receive: self._decode_chunks(self.theirs, first))

    def _decode_chunks(self, chunks: list[Chunk], first_event: int) -> list[dict]:
        parts = []
        for chunk in chunks:
            parts.append(self._decode_chunk(*chunk, first_event))
            first_event += chunk[0].size
        return parts

    def columns(self) -> EventColumns:
        """Every located event decoded: this process's chunks, then the child's answer (or its chunks here)."""
        if self.mine is None:
            self.mine = self._chunks()
        try:
            parts = self._decode_chunks(self.mine, 0)
            answer = self.child.result() if self.child is not None else None
        finally:
            self.close()
        theirs = answer[0] if answer is not None else None
        if not (
            isinstance(theirs, list)
            and all(isinstance(part, dict) and list(part) == list(PART_COLUMNS) for part in theirs)
        ):
            theirs = self._decode_chunks(self.theirs, sum(tags.size for tags, _, _ in self.mine))
        self.mine, self.theirs = [], []
        return EventColumns(**_joined(parts + theirs))

    def close(self) -> None:
        """End the child, if one was forked (its answer is lost)."""
        if self.child is not None:
            self.child.close()
            self.child = None

    def _decode_chunk(self, tags: np.ndarray, line_row: np.ndarray, event_plane: np.ndarray, first_event: int) -> dict:
        size, starts = _varints(self.data, tags + 1)
        stops = starts + size.astype(np.int64)
        metadata_id, offset_ps, duration_ps, stat_rounds = _decode_events(self.data, starts, stops)
        if stat_rounds:
            stat_event, stat_start, stat_stop = (np.concatenate(column) for column in zip(*stat_rounds))
        else:
            stat_event = stat_start = stat_stop = np.zeros(0, dtype=np.int64)
        stat_plane = event_plane[stat_event]
        wanted = None if self.wanted_stat_names is None else (lambda ids, rows: self._keep(stat_plane[rows], ids))
        stat_id, kind, number, text_start, text_stop = _decode_stats(self.data, stat_start, stat_stop, wanted)
        keep = self._keep(stat_plane, stat_id)
        # Stats were found round by round; the kept ones go back in file order.
        kept_per_round = np.split(keep, np.cumsum([events.size for events, _, _ in stat_rounds])[:-1])
        keep = np.flatnonzero(keep)[
            _file_order([events[kept] for (events, _, _), kept in zip(stat_rounds, kept_per_round)], line_row.size)
        ]
        return {
            "line_row": line_row,
            "metadata_id": metadata_id,
            "offset_ps": offset_ps,
            "duration_ps": duration_ps,
            "stat_event": stat_event[keep] + first_event,
            "stat_metadata_id": stat_id[keep],
            "stat_kind": kind[keep],
            "stat_number": number[keep],
            "stat_start": text_start[keep],
            "stat_stop": text_stop[keep],
        }


def _joined(parts: list[dict]) -> dict[str, np.ndarray]:
    joined = {}
    for key, dtype in PART_COLUMNS.items():
        pieces = [part.pop(key) for part in parts]
        joined[key] = np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)
        del pieces
        release_freed_memory()  # the pieces' pages, before the next column is joined
    return joined


# ---------------------------------------------------------------- the space

XSPACE_FIELDS = {1: "planes", 2: "errors", 3: "warnings", 4: "hostnames"}


def check_xspace_layout(buf, end: int | None = None, fields: int | None = None) -> None:
    """Refuse bytes whose top level is not an XSpace's (its four length-delimited fields), walking
    field headers only: a file of zeros or of anything else is refused after its first bytes,
    whatever its size, instead of after decoding all of it. `end`, `fields`: only the first
    `fields` headers of a message `end` bytes long, of which `buf` holds the start."""
    walked = _fields(buf, 0, len(buf) if end is None else end)
    for number, wire, _start, _stop in walked if fields is None else itertools.islice(walked, fields):
        if number not in XSPACE_FIELDS or wire != WIRE_LEN:
            raise WireError(f"field {number} (wire type {wire}) at the top level: not an XSpace trace")


def decode_xspace(buf, wanted_stat_names=None, number_stat_names=(), fork: ForkChild | None = None) -> DecodedSpace:
    """Decode an XSpace held in `buf` (bytes, or an mmap of the file).

    `wanted_stat_names`: the event stats to keep (by name); None keeps every stat.
    `number_stat_names`: kept stats read as numbers from `stat_kind`/`stat_number`; their
    `stat_values` are made only where the value is not a number (boxing millions of ids costs
    more memory than the whole events table). Every other kept stat's value is in `stat_values`.
    `fork`: where a child can be forked (`analysis.parallel.Helpers.child`), the last part of a large
    trace's events is decoded by one (the same result either way).
    Raises `WireError` for bytes that are not a well-formed XSpace.
    """
    located = locate(buf, wanted_stat_names)
    if fork is not None:
        located.start(fork)
    return located.finish(number_stat_names)


@dataclass
class Located:
    """A space whose planes, lines and events' places are read (the events not decoded yet, or a child
    decoding part of them already): `finish` decodes them."""

    buf: object
    planes: list[PlaneInfo]
    lines: list[LineInfo]
    hostnames: list[str]
    batches: _EventBatches | None

    def start(self, fork: ForkChild, child_share: float = CHILD_SHARE) -> None:
        """A child forked (`fork`) to decode the last `child_share` of the events' bytes, where they are many."""
        if self.batches is not None and self.batches.pending_events >= HALVES_MIN_EVENTS:
            self.batches.start(fork, child_share)

    def finish(self, number_stat_names=()) -> DecodedSpace:
        buf, planes, lines, batches = self.buf, self.planes, self.lines, self.batches
        assert batches is not None, "finished once"
        self.batches = None
        try:
            events = batches.columns()
            stat_plane = np.array([line.plane for line in lines], dtype=np.int64)[events.line_row[events.stat_event]]
            name_code, names = _stat_name_codes(events.stat_metadata_id, stat_plane, planes)
            number_codes = [code for code, name in enumerate(names) if name in number_stat_names]
            boxed = None
            if number_codes:
                is_number = np.isin(events.stat_kind, (STAT_UINT64, STAT_INT64, STAT_DOUBLE))
                boxed = np.flatnonzero(~(np.isin(name_code, number_codes) & is_number))
            values = _stat_values(buf, events, stat_plane, planes, boxed)
        finally:
            batches.close()
            del batches  # an mmap cannot close while numpy views it
        return DecodedSpace(planes, lines, self.hostnames, events, values, name_code, names)

    def close(self) -> None:
        """Let go without decoding (ends a child decoding part of the events)."""
        if self.batches is not None:
            self.batches.close()
            self.batches = None


def locate(buf, wanted_stat_names) -> Located:
    """The planes and lines read, and the events located."""
    check_xspace_layout(buf)
    planes: list[PlaneInfo] = []
    lines: list[LineInfo] = []
    hostnames: list[str] = []
    batches = _EventBatches(
        buf, np.frombuffer(buf, dtype=np.uint8), None if wanted_stat_names is None else frozenset(wanted_stat_names)
    )
    for number, wire, start, stop in _fields(buf, 0, len(buf)):
        if number == 1 and wire == WIRE_LEN:
            planes.append(_read_plane(buf, start, stop, len(planes), lines, batches))
        elif number == 4 and wire == WIRE_LEN:
            hostnames.append(_text(buf, start, stop))
    return Located(buf, planes, lines, hostnames, batches)


# ---------------------------------------------------------------- a decode begun before the caller's imports

# A decode begun early: the child decodes the file's last bytes while the caller imports pandas and the
# analysis (about 0.3 s), worth decoding about this many bytes of trace (on any machine: both are the
# same kind of work), then decodes the rest. So that both end together, the child's share is half the
# file and half of that head start: 0.75 of a 32 MB trace (1M events), 0.63 of 64 MB.
IMPORTS_AS_TRACE_BYTES = 16_000_000
EARLY_CHILD_SHARE_MAX = 0.8


def early_child_share(size: int) -> float:
    """The child's share of the bytes of a trace of `size` bytes whose decoding is begun early."""
    return min(EARLY_CHILD_SHARE_MAX, 0.5 + IMPORTS_AS_TRACE_BYTES / (2 * max(size, 1)))


@dataclass
class Begun:
    """A decode begun for one file and names (`begin`); `finish` is the read's, for the same unchanged file."""

    identity: tuple
    located: Located
    buf: mmap.mmap

    def matches(self, path, wanted_stat_names, number_stat_names=()) -> bool:
        return _identity(path, wanted_stat_names, number_stat_names) == self.identity

    def close(self) -> None:
        """End the child and close the map (the decode not finished, or finished: its views gone)."""
        self.located.close()
        close_map(self.buf)


def _identity(path, wanted_stat_names, number_stat_names) -> tuple | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    wanted = None if wanted_stat_names is None else tuple(wanted_stat_names)
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, wanted, tuple(number_stat_names)


def begin(path, wanted_stat_names, number_stat_names, fork: ForkChild) -> Begun | None:
    """Begin decoding the trace file at `path` now: its events located here and a child forked (`fork`)
    that decodes the last `early_child_share` of their bytes while the caller goes on (imports pandas).
    None where the file is too small to pay for it or cannot be read: the read that follows reports it
    as it always does."""
    key = _identity(path, wanted_stat_names, number_stat_names)
    if key is None or not HALVES_MIN_EVENTS * 16 <= key[2] <= TRACE_MAX_BYTES:
        return None
    buf = None
    try:
        buf = open_trace_bytes(path)
        located = locate(buf, wanted_stat_names)
        located.start(fork, early_child_share(len(buf)))
    except (OSError, ValueError, IndexError, MemoryError):  # WireError is a ValueError; the read reports it
        if buf is not None:
            close_map(buf)
        return None
    return Begun(key, located, buf)


def _by_plane(stat_plane: np.ndarray, rows: np.ndarray | None):
    """(plane, rows of that plane) for the given rows (None: all, given back as a slice where they are
    of one plane); the planes present are counted, not sorted (a sort of millions of rows cost more
    than the rest of the naming)."""
    planes_of_rows = stat_plane if rows is None else stat_plane[rows]
    if not planes_of_rows.size:
        return
    present = np.flatnonzero(np.bincount(planes_of_rows))
    if present.size == 1:
        yield int(present[0]), slice(None) if rows is None else rows
        return
    every = np.arange(stat_plane.size) if rows is None else rows
    for plane in present.tolist():
        yield plane, every[planes_of_rows == plane]


def positions(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each id's position in the sorted `keys`, -1 where it is not one of them: by a table where the
    keys are small (metadata ids count up from 1), else by binary search."""
    if not keys.size:
        return np.full(ids.size, -1, dtype=np.int64)
    if keys[0] >= 0 and keys[-1] < 1 << 20:
        table = np.full(int(keys[-1]) + 2, -1, dtype=np.int64)
        table[keys] = np.arange(keys.size)
        return table[np.minimum(ids.view(np.uint64), np.uint64(keys[-1] + 1))]
    at = np.minimum(np.searchsorted(keys, ids), keys.size - 1)
    return np.where(keys[at] == ids, at, -1)


def _stat_values(
    buf, events: EventColumns, stat_plane: np.ndarray, planes: list[PlaneInfo], boxed: np.ndarray | None = None
) -> np.ndarray:
    """Each stat's value as a Python object (None outside the `boxed` rows, when given), made
    kind by kind, not stat by stat where numbers."""
    kind, number = events.stat_kind, events.stat_number
    values = np.full(kind.size, None, dtype=object)
    chosen = np.ones(kind.size, dtype=bool) if boxed is None else np.zeros(kind.size, dtype=bool)
    if boxed is not None:
        chosen[boxed] = True
    for stat_kind, as_type in ((STAT_UINT64, np.uint64), (STAT_INT64, np.int64), (STAT_DOUBLE, np.float64)):
        rows = np.flatnonzero((kind == stat_kind) & chosen)
        if rows.size:
            values[rows] = number[rows].view(as_type).astype(object)
    refs = np.flatnonzero((kind == STAT_REF) & chosen)
    for plane, rows in _by_plane(stat_plane, refs):
        distinct, inverse = np.unique(number[rows].view(np.int64), return_inverse=True)
        names = planes[plane].stat_names
        values[rows] = np.array([names.get(key, "") for key in distinct.tolist()], dtype=object)[inverse]
    texts = np.flatnonzero(((kind == STAT_STR) | (kind == STAT_BYTES)) & chosen)
    if texts.size:
        decoded: dict[tuple[bool, bytes], object] = {}  # one object per distinct value
        is_str = (kind[texts] == STAT_STR).tolist()
        for row, start, stop, text in zip(
            texts.tolist(), events.stat_start[texts].tolist(), events.stat_stop[texts].tolist(), is_str
        ):
            raw = buf[start:stop]
            key = (text, raw)
            value = decoded.get(key)
            if value is None:
                value = decoded[key] = visible(raw.decode("utf-8", errors="backslashreplace")) if text else raw.hex()
            values[row] = value
    return values


def _stat_name_codes(stat_id: np.ndarray, stat_plane: np.ndarray, planes: list[PlaneInfo]):
    """Each stat's name as a code into the sorted names present, resolved once per (plane, id)."""
    per_plane = []
    for plane, rows in _by_plane(stat_plane, None):
        names = planes[plane].stat_names
        keys = np.array(sorted(names), dtype=np.int64)
        ids = stat_id[rows]
        local = positions(keys, ids)
        labels = [names[key] for key in keys.tolist()]
        unknown = np.flatnonzero(local < 0)
        if unknown.size:  # ids without metadata are named by their number
            distinct, inverse = np.unique(ids[unknown], return_inverse=True)
            local[unknown] = keys.size + inverse
            labels += [str(key) for key in distinct.tolist()]
        per_plane.append((rows, local, labels))
    categories = sorted(
        {
            labels[code]
            for _, local, labels in per_plane
            for code in np.flatnonzero(np.bincount(local, minlength=len(labels))).tolist()
        }
    )
    position = {name: code for code, name in enumerate(categories)}
    codes = np.zeros(stat_id.size, dtype=np.int64)
    for rows, local, labels in per_plane:
        codes[rows] = np.array([position.get(name, -1) for name in labels], dtype=np.int64)[local]
    return codes, categories


def _read_plane(buf, start: int, stop: int, plane_index: int, lines: list, batches: _EventBatches) -> PlaneInfo:
    plane = PlaneInfo(0, "", {}, {})
    line_spans = []
    for number, wire, value, end in _fields(buf, start, stop):
        if wire == WIRE_VARINT and number == 1:
            plane.plane_id = _signed(value)
        elif wire != WIRE_LEN:
            continue
        elif number == 2:
            plane.name = _text(buf, value, end)
        elif number == 3:
            line_spans.append((value, end))
        elif number == 4:
            key, name = _map_entry_names(buf, value, end)
            plane.event_names[key] = name
        elif number == 5:
            key, name = _map_entry_names(buf, value, end)
            plane.stat_names[key] = name
    # Lines after the whole plane: which stats to keep is known by name only once stat_metadata is read.
    batches.add_plane(plane.stat_names)
    for line_index, (line_start, line_stop) in enumerate(line_spans):
        lines.append(_read_line(buf, line_start, line_stop, plane_index, line_index, len(lines), batches))
    return plane


def _read_line(
    buf, start: int, stop: int, plane_index: int, line_index: int, row: int, batches: _EventBatches
) -> LineInfo:
    """The line whose fields lie in [start, stop); its events located (`batches`), decoded later."""
    line = LineInfo(plane_index, line_index, 0, "", "", 0, 0)
    pos = start
    try:
        while pos < stop:
            if buf[pos] == 0x22:  # events: located here, decoded later with the others
                pos, added = batches.add_events(row, plane_index, pos, stop)
                line.events += added
                if pos > stop:
                    raise WireError("field runs past the end of its message")
                continue
            end = _field_end(buf, pos, stop)
            for number, wire, value, value_end in _fields(buf, pos, end):
                if wire == WIRE_VARINT and number == 1:
                    line.line_id = _signed(value)
                elif wire == WIRE_VARINT and number == 3:
                    line.timestamp_ns = _signed(value)
                elif wire == WIRE_LEN and number == 2:
                    line.name = _text(buf, value, value_end)
                elif wire == WIRE_LEN and number == 11:
                    line.display_name = _text(buf, value, value_end)
            pos = end
    except IndexError:
        raise WireError("message cut short") from None
    return line


def _field_end(buf, pos: int, stop: int) -> int:
    """The end of the one field that starts at `pos`."""
    tag, pos = _varint(buf, pos)
    wire = tag & 7
    if wire == WIRE_VARINT:
        _, pos = _varint(buf, pos)
    elif wire == WIRE_LEN:
        size, pos = _varint(buf, pos)
        pos += size
    elif wire == WIRE_FIXED64:
        pos += 8
    elif wire == WIRE_FIXED32:
        pos += 4
    else:
        raise WireError(f"wire type {wire} is not used by XSpace")
    if pos > stop:
        raise WireError("field runs past the end of its message")
    return pos


def _malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator returns memory its own way
        return None


_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Give the pages of freed small arrays back to the system. glibc keeps freed blocks under
    its mmap threshold (the decoder's chunks) for reuse, and the columns joined from them are
    new large blocks: without this, a trace's decoded columns count twice in peak memory."""
    if _TRIM is not None:
        _TRIM(0)


def close_map(buffer: mmap.mmap) -> None:
    """Unmap a trace now if nothing views it any more. A numpy view the decoder made can outlive
    it in a reference cycle until the garbage collector runs (later than usual where a library,
    Dask's worker for one, tunes the collector): collected once, and if a view is still there the
    map is left to close with it."""
    for attempt in range(2):
        try:
            buffer.close()
            return
        except BufferError:
            if attempt == 0:
                gc.collect()


# A field's header: a tag and a length, each a varint of at most 10 bytes.
_HEADER_BYTES = 20


def read_into_memory(fd: int, size: int) -> mmap.mmap:
    """The trace file's `size` bytes in memory of this process's own (an anonymous map, which `close_map`
    and a forked child treat as a file's map): a file's map would kill the process with SIGBUS where the
    file is cut short while it is read (another program rewriting it). A file whose first field is no
    XSpace's raises `WireError` before the rest is read (gigabytes of zeros are refused at once)."""
    check_xspace_layout(os.pread(fd, _HEADER_BYTES, 0), size, fields=1)
    buffer = mmap.mmap(-1, size)
    done = 0
    view = memoryview(buffer)
    try:
        while done < size:
            got = os.readv(fd, [view[done:]])
            if got <= 0:
                raise OSError(f"the file changed while it was read: {done:,} of its {size:,} bytes were there")
            done += got
    finally:
        view.release()
    return buffer


def open_trace_bytes(path: str | Path):
    """The file's bytes in memory (`read_into_memory`)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if not size:
            raise ValueError("an empty file")
        return read_into_memory(handle.fileno(), size)


# ---------------------------------------------------------------- plane and event metadata stats (on request)


@dataclass
class PlaneMetadata:
    """One plane's own stats and the stats of its event metadata, read only when asked
    (`decode_metadata`): a device's stated specs, XLA's `Hlo Proto` per program."""

    plane_id: int
    name: str
    stats: dict[str, object]  # the plane's stats (XPlane.stats) by name
    event_stats: dict[int, tuple[str, dict[str, object]]]  # event metadata id -> (name, its wanted stats by name)


def _stat_value(buf, start: int, stop: int, stat_names: dict[int, str]) -> tuple[int, object]:
    """An XStat's metadata id and value: a number, a str, bytes as they are, a reference as its name."""
    key, value = 0, None  # type: tuple[int, object]
    for number, wire, at, end in _fields(buf, start, stop):
        if number == 1 and wire == WIRE_VARINT:
            key = _signed(at)
        elif number == STAT_DOUBLE and wire == WIRE_FIXED64:
            value = float(np.frombuffer(bytes(buf[at:end]), dtype="<f8")[0])
        elif number == STAT_UINT64 and wire == WIRE_VARINT:
            value = at
        elif number == STAT_INT64 and wire == WIRE_VARINT:
            value = _signed(at)
        elif number == STAT_STR and wire == WIRE_LEN:
            value = _text(buf, at, end)
        elif number == STAT_BYTES and wire == WIRE_LEN:
            value = bytes(buf[at:end])
        elif number == STAT_REF and wire == WIRE_VARINT:
            value = stat_names.get(_signed(at), "")
    return key, value


def _event_metadata_stats(buf, start: int, stop: int) -> tuple[int, str, list[tuple[int, int]]]:
    """A map<int64, XEventMetadata> entry: its key, its name and the spans of its stats (field 5)."""
    key, name, stats = 0, "", []
    for number, wire, value, end in _fields(buf, start, stop):
        if number == 1 and wire == WIRE_VARINT:
            key = _signed(value)
        elif number == 2 and wire == WIRE_LEN:
            for inner, inner_wire, at, inner_end in _fields(buf, value, end):
                if inner == 2 and inner_wire == WIRE_LEN:
                    name = _text(buf, at, inner_end)
                elif inner == 5 and inner_wire == WIRE_LEN:
                    stats.append((at, inner_end))
    return key, name, stats


def decode_metadata(buf, wanted_plane=None, event_stat_names=()) -> list[PlaneMetadata]:
    """The stats of each plane and of its event metadata, from an XSpace in `buf`.

    `wanted_plane(name) -> bool` picks the planes (None: all); `event_stat_names`: the event
    metadata stats to keep, by name (only metadata holding one of them is listed). Events are
    never decoded: a plane's lines are skipped whole, so this costs a scan of the metadata only.
    Raises `WireError` for bytes that are not a well-formed XSpace.
    """
    wanted_stats = frozenset(event_stat_names)
    found: list[PlaneMetadata] = []
    for number, wire, start, stop in _fields(buf, 0, len(buf)):
        if number != 1 or wire != WIRE_LEN:
            continue
        plane = PlaneMetadata(0, "", {}, {})
        stat_names: dict[int, str] = {}
        plane_stats: list[tuple[int, int]] = []
        entries: list[tuple[int, int]] = []
        skipped = False
        for field, field_wire, value, end in _fields(buf, start, stop):
            if field == 1 and field_wire == WIRE_VARINT:
                plane.plane_id = _signed(value)
            elif field_wire != WIRE_LEN:
                continue
            elif field == 2:
                plane.name = _text(buf, value, end)
                if wanted_plane is not None and not wanted_plane(plane.name):
                    skipped = True
                    break
            elif field == 4 and wanted_stats:
                entries.append((value, end))
            elif field == 5:
                key, name = _map_entry_names(buf, value, end)
                stat_names[key] = name
            elif field == 6:
                plane_stats.append((value, end))
        if skipped or (wanted_plane is not None and not wanted_plane(plane.name)):
            continue
        for span in plane_stats:
            key, stat = _stat_value(buf, *span, stat_names)
            plane.stats[stat_names.get(key, str(key))] = stat
        wanted_ids = {key for key, name in stat_names.items() if name in wanted_stats}
        for span in entries if wanted_ids else ():
            key, name, stats = _event_metadata_stats(buf, *span)
            kept = {}
            for stat_span in stats:
                stat_key, stat = _stat_value(buf, *stat_span, stat_names)
                if stat_key in wanted_ids:
                    kept[stat_names[stat_key]] = stat
            if kept:
                plane.event_stats[key] = (name, kept)
        found.append(plane)
    return found
