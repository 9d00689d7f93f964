"""devprof's analysis, as a Python API for scripts and notebooks (docs/python-api.md).

    import analysis
    a = analysis.analyze("runs/my-run")      # an Analysis: a.steps, a.devices, a.ops are DataFrames
    c = analysis.compare(["runs/a", "runs/b"])  # a Comparison: c.table

Names are loaded on first use, so `import analysis` (and the `devprof` CLI, which imports the
run-file contracts from here) stays cheap. Nothing here imports TensorFlow.
"""

from __future__ import annotations

__all__ = ["Analysis", "Comparison", "analyze", "analyze_worker", "compare"]


def __getattr__(name: str):
    if name == "analyze":
        from analysis.pipeline import analyze

        return analyze
    if name == "Analysis":
        from analysis.worker import Analysis

        return Analysis
    if name == "analyze_worker":
        from analysis.worker import analyze_worker

        return analyze_worker
    if name == "Comparison":
        from analysis.comparison import Comparison

        return Comparison
    if name == "compare":
        from analysis.comparison import compare_paths

        return compare_paths
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
