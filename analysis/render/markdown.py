"""Markdown: `report.md` in a run's analysis folder, and `--format markdown`.

Text that comes from the run (its name, paths, device and op names) has `<` escaped, so that a
name such as `<img onerror=...>` is shown, never run as HTML by a Markdown viewer. Long tables
are cut as the terminal's are: the slowest `MAX_MARKDOWN_STEPS` steps and the first
`MAX_MARKDOWN_EPOCHS` epochs (every row is in the CSVs and the JSON).
"""

from __future__ import annotations

import pandas as pd

from analysis.render import tables

MAX_MARKDOWN_STEPS = 100
MAX_MARKDOWN_EPOCHS = 100


class Table(str):
    """A rendered table: its cells are escaped already."""


def escape(text: str) -> str:
    """`<` as `&lt;`: a Markdown viewer shows it instead of taking it for the start of an HTML tag."""
    return text.replace("<", "&lt;")


def code(text) -> str:
    """`text` as inline code; as plain escaped text where it holds a backtick or a `<`."""
    text = str(text)
    return escape(text) if "`" in text or "<" in text else f"`{text}`"


def _document(lines: list[str]) -> str:
    return "\n".join(line if isinstance(line, Table) else escape(line) for line in lines)


def cell(value) -> str:
    """A table cell: `|` escaped and line breaks as `<br>`, so a name cannot end the row or the table."""
    text = escape(str(value)).replace("\\", "\\\\").replace("|", "\\|")
    return text.replace("\r\n", "<br>").replace("\n", "<br>").replace("\r", "<br>")


def markdown_table(frame: pd.DataFrame, align: list[str] | None = None) -> str:
    header = "| " + " | ".join(map(cell, frame.columns)) + " |"
    rule = "|" + "|".join(align or ["---:"] * len(frame.columns)) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return Table("\n".join([header, rule, *rows]))


def render_analysis(analysis, plot_names: list[str] | None = None) -> str:
    tables.check_figures(analysis)
    mean, verdict = analysis.mean, analysis.verdict
    out = ["# devprof analysis", ""]
    out += [f"- {line}" for line in tables.header_lines(analysis)]
    saving = [f"*{line[0].upper()}{line[1:]}*" for line in tables.verdict_saving_lines(verdict)]
    out += [
        "",
        f"## Verdict: {tables.verdict_title(verdict)}",
        "",
        verdict["evidence"],
        "",
        *saving,
        *([""] if saving else []),
    ]
    out += [f"- {item}" for item in verdict["advice"]]
    if analysis.findings:
        out += ["", "## Findings", ""] + tables.findings_lines(analysis.findings, "- ")[1:]
    # A part not recorded (no device step on a CPU) is left out, not shown as "nan".
    shown = {k: round(v, 3) for k, v in mean.items() if v == v}
    out += ["", "## Mean step", "", markdown_table(pd.DataFrame([shown])), ""]
    spread = tables.spread_line(analysis)
    out += [spread[0].upper() + spread[1:] + ".", ""] if spread else []
    shown, left_out = tables.slowest_steps(tables.steps_table(analysis), MAX_MARKDOWN_STEPS)
    out += [
        "## Steps",
        "",
        "Host overhead includes compile time."
        + (
            f" The {len(shown)} slowest of {len(analysis.steps)} steps; every one is in step_breakdown.csv and the "
            "JSON."
            if left_out
            else ""
        ),
        "",
        markdown_table(shown),
        "",
    ]
    if not analysis.devices.empty:
        out += ["## Devices", "", markdown_table(tables.devices_table(analysis)), ""]
    if not analysis.ops.empty:
        out += [
            "## Top ops",
            "",
            f"The {min(len(analysis.ops), tables.TOP_OPS)} slowest of {len(analysis.ops)} ops "
            "(every one in ops.csv); ms per training step, share of op time, and where costs are known the "
            "achieved rate, intensity and share of the op's roofline ceiling.",
            "",
            markdown_table(tables.ops_table(analysis).fillna("")),
            "",
        ]
        out += [*tables.roofline_lines(analysis), ""] if tables.roofline_lines(analysis) else []
    if not analysis.workers.empty:
        out += ["## Workers", "", markdown_table(tables.workers_table(analysis)), ""]
        if analysis.straggler:
            out += [
                f"Straggler: **{analysis.straggler['worker']}** ({analysis.straggler['cause']}): "
                f"{analysis.straggler['evidence']}",
                "",
            ]
        elif tables.straggler_line(analysis):
            out += [f"Straggler: none ({analysis.straggler_reason or 'no worker stands out'}).", ""]
    if analysis.epochs is not None:
        out += [
            "## Epochs",
            "",
            "From steps.csv and run.json; `epoch_level` is work outside training steps "
            "(validation, iterator setup, checkpoints)."
            + (
                f" The first {MAX_MARKDOWN_EPOCHS} of {len(analysis.epochs)} epochs; every one is in "
                "epoch_breakdown.csv."
                if len(analysis.epochs) > MAX_MARKDOWN_EPOCHS
                else ""
            ),
            "",
            markdown_table(tables.epochs_table(analysis).head(MAX_MARKDOWN_EPOCHS)),
            "",
        ]
    memory = tables.memory_lines(analysis)
    if memory:  # indented lines belong to the allocator above them
        out += [
            "## Memory",
            "",
            *(f"{'  ' if line.startswith('    ') else ''}- {escape(line.strip())}" for line in memory[2:]),
            "",
        ]
    if analysis.reconciliation is not None and not analysis.reconciliation.empty:
        out += ["## Trace vs steps.csv", "", markdown_table(analysis.reconciliation.round(3)), ""]
    for name in plot_names or []:
        out += [f"![{name}]({name})", ""]
    return _document(out) + ("\n" if plot_names is None else "")


def render_comparison(comparison) -> str:
    table = comparison.table
    frame = tables.compare_display_frame(table)
    align = [":---" if i < 2 else "---:" for i in range(len(frame.columns))]
    out = [
        "# devprof compare",
        "",
        markdown_table(frame, align),
        "",
        f"Baseline (*): {code(comparison.baseline)}. Percentages are shares of the epoch.",
        "",
        "## Why",
        "",
    ]
    out += [f"- {why}" for why in table["why"]]
    notes = tables.external_notes(table)
    out += ["", *(f"- external: {note}" for note in notes)] if notes else []
    if comparison.warnings:
        out += ["", "## Warnings", ""] + [f"- {w.removeprefix('warning: ')}" for w in comparison.warnings]
    if comparison.plot_name:
        out += ["", f"![seconds per epoch]({comparison.plot_name})"]
    text = _document(out) + "\n"
    if comparison.op_diff is not None:
        lines = tables.op_diff_lines(comparison)
        lines = ["", "## Op diff", "", lines[0], "", *(line.replace("  - ", "- ", 1) for line in lines[1:])]
        text += "\n" + _document(lines) + "\n"
    return text
