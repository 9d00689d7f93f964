"""Names short enough for a table that still tell its rows apart.

Op names are paths (`gradient_tape/model/conv2d_3/Conv2D/Conv2DBackpropFilter`) and rows of one
table share most of them: cutting each name in its middle cuts out the layer, the one part that
differs. Here a name loses first the parts that other rows of the same table also have (common
prefixes, a repeated op suffix), each replaced by `…`, and only while what is left matches no
other row: `…/conv2d_3/…/Conv2DBackpropFilter`.
"""

from __future__ import annotations

import re
from collections import Counter

ELLIPSIS = "…"
_SEPARATOR = re.compile(r"(/|::)")  # TensorFlow scopes, tf.data stages (Iterator::Model::Map)


def _elide(text: str, opening: str, closing: str) -> str:
    """`text` with what stands between the outermost `opening` and `closing` replaced by `…`."""
    out, depth = [], 0
    for char in text:
        if char == opening:
            if depth == 0:
                out.append(opening + ELLIPSIS)
            depth += 1
        elif char == closing and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(closing)
        elif depth == 0:
            out.append(char)
    return "".join(out) if depth == 0 else text


def middle_cut(name: str, limit: int) -> str:
    """`name` cut in its middle to `limit` characters."""
    if len(name) <= limit:
        return name
    half = (limit - 1) // 2
    return name[:half] + ELLIPSIS + name[-(limit - 1 - half):]


class Wildcard:
    """Literal pieces with gaps of one or more characters between them (the `…` of a shown name).

    A regular expression of the same shape (`a.+b.+c`) backtracks: on a 200-part tf.data stage name
    its time grows much faster than the name. Placing each literal at its earliest position after
    the one before (at least one character later past a gap) decides a match in linear passes."""

    def __init__(self, pieces: list[str | None]):  # None: a gap
        self.pieces = pieces

    def fullmatch(self, text: str) -> bool:
        pieces = self.pieces
        if not pieces:
            return text == ""
        start, end = 0, len(text)
        first, last = pieces[0], pieces[-1]
        if first is not None:  # anchored at the start
            if not text.startswith(first):
                return False
            start = len(first)
            pieces = pieces[1:]
        if pieces and last is not None:  # anchored at the end
            if len(text) - len(last) < start or not text.endswith(last):
                return False
            end = len(text) - len(last)
            pieces = pieces[:-1]
        elif not pieces:
            return start == end
        position, gap = start, False
        for piece in pieces:
            if piece is None:
                gap = True
                continue
            found = text.find(piece, position + (1 if gap else 0), end)
            if found < 0:
                return False
            position, gap = found + len(piece), False
        return position + (1 if gap else 0) <= end and (gap or position == end)


def _pattern(parts: list[str], dropped: set[int]) -> tuple[str, Wildcard]:
    """The shown name with the `dropped` parts as `…`, and a pattern of the names it could stand for."""
    shown: list[str] = []
    pieces: list[str | None] = []
    previous_dropped = False

    def literal(text: str) -> None:
        shown.append(text)
        if pieces and pieces[-1] is not None:
            pieces[-1] += text
        else:
            pieces.append(text)

    for i, part in enumerate(parts):
        if i % 2 == 1:  # a separator: kept unless it lies between two dropped parts
            if previous_dropped and i + 1 in dropped:
                continue
            literal(part)
            continue
        if i in dropped:
            if not previous_dropped:
                shown.append(ELLIPSIS)
                pieces.append(None)
            previous_dropped = True
        else:
            literal(part)
            previous_dropped = False
    return "".join(shown), Wildcard(pieces)


def _shorten(name: str, others: list[str], shared: Counter, limit: int) -> str:
    parts = _SEPARATOR.split(name)
    words = list(range(0, len(parts), 2))
    last = words[-1]
    # What other rows share goes first, the most shared first; the last part (the op) last of all.
    order = sorted((i for i in words if parts[i]), key=lambda i: (i == last, -shared[parts[i]], -len(parts[i]), i))
    dropped: set[int] = set()
    shown = name
    for i in order:
        if len(shown) <= limit:
            break
        if len(dropped) + 1 == len(words):
            break  # a name is never all `…`
        candidate, regex = _pattern(parts, dropped | {i})
        if any(regex.fullmatch(other) for other in others):
            continue  # it would no longer tell this row from another one
        dropped.add(i)
        shown = candidate
    if len(shown) <= limit:
        return shown
    # Parts too long on their own (a kernel's name): cut the longest kept ones in their middle.
    while len(shown) > limit:
        kept = [i for i in words if i not in dropped and len(parts[i]) > 8]
        if not kept:
            return middle_cut(shown, limit)
        longest = max(kept, key=lambda i: len(parts[i]))
        parts[longest] = middle_cut(parts[longest], max(8, len(parts[longest]) - (len(shown) - limit)))
        shown = _pattern(parts, dropped)[0]
    return shown


def distinct_names(names: list, limit: int) -> list:
    """Each name at most `limit` characters, told apart from the other `names` (the rows of one
    table column). Template arguments `<…>` and parameter lists `(…)` go first (CUDA and Eigen
    kernel names run to thousands of characters), then the parts the other rows share.
    A name that fits is kept whole; what is not text is left as it is."""
    texts = [name for name in names if isinstance(name, str)]
    shared: Counter = Counter()
    for text in set(texts):
        shared.update(set(_SEPARATOR.split(text)[::2]))
    out = []
    for name in names:
        if not isinstance(name, str) or len(name) <= limit:
            out.append(name)
            continue
        short = _elide(_elide(name, "<", ">"), "(", ")")
        if len(short) > limit:
            others = [t for t in texts if t != name]
            short = _shorten(short, others, shared, limit)
        out.append(short)
    return out


__all__ = ["ELLIPSIS", "distinct_names", "middle_cut"]
