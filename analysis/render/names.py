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
    return name[:half] + ELLIPSIS + name[-(limit - 1 - half) :]


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


_LABEL_SEPARATORS = frozenset("-_./: ")  # run names: 20250101-120000-gpu-host.example.com


def _shared_cut(texts: list[str]) -> int:
    """How many leading characters every one of `texts` shares and may lose: up to a separator's end,
    and never so many that a text is left without a letter or digit."""
    shared = min(len(t) for t in texts)
    for i in range(shared):
        if any(t[i] != texts[0][i] for t in texts):
            shared = i
            break
    for cut in range(shared, 0, -1):
        if texts[0][cut - 1] in _LABEL_SEPARATORS and all(any(c.isalnum() for c in t[cut:]) for t in texts):
            return cut
    return 0


def _cut_between_words(text: str, limit: int) -> str:
    """`text` cut in its middle to at most `limit` characters, the cut moved to the nearest separators
    when that keeps at least half of each side: `093015-gpu-gpu…workstation-2`."""
    if len(text) <= limit:
        return text
    head_n = (limit - 1) // 2
    tail_n = limit - 1 - head_n
    head, tail = text[:head_n], text[len(text) - tail_n :]
    if text[head_n] not in _LABEL_SEPARATORS:
        cut = max((k for k, c in enumerate(head) if c in _LABEL_SEPARATORS), default=-1)
        head = head[:cut] if cut >= head_n // 2 else head
    if text[len(text) - tail_n - 1] not in _LABEL_SEPARATORS:
        cut = next((k for k, c in enumerate(tail) if c in _LABEL_SEPARATORS), len(tail))
        tail = tail[cut + 1 :] if cut < tail_n // 2 else tail
    return head.rstrip("".join(_LABEL_SEPARATORS)) + ELLIPSIS + tail.lstrip("".join(_LABEL_SEPARATORS))


def distinct_labels(names: list[str], limit: int) -> list[str]:
    """Labels of at most `limit` characters for a chart's rows, each telling its row from the others.

    Run names that share a long start (`20250101-120000-gpu-workstation`, `...-workstation-2`) differ at
    their end or in their middle: cutting each at `limit` keeps only the shared start. When a name is
    too long, every label loses the start all the names share (up to a separator, `…` in its place),
    then if still too long the shared end, then its own middle; labels that would still be equal show
    the stretch where their names differ. Names that all fit are kept whole."""
    texts = [str(name) for name in names]
    if all(len(t) <= limit for t in texts):
        return texts
    distinct = sorted(set(texts))
    if len(distinct) < 2:
        return [middle_cut(t, limit) for t in texts]
    head = _shared_cut(distinct)
    head = head if head > len(ELLIPSIS) + 2 else 0
    cores = {t: t[head:] for t in distinct}
    tail = 0
    if any(len(core) + (1 if head else 0) > limit for core in cores.values()):
        tail = _shared_cut([core[::-1] for core in cores.values()])
        tail = tail if tail > len(ELLIPSIS) + 2 else 0
    marks = (1 if head else 0) + (1 if tail else 0)

    def label(core: str) -> str:
        return (ELLIPSIS if head else "") + _cut_between_words(core, max(3, limit - marks)) + (ELLIPSIS if tail else "")

    shown = {t: label(core[: len(core) - tail]) for t, core in cores.items()}
    groups: dict[str, list[str]] = {}
    for t in distinct:
        groups.setdefault(shown[t], []).append(t)
    for same in (g for g in groups.values() if len(g) > 1):  # what tells them apart was in the middle cut out
        for t in same:
            first = min(
                next((i for i, (a, b) in enumerate(zip(t, o)) if a != b), min(len(t), len(o))) for o in same if o != t
            )
            start = max(0, min(first - (limit - 2) // 2, len(t) - (limit - 2)))
            window = t[start : start + limit - 2]
            shown[t] = (ELLIPSIS if start else "") + window + (ELLIPSIS if start + len(window) < len(t) else "")
    return [shown[t] for t in texts]


__all__ = ["ELLIPSIS", "distinct_labels", "distinct_names", "middle_cut"]
