"""XProf's Overview reading of a step, said beside the verdict only as XProf gives it.

XProf's input analysis lays the step's host and device events on one timeline, by its own step
grouping and event classification; devprof's input (what the step is blocked on, DESIGN.md) is not
XProf's, and on a GPU the two part where a device works while the host waits, or where the host's
wait is outside XProf's step group. So XProf's reading is said only where XProf wrote it: TensorFlow
(up to about 2.5) wrote XProf's analysis beside the trace at capture (`analysis.read.tf_analysis`),
with its input share and its own sentence ("HIGHLY" >= 20 %, "MODERATELY" >= 5 %, "POTENTIALLY"
for a large "All Others" share, "NOT"). Elsewhere there is no reading: never devprof's numbers
under XProf's name.
"""

from __future__ import annotations

from dataclasses import dataclass

WORDS = ("HIGHLY", "MODERATELY", "POTENTIALLY", "NOT")


@dataclass(frozen=True)
class XProfReading:
    """XProf's input share of the step and its own sentence about it, as written at capture."""

    input_pct: float  # XProf's, 0-100
    statement: str  # XProf's sentence

    @property
    def input_bound(self) -> str | None:
        """XProf's word for the step ("HIGHLY", "MODERATELY", "POTENTIALLY", "NOT"), None where it wrote none."""
        return next((word for word in WORDS if f"{word} input-bound" in self.statement), None)

    def sentence(self, bound: str | None) -> str | None:
        """One line where XProf reads the step otherwise than the verdict (`bound`); None where it agrees or
        wrote no reading."""
        words = self.input_bound
        if words is None or bound is None or (words == "NOT") == (bound != "input"):
            return None
        return f'XProf\'s Overview page, as TensorFlow wrote it at capture, reads: "{self.statement}"'


def reading(input_pct: float, statement: str) -> XProfReading | None:
    """XProf's reading as written at capture; None without its sentence."""
    return XProfReading(float(input_pct), statement) if statement else None
