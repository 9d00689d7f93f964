class CompareError(Exception):
    """Input that cannot be compared (not a run directory, no epochs, bad CSV): `error: ...`, exit 2."""
