"""The name shortener on the worst case a pipeline makes: tf.data stage names nested N deep.

`ds.concatenate(...)` in a loop gives stage names of `Concatenate[0]::` repeated N times; eight
such rows make the text report's stage table. Shortening them with a regular expression per
candidate (`a.+b.+c`, as the shortener once did) backtracks, growing much faster than the
names; the wildcard match it uses now places each literal once. Prints seconds per table for
both, side by side, at each depth (the regular expression only while it stays under its limit).

    .venv/bin/python bench/bench_names.py --depths 25 50 100 200 400
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.render import names  # noqa: E402

ROWS = 8
LIMIT = 60


def stage_names(depth: int) -> list[str]:
    chain = "::".join(["Concatenate[0]"] * depth)
    return [
        f"Iterator::Root::Prefetch::{chain}::{kind}"
        for kind in ("TensorSlice", "Map", "BatchV2", "Shuffle", "Repeat", "ParallelMapV2", "Range", "Zip")
    ][:ROWS]


class RegexPattern:
    """The regular expression the shortener once built: `.+` for each gap."""

    def __init__(self, pieces):
        self.regex = re.compile("".join(".+" if p is None else re.escape(p) for p in pieces), re.DOTALL)

    def fullmatch(self, text: str) -> bool:
        return self.regex.fullmatch(text) is not None


def timed(depth: int, matcher) -> float:
    with mock.patch.object(names, "Wildcard", matcher):
        began = time.perf_counter()
        short = names.distinct_names(stage_names(depth), LIMIT)
        elapsed = time.perf_counter() - began
    assert len(set(short)) == ROWS, short
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[25, 50, 100, 200, 400])
    parser.add_argument(
        "--regex-limit-s",
        type=float,
        default=30.0,
        help="stop timing the regular expression once one depth takes longer than this",
    )
    args = parser.parse_args(argv)
    print("| depth | name length | wildcard s | regular expression s | ratio |")
    print("|---|---|---|---|---|")
    regex_alive = True
    for depth in args.depths:
        wildcard = timed(depth, names.Wildcard)
        regex = timed(depth, RegexPattern) if regex_alive else float("nan")
        regex_alive = regex_alive and regex < args.regex_limit_s
        ratio = f"{regex / wildcard:.0f}x" if regex == regex else "-"
        regex_text = f"{regex:.3f}" if regex == regex else "not run (too slow)"
        print(f"| {depth} | {len(stage_names(depth)[0])} | {wildcard:.4f} | {regex_text} | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
