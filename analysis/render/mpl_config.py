"""A writable configuration folder for matplotlib before it is imported.

Where `~/.config/matplotlib` cannot be written (a read-only or missing HOME: containers, CI
runners, services), matplotlib makes a new temporary folder on every import, prints two lines
about it and builds its font cache again (seconds). devprof points it at a folder of its own
instead, kept between runs, which the user can still choose with MPLCONFIGDIR.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

ENV_VAR = "MPLCONFIGDIR"


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def default_config_dir() -> Path | None:
    """matplotlib's own default: $XDG_CONFIG_HOME/matplotlib or ~/.config/matplotlib (None: no home)."""
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base:
        try:
            base = str(Path.home() / ".config")
        except RuntimeError:  # no HOME and no password entry
            return None
    return Path(base) / "matplotlib"


def own_config_dir() -> Path | None:
    """devprof's folder for matplotlib under the system's temporary folder: this user's only (made
    0700, refused where another user or a link holds the name)."""
    getuid = getattr(os, "getuid", None)
    path = Path(tempfile.gettempdir()) / f"devprof-matplotlib-{getuid() if getuid else 'user'}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or (getuid is not None and info.st_uid != getuid()):
        return None
    return path if os.access(path, os.W_OK | os.X_OK) else None


def ensure_config_dir() -> None:
    """Set MPLCONFIGDIR to devprof's own folder where it is unset and matplotlib's default cannot be
    written; otherwise leave matplotlib to find its folder as it does."""
    if os.environ.get(ENV_VAR) or "matplotlib" in sys.modules:
        return
    default = default_config_dir()
    if default is not None and _writable_dir(default):
        return
    own = own_config_dir()
    if own is not None:
        os.environ[ENV_VAR] = str(own)
