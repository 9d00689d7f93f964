"""XProf's Overview reading of a step, said beside the verdict only as XProf gives it.

XProf's input analysis (`input_pipeline_analysis.cc`) lays the step's host and device events on one
timeline where, at any instant, the event type of highest priority wins (device compute and copies
over the host's wait for input, the wait over host-to-device copies); its input is the time left to
the host's wait for input and to host-to-device copies, over the step. Its cut-offs: input >= 20 %
"HIGHLY", >= 5 % "MODERATELY" input-bound; under 5 %, a large share of time no event covers ("All
Others") makes it "POTENTIALLY" input-bound, which devprof cannot reproduce from its own view and so
never states unless TensorFlow wrote XProf's analysis beside the trace at capture.
"""

from __future__ import annotations

from dataclasses import dataclass

HIGHLY_INPUT_PCT = 20.0  # XProf's kHighlyInfeedBoundThresholdInPercent
MODERATELY_INPUT_PCT = 5.0  # XProf's kModeratelyInfeedBoundThresholdInPercent


@dataclass(frozen=True)
class XProfReading:
    """XProf's input share of the step and, where XProf wrote it, its own sentence."""

    input_pct: float  # on XProf's definition, 0-100
    source: str  # "capture": TensorFlow wrote XProf's analysis beside the trace; "definition": devprof applied it
    statement: str = ""  # XProf's sentence (capture only)

    @property
    def input_bound(self) -> str | None:
        """XProf's words for the step: "HIGHLY", "MODERATELY", "POTENTIALLY", "NOT", or None where unknown."""
        if self.source == "capture" and self.statement:
            return next((word for word in ("HIGHLY", "MODERATELY", "POTENTIALLY", "NOT") if word in self.statement),
                        None)
        if not self.input_pct == self.input_pct:
            return None
        if self.input_pct >= HIGHLY_INPUT_PCT:
            return "HIGHLY"
        return "MODERATELY" if self.input_pct >= MODERATELY_INPUT_PCT else None

    def sentence(self, bound: str | None) -> str | None:
        """One line where XProf reads the step otherwise than the verdict (`bound`); None where it agrees or
        its reading cannot be reproduced."""
        words = self.input_bound
        if words is None or bound is None or (words == "NOT") == (bound != "input"):
            return None
        if self.source == "capture" and self.statement:
            return f"XProf's Overview page, as TensorFlow wrote it at capture, reads: \"{self.statement}\""
        cut = HIGHLY_INPUT_PCT if words == "HIGHLY" else MODERATELY_INPUT_PCT
        return (f"XProf's Overview page reads this step as {words.lower()} input-bound: on its definition (the host's "
                "wait for input and host-to-device copies, where no device work runs at the same time) input is "
                f"{self.input_pct:.1f} % of the step (>= {cut:g} %).")


def reading(input_pct: float, capture_input_pct: float | None = None, capture_statement: str = "") -> XProfReading | None:
    """XProf's reading: its own, where TensorFlow wrote it at capture; else devprof's application of its
    definition (`input_pct`, NaN: not reproducible)."""
    if capture_input_pct is not None and capture_input_pct == capture_input_pct:
        return XProfReading(float(capture_input_pct), "capture", capture_statement)
    if input_pct == input_pct:
        return XProfReading(float(input_pct), "definition")
    return None
