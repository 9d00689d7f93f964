"""Plain text for a terminal: `devprof analyze` and `devprof compare`'s default output."""

from __future__ import annotations

import textwrap

import pandas as pd

from analysis.render import tables


def render_analysis(analysis) -> str:
    tables.check_figures(analysis)
    mean, verdict = analysis.mean, analysis.verdict
    out = tables.header_lines(analysis)
    out.append("")
    shown, left_out = tables.slowest_steps(tables.steps_table(analysis))
    if left_out:
        out.append(f"the {len(shown)} slowest of {len(analysis.steps)} steps:")
    out.append(shown.to_string(index=False))
    if left_out:
        out.append(f"… {left_out} more steps in --format json / step_breakdown.csv")
    out.append("")
    per_call = analysis.steps_per_call
    calls = "s" if analysis.steps_used != 1 else ""
    unit = f"call{calls} of {per_call} steps: call" if per_call > 1 else f"step{calls}: step"
    split = " + ".join(
        f"{part} {mean[f'{part}_ms']:.2f} ({mean[f'{part}_pct']:.1f} %)" for part in tables.step_parts(analysis)
    )
    lead = f"mean over {analysis.steps_used} {unit}"
    if not analysis.steps_used:  # only the compile step was traced: the notes say so
        one = "call" if per_call > 1 else "step"
        lead = f"no steady {one} (see the notes); the traced {one}s: {one}"
    out.append(f"{lead} {mean['step_ms']:.2f} ms = {split}")
    spread = tables.spread_line(analysis)
    out += [spread] if spread else []
    out += _device_lines(analysis)
    if not analysis.ops.empty:
        out += [
            "",
            f"top ops (of {len(analysis.ops)}; all in ops.csv; ms per training step, share of op time):",
            tables.ops_table(analysis).to_string(index=False, na_rep=""),
        ]
        out += tables.roofline_lines(analysis)
    if not analysis.input_stages.empty:
        out += [
            "",
            "tf.data stages (self time per batch, slowest first):",
            tables.short_names(analysis.input_stages.head(tables.TOP_OPS).round(3)).to_string(index=False),
        ]
    if analysis.epochs is not None:
        out += [
            "",
            "epochs (from steps.csv and run.json; epoch_level = validation, iterator setup, ...):",
            tables.epochs_table(analysis).to_string(index=False),
        ]
    if analysis.reconciliation is not None and not analysis.reconciliation.empty:
        rec = analysis.reconciliation
        out.append(
            f"trace vs steps.csv on {len(rec)} traced steps: step time differs by "
            f"{rec['step_diff_pct'].abs().mean():.1f} % on average, input by {rec['input_diff_pct'].abs().mean():.1f} % of step time"
        )
    out += tables.memory_lines(analysis)
    out += ["", f"verdict: {tables.verdict_title(verdict)}", verdict["evidence"], *tables.verdict_saving_lines(verdict)]
    if verdict["advice"]:
        out += ["advice:", *(f"  - {item}" for item in verdict["advice"])]
    out += tables.findings_lines(analysis.findings, "  - ")
    return "\n".join(_wrapped(out)) + "\n"


def _wrapped(lines: list[str]) -> list[str]:
    """Every line at most `tables.MAX_LINE` characters: prose is wrapped, indented like its first line."""
    out = []
    for block in lines:
        for line in block.split("\n"):
            if len(line) <= tables.MAX_LINE:
                out.append(line)
                continue
            indent = " " * (len(line) - len(line.lstrip()) + (4 if line.lstrip().startswith("- ") else 2))
            out += textwrap.wrap(
                line, tables.MAX_LINE, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False
            )
    return out


def _device_lines(analysis) -> list[str]:
    out = []
    recorded = tables.devices_table(analysis, recorded_only=True)
    if not recorded.empty:
        out += [
            "",
            "devices (each one's own steps, mean ms over the steady steps it ran in; idle split: waiting for "
            "input / the rest; planes without events are in the notes):",
            recorded.to_string(index=False),
        ]
    launch = analysis.kernel_launch
    if launch and launch["calls"]:
        out.append(
            f"kernel launches on the host: {launch['calls']} calls, {launch['calls_per_step']:.1f} per step, "
            f"{launch['ms_per_step']:.3f} ms per step"
        )
    if not analysis.workers.empty:
        out += [
            "",
            "workers (mean ms per steady step of each host's trace):",
            tables.workers_table(analysis).to_string(index=False),
        ]
        out += tables.worker_summary_lines(analysis)
        line = tables.straggler_line(analysis)
        out += [line] if line else []
    return out


def render_comparison(comparison) -> str:
    table = comparison.table
    out = [
        tables.compare_display_frame(table).to_string(index=False),
        "",
        f"* baseline: {comparison.baseline}; % columns are shares of the epoch "
        "(epoch% = validation and other work outside training steps)",
        "",
        "why:",
    ]
    out += [f"  - {why}" for why in table["why"]]
    out += _worker_lines(table)
    out += [f"external: {note}" for note in tables.external_notes(table)]
    out += comparison.warnings
    text = "\n".join(out) + "\n"
    if comparison.op_diff is not None:
        text += "\n" + "\n".join(tables.op_diff_lines(comparison)) + "\n"
    return text


def _worker_lines(table: pd.DataFrame) -> list[str]:
    out = []
    for _, row in table.iterrows():
        for worker in row.get("workers") or []:
            out.append(
                f"  {row['run']} / {worker['run']}: {worker['seconds_per_epoch']:.3g} s/epoch, "
                f"{tables.worker_parts(worker)}"
            )
    return ["", "workers:", *out] if out else []
