"""The whole `devprof analyze` against a tree before it, XProf's converter, and each speed trick switched off.

The whole command (`devprof analyze RUN --out DIR`, a fresh process each time) on the cached traces of
`bench_trace_scale.py` (profiler windows of --scale steps: 1000 and 1750 make about 1M and 2M events),
the variants alternated within every repeat (in a shuffled order), so that load from other jobs falls on
all of them alike. Each variant is compared with this tree's command in the same repeat: the paired
ratio's median and range is its difference and its noise. Memory: the peak of the summed PSS of the command and its children (a page
that a fork shares counts once), one run per variant and size, and the process's own peak RSS.

    python bench/bench_tricks.py [--scale 1000,1750] [--repeats 9] [--baseline REV] [--xprof]
        [--tricks-tree REV --tricks halves,early,...]

`--baseline REV`: the command at a git revision (or a tree folder); `--xprof`: XProf's converter
(bench_trace_scale's task). `--tricks-tree REV`: a tree whose analysis switches each trick off by
`DEVPROF_WITHOUT=<trick>` (ec0d91c), measured with every trick and with each of `--tricks` off.
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_trace_scale as scale  # noqa: E402

TRICKS = ("halves", "early", "locate", "vm_copy", "place", "stages", "plots")
LABELS = {
    "halves": "decode halves (a forked child decodes part of the events; early or not)",
    "early": "early begin (the decode begun before pandas and the analysis are imported)",
    "locate": "the child locating its own part of the lines",
    "vm_copy": "the copy from the child's memory (process_vm_readv; off: through the pipe)",
    "place": "copy into place (the child's arrays read into the joined columns)",
    "stages": "the stages child (tf.data stages and eager ops beside the step analysis)",
    "plots": "the plot helper (matplotlib imported and the PNGs drawn in a second process)",
}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=lambda text: [int(part) for part in text.split(",")], default=[1000, 1750])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tricks", type=lambda text: text.split(","), default=list(TRICKS))
    parser.add_argument("--tricks-tree", metavar="REV", help="the tree whose tricks are switched off in turn")
    parser.add_argument("--baseline", metavar="REV", help="also the command at this git revision (or tree folder)")
    parser.add_argument("--xprof", action="store_true", help="also XProf's converter")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "devprof-bench-trace-scale")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--host-tracer-level", type=int, default=2)
    args = parser.parse_args(argv)
    unknown = set(args.tricks) - set(TRICKS)
    if unknown:
        parser.error(f"unknown tricks {sorted(unknown)}; known: {','.join(TRICKS)}")
    runs = {}
    for steps in args.scale:
        run = scale.ensure_run(args, (10, 10 + steps))
        runs[steps] = (run, scale._facts(run))
    baseline = scale._tree_at(args.baseline) if args.baseline else None
    tricks_tree = scale._tree_at(args.tricks_tree) if args.tricks_tree else None
    for tree in (scale.REPO, baseline, tricks_tree):
        if tree is not None:
            scale.compiled(tree)
    variants = [
        "command",
        *(["tricks-all", *(f"command-without-{trick}" for trick in args.tricks)] if tricks_tree is not None else []),
    ]
    variants += ["command-baseline"] * bool(baseline) + ["xprof"] * args.xprof
    results: dict[tuple[int, str], list[dict]] = {(steps, v): [] for steps in args.scale for v in variants}
    pss: dict[tuple[int, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="devprof-bench-tricks-") as scratch:

        def command(variant: str, steps: int):
            run, facts = runs[steps]
            if variant == "xprof":
                return scale._python("xprof", facts["xplane"]), {}, None
            if variant == "tricks-all":
                return scale._command("command", run, scratch, None)[0], {}, tricks_tree
            if variant.startswith("command-without-"):
                return (*scale._command(variant, run, scratch, None)[:2], tricks_tree)
            return scale._command(variant, run, scratch, baseline)

        for variant in variants:  # warm the bytecode and the page cache
            scale.measure(*command(variant, args.scale[0]))
        order = random.Random(0)  # the same orders on every machine, none favoured
        for repeat in range(args.repeats):
            for steps in args.scale if repeat % 2 == 0 else args.scale[::-1]:
                # Shuffled, not rotated: in a rotation each variant always follows the same one (XProf's
                # gigabyte freed just before, say).
                for variant in order.sample(variants, len(variants)):
                    result = scale.measure(*command(variant, steps))
                    results[(steps, variant)].append(result)
                    print(
                        f"repeat {repeat + 1}, {runs[steps][1]['events']:,} events, {variant}: "
                        f"{result['wall_s']:.2f} s, {result['peak_mib']:.0f} MiB",
                        file=sys.stderr,
                    )
        for steps in args.scale:
            for variant in variants:
                pss[(steps, variant)] = scale.summed_pss(*command(variant, steps))[0]
    print(
        f"\n{args.repeats} repeats, variants alternated (order shuffled every repeat), each a fresh process; "
        "ratio: the variant's wall time over this tree's command in the same repeat, median (range)\n"
    )
    print(
        "| events | variant | wall s, median (range) | ratio to this tree | ratio to every trick | peak RSS MiB "
        "| summed PSS MiB |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for steps in args.scale:
        events = runs[steps][1]["events"]
        mine = results[(steps, "command")]
        for variant in variants:
            rows = results[(steps, variant)]
            walls = [row["wall_s"] for row in rows]
            ratios = [row["wall_s"] / base["wall_s"] for row, base in zip(rows, mine)]
            label = {
                "command": "this tree",
                "command-baseline": f"at {args.baseline}",
                "xprof": "XProf's converter",
                "tricks-all": f"at {args.tricks_tree}, every trick",
            }.get(
                variant,
                f"at {args.tricks_tree}, without " + LABELS.get(variant.removeprefix("command-without-"), variant),
            )
            every = results.get((steps, "tricks-all"))
            against = (
                _spread([row["wall_s"] / base["wall_s"] for row, base in zip(rows, every)])
                if every and (variant == "tricks-all" or variant.startswith("command-without-"))
                else ""
            )
            print(
                f"| {events:,} | {label} | {_spread(walls)} | {_spread(ratios)} | {against} | "
                f"{statistics.median(row['peak_mib'] for row in rows):.0f} | {pss[(steps, variant)]:.0f} |"
            )
    print(f"\ncommand: {shlex.join(['python', 'bench/bench_tricks.py', *(argv or sys.argv[1:])])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
