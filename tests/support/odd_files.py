"""Files that are not regular files where a regular one belongs: a link to /dev/zero, a FIFO."""

from __future__ import annotations

import os
from pathlib import Path


def _link_to_dev_zero(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to("/dev/zero")


def _fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
