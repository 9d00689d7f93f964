"""The installed devprof version, read once from the package metadata."""

from __future__ import annotations

from importlib import metadata


def _installed_version() -> str:
    try:
        return metadata.version("devprof")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


__version__ = _installed_version()
