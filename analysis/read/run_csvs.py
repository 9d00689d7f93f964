"""The readers of a run's CSVs: steps.csv and the samplers' utilization/*.csv, by the contract in `run_files`."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.read.run_files import (
    CSV_MAX_BYTES,
    STEPS_COLUMNS,
    STEPS_INTEGER_COLUMNS,
    STEPS_LIMITS,
    TIME_COLUMN,
    UTILIZATION_DIR,
    RunFileError,
    read_regular,
    warn,
)


def _complete_lines(path: Path) -> list[str]:
    """Lines of a CSV written row by row; a last line without its newline was cut off and is dropped."""
    text = read_regular(path, CSV_MAX_BYTES, path.parent.parent).decode("utf-8", errors="replace")
    return [line for line in text.split("\n")[:-1] if line.strip()]


def _numeric_rows(path: Path, lines: list[str]) -> tuple[pd.DataFrame, int]:
    """Header + rows as float columns; returns the frame and how many rows had the wrong cell count."""
    header = lines[0]
    cells = header.count(",")
    rows = [line for line in lines[1:] if line.count(",") == cells]
    frame = pd.read_csv(io.StringIO("\n".join([header, *rows]) + "\n"), dtype=str, keep_default_na=False)
    frame.columns = [str(c).strip() for c in frame.columns]
    frame = frame.apply(lambda column: pd.to_numeric(column.str.strip(), errors="coerce"))
    return frame, len(lines) - 1 - len(rows)


def read_steps_csv(path: str | Path) -> pd.DataFrame:
    """steps.csv with its documented columns as numbers, one row per (epoch, step), in order.

    A missing column is a RunFileError; a row with a missing, non-numeric, infinite or
    negative cell (or the wrong number of cells) is skipped, with one warning for the file.
    Rows written twice (the same epoch and step) are dropped and the rest sorted by epoch and
    step, with one warning. Read by pandas' C parser, only the documented columns: a
    million rows take seconds.
    """
    path = Path(path)
    raw = read_regular(path, CSV_MAX_BYTES, path.parent)
    raw = raw[: raw.rfind(b"\n") + 1]  # a last line without its newline was cut off mid-row
    if not raw.strip():
        raise RunFileError(f"{path}: empty file (no header)")
    rows_written = raw.count(b"\n") - len(_BLANK_LINE.findall(raw)) - 1 - (not raw[: raw.find(b"\n")].strip())
    try:
        frame = pd.read_csv(
            io.BytesIO(raw),
            usecols=lambda c: str(c).strip() in STEPS_COLUMNS,
            dtype=str,
            keep_default_na=False,
            on_bad_lines="skip",
            engine="c",
            encoding_errors="replace",
        )
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise RunFileError(f"{path}: not a CSV ({str(exc).splitlines()[0]})") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in STEPS_COLUMNS if c not in frame.columns]
    if len(missing) == len(STEPS_COLUMNS):
        raise RunFileError(f"{path}: {_not_a_steps_header(raw)}")
    if missing:
        raise RunFileError(f"{path}: missing columns {', '.join(missing)}")
    frame = frame.loc[:, ~frame.columns.duplicated()][STEPS_COLUMNS]
    values = (
        np.column_stack(
            [pd.to_numeric(frame[c].str.strip(), errors="coerce").to_numpy(dtype=float) for c in STEPS_COLUMNS]
        )
        if len(frame)
        else np.empty((0, len(STEPS_COLUMNS)))
    )
    frame = pd.DataFrame(values, columns=STEPS_COLUMNS)
    limits = np.array([STEPS_LIMITS[c] for c in STEPS_COLUMNS])
    valid = (
        np.isfinite(values).all(axis=1)
        & (values >= 0).all(axis=1)
        & (frame["steps"] >= 1).to_numpy()
        & (values <= limits).all(axis=1)
    )
    skipped = max(rows_written, len(frame)) - int(valid.sum())
    if skipped:
        warn(f"{path}: skipped {skipped} of {max(rows_written, len(frame))} rows that do not parse")
    frame = frame[valid].astype({c: "int64" for c in STEPS_INTEGER_COLUMNS})
    return _one_row_per_step(frame, path).reset_index(drop=True)


_BLANK_LINE = re.compile(rb"(?<=\n)[ \t\r]*\n")


def _not_a_steps_header(raw: bytes) -> str:
    """Why the first line of a steps.csv holds none of its columns: another encoding (a spreadsheet's
    UTF-16 export), another separator (';' where the decimal mark is a comma), or no header at all."""
    first = raw[: raw.find(b"\n")] if b"\n" in raw else raw
    expected = f"expected the header {','.join(STEPS_COLUMNS)}"
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\0" in first:
        return f"not UTF-8 text (UTF-16, or not text at all); {expected}: save it as UTF-8 CSV"
    try:
        header = first.decode("utf-8-sig").strip()
    except UnicodeDecodeError:
        return f"its first line is not UTF-8 text; {expected}"
    for separator, name in ((";", "semicolons"), ("\t", "tabs")):
        if separator in header and all(c in [cell.strip() for cell in header.split(separator)] for c in STEPS_COLUMNS):
            return f"its columns are separated by {name}, not commas; {expected}"
    shown = header if len(header) <= 60 else header[:57] + "..."
    return f"its first line is not steps.csv's header (got {shown!r}); {expected}"


def _one_row_per_step(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Rows sorted by (epoch, step), each step once (its first row): a step written twice would
    count twice in its epoch, and rows out of order would make a later step look like the first."""
    duplicated = frame.duplicated(["epoch", "step"], keep="first")
    keys = frame["epoch"].to_numpy() * (int(frame["step"].max()) + 1 if len(frame) else 1) + frame["step"].to_numpy()
    in_order = bool((np.diff(keys) > 0).all())
    if in_order:
        return frame
    what = []
    if duplicated.any():
        what.append(f"dropped {int(duplicated.sum())} rows that repeat an epoch and step already seen")
    what.append("sorted the rows by epoch and step")
    warn(f"{path}: {' and '.join(what)}")
    return frame[~duplicated].sort_values(["epoch", "step"], kind="stable")


def read_sampler_csv(path: str | Path) -> pd.DataFrame:
    """A sampler CSV as numbers; empty cells (metrics turned off) are NaN, rows without a time dropped,
    rows in time order (rows out of order are sorted, with one warning: each sample covers the time
    since the one before it, and per-step utilization looks samples up by time)."""
    path = Path(path)
    lines = _complete_lines(path)
    if not lines:
        return pd.DataFrame()
    frame, _ = _numeric_rows(path, lines)
    frame = _plausible_samples(frame, path)
    if TIME_COLUMN in frame:
        frame = frame[np.isfinite(frame[TIME_COLUMN].to_numpy(dtype=float))].reset_index(drop=True)
        if not frame[TIME_COLUMN].is_monotonic_increasing:
            warn(f"{path}: rows are not in time order: sorted by {TIME_COLUMN}")
            frame = frame.sort_values(TIME_COLUMN, kind="stable").reset_index(drop=True)
    return frame


_CORE_COLUMN = re.compile(r"cpu\d+_pct")
# The most any sampler can write for an amount: past these no machine measures (an exabyte of
# memory, an exabyte per second, 100 kW, 1 THz, 1000 degrees).
_AMOUNT_LIMITS = (
    (re.compile(r".*_bytes(_per_s)?$"), 2.0**60),
    (re.compile(r".*_w$"), 1e5),
    (re.compile(r".*_mhz$"), 1e6),
    (re.compile(r"^temp_c$"), 1e3),
    (re.compile(r"^proc_count$"), 1e7),
)


def _amount_limit(column: str) -> float:
    return next((limit for pattern, limit in _AMOUNT_LIMITS if pattern.fullmatch(column)), math.inf)


def _plausible_samples(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Cells no sampler writes read as empty, with one warning naming the columns: a share outside
    0-100 % (the process tree's CPU: 100 per core), a negative or infinite amount. Left in, one
    would be an impossible per-step figure or fail the report's own checks."""
    cores = sum(1 for column in frame.columns if _CORE_COLUMN.fullmatch(str(column)))
    named = []
    for column in frame.columns:
        if column == TIME_COLUMN or not pd.api.types.is_numeric_dtype(frame[column]):
            continue
        values = frame[column].to_numpy(dtype=float, copy=True)
        if str(column).endswith("_pct"):
            top = 100.0 * (cores or 4096) if column == "proc_cpu_pct" else 100.0
            values[(values > top) & (values <= top * 1.005)] = top  # a rounding step over the top
            bad = ~np.isfinite(values) | (values < 0) | (values > top)
        else:
            limit = _amount_limit(str(column))
            bad = ~np.isfinite(values) | ((values < 0) if column != "temp_c" else (values < -limit)) | (values > limit)
        bad &= ~np.isnan(values)
        if bad.any():
            named.append(f"{column} ({int(bad.sum())})")
            values[bad] = np.nan
        frame[column] = values
    if named:
        warn(
            f"{path}: values no sampler writes (a share outside 0-100 %, a negative, infinite or impossibly "
            "large amount) "
            f"read as empty: {', '.join(named[:5])}{' and more' if len(named) > 5 else ''}"
        )
    return frame


def read_utilization(run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """`{sampler name: samples}` for every readable, non-empty `utilization/*.csv`; one that cannot
    be read (not a regular file, too big, a link out of the run) is skipped with a warning."""
    found = {}
    for csv in sorted((Path(run_dir) / UTILIZATION_DIR).glob("*.csv")):
        try:
            frame = read_sampler_csv(csv)
        except RunFileError as exc:
            warn(f"{exc}: sampler skipped")
            continue
        if TIME_COLUMN in frame and not frame.empty:
            found[csv.stem] = frame
    return found
