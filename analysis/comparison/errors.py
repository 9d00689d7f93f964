class CompareError(Exception):
    """Input that cannot be compared (not a run directory, no epochs, bad CSV): `error: ...`, exit 2."""


class UnusableRun(CompareError):
    """A run directory whose run.json has no epoch to compare: skipped with a warning beside other runs."""
