"""Every output of `devprof analyze` and `devprof compare` on a set of inputs, written to one folder,
so that two versions of the analysis can be diffed byte for byte (`diff -r BEFORE AFTER`).

    .venv/bin/python bench/output_snapshot.py OUT [PATH ...] [--make DIR] [--compare RUN ...]
        [--external CSV]

For each PATH (a trace, a log folder, a run directory or a job) it writes the printed output in
every format, what stderr said and the exit code, and the files `--out` writes (CSVs, plots,
report.md, analysis.json). `--make DIR` first writes the synthetic traces of
`bench/trace_truth.py` there and includes them. `--compare` runs compare over the given runs in
every format, and `compare --ops` over the first two.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support"), str(REPO / "bench")]

FORMATS = ("text", "markdown", "json", "csv", "html", "summary")
COMPARE_FORMATS = ("text", "markdown", "json", "csv", "html")


SNAPSHOT = "<snapshot>"  # the snapshot's own folder, in what the commands print: two snapshots compare as they are


def _run(argv: list[str], out: Path) -> None:
    from profiler.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    text = f"exit {code}\n--- stdout\n{stdout.getvalue()}--- stderr\n{stderr.getvalue()}"
    out.write_text(text.replace(str(ROOT[0]), SNAPSHOT), encoding="utf-8")


ROOT: list[Path] = []  # the snapshot's folder, set by `snapshot`


def _inputs(paths: list[Path]) -> list[Path]:
    """Each path as given, and every trace under a folder of log folders (one level down)."""
    found = []
    for path in paths:
        children = sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []
        if (
            children
            and not any(path.glob("*.xplane.pb"))
            and not (path / "run.json").exists()
            and not (path / "plugins").exists()
        ):
            found.extend(children)
        else:
            found.append(path)
    return found


def snapshot(out: Path, paths: list[Path], compare: list[Path], external: list[Path]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ROOT[:] = [out.absolute()]
    for path in _inputs(paths):
        name = f"{path.parent.name}__{path.name}"
        folder = out / name
        folder.mkdir(exist_ok=True)
        for fmt in FORMATS:
            _run(["analyze", str(path), "--format", fmt], folder / f"analyze.{fmt}.out")
        written = folder / "files"
        shutil.rmtree(written, ignore_errors=True)
        _run(["analyze", str(path), "--out", str(written), "--format", "json"], folder / "analyze.out-dir.out")
        for events in ("ops", "all"):
            perfetto = folder / f"perfetto.{events}.json"
            _run(
                [
                    "analyze",
                    str(path),
                    "--perfetto",
                    str(perfetto),
                    "--perfetto-events",
                    events,
                    "-o",
                    str(folder / f"report.{events}.html"),
                ],
                folder / f"analyze.perfetto-{events}.out",
            )
        print(f"{name}: done", file=sys.stderr)
    if compare:
        folder = out / "compare"
        folder.mkdir(exist_ok=True)
        extra = [arg for csv in external for arg in ("--external", str(csv))]
        for fmt in COMPARE_FORMATS:
            _run(["compare", *map(str, compare), *extra, "--format", fmt], folder / f"compare.{fmt}.out")
        _run(["compare", str(compare[0]), str(compare[1]), "--ops"], folder / "compare.ops.out")
        _run(
            [
                "compare",
                *map(str, compare),
                "--plot",
                str(folder / "compare.png"),
                "--perfetto",
                str(folder / "compare.perfetto.json"),
            ],
            folder / "compare.plot.out",
        )
        _run(
            ["compare", str(compare[0]), str(compare[1]), "--ops", "--format", "json"], folder / "compare.ops.json.out"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("paths", type=Path, nargs="*")
    parser.add_argument(
        "--make", type=Path, default=None, help="write the synthetic traces here first and include them"
    )
    parser.add_argument("--compare", type=Path, nargs="*", default=[])
    parser.add_argument("--external", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    paths = list(args.paths)
    if args.make is not None:
        from trace_truth import make_traces

        if not args.make.exists():
            make_traces(args.make)
        paths.append(args.make)
    snapshot(args.out, paths, args.compare, args.external)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
