"""Keep text cells of devprof's CSVs from running as spreadsheet formulas.

A CSV opened in Excel, LibreOffice or Google Sheets runs a cell that starts with `=`, `+`,
`-` or `@` as a formula (and a leading tab or carriage return can hide one), so a run name
like `=HYPERLINK("http://…","click")` would become a live link. As OWASP's CSV-injection
guidance recommends, such a *text* cell is written with a leading `'`, which spreadsheets
read as "this is text" and do not show.

What stays as it is:
- numbers (int, float, NumPy scalars, booleans, None, NaN): they are data, and a negative
  number must stay a number;
- text that is one plain number, such as `"-1.5"`, `"+3"` or `"-2e-3"`: a spreadsheet reads
  it as that number, it cannot run anything, and quoting it would turn a numeric column
  written as text (as pandas does for mixed columns) into text.
"""

from __future__ import annotations

import re

import pandas as pd

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def needs_quote(text: str) -> bool:
    """Whether the text cell `text` would start a formula in a spreadsheet."""
    return text.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(text)


def neutralize_cell(value):
    """`value` with a leading `'` when it is text that a spreadsheet would run as a formula;
    any other value (numbers included) unchanged."""
    if isinstance(value, str) and needs_quote(value):
        return QUOTE + value
    return value


def neutralize_frame(frame: pd.DataFrame, header: bool = True) -> pd.DataFrame:
    """A copy of `frame` whose text cells (and, with `header`, column names) cannot run as
    formulas; numeric columns are not touched, so their dtypes stay."""
    out = frame.copy()
    for column in out.columns:
        series = out[column]
        if pd.api.types.is_numeric_dtype(series.dtype) or pd.api.types.is_bool_dtype(series.dtype):
            continue
        # Cell by cell, not `Series.map`, which would turn None into NaN.
        # A categorical column's new text is no category of it: plain text from here on.
        dtype = object if isinstance(series.dtype, pd.CategoricalDtype) else series.dtype
        out[column] = pd.Series([neutralize_cell(value) for value in series], index=series.index,
                                dtype=dtype, name=series.name)
    if header:
        out.columns = [neutralize_cell(name) for name in out.columns]
    return out
