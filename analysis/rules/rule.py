"""What a rule is: one shape for every row, apart so that the verdict's rules and the findings' share it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from analysis.rules.facts import Facts

SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Rule:
    id: str
    component: str  # the part of the step it is about: input, host, compute, epoch_level
    applies: Callable[[Facts], bool]
    headline: Callable[[Facts], str]
    fix: Callable[[Facts], str]  # one change, as a clause: compare's "why" and analyze's first advice
    more: Callable[[Facts], list[str]] = field(default=lambda facts: [])
    bound: str | None = None  # the verdict it gives (None: not a verdict rule)
    level: str | None = None
    severity: str = "warning"
    description: str = ""
    finding: bool = False  # reported among `findings` wherever it applies
