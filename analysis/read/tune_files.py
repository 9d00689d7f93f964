"""A `devprof tune` folder: its answer (tune.json) and the device its trials ran on, for compare."""

from __future__ import annotations

import json
from pathlib import Path

from analysis.read import run_files

TUNE_JSON = "tune.json"
TUNE_SCHEMA = "devprof.tune/1"


def is_tune(path: Path) -> bool:
    return path.is_dir() and (path / TUNE_JSON).is_file() and not (path / run_files.RUN_JSON).is_file()


def read_tune_json(path: Path) -> dict:
    """tune.json of the tune folder `path`; a file that is unreadable, not JSON or not a tune's answer
    is a RunFileError."""
    raw = run_files.read_regular(path / TUNE_JSON, run_files.CSV_MAX_BYTES)
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise run_files.RunFileError(f"{path / TUNE_JSON}: not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("schema") != TUNE_SCHEMA:
        raise run_files.RunFileError(f"{path / TUNE_JSON}: not a tune's answer (schema {TUNE_SCHEMA} expected)")
    return document


def tune_device(path: Path) -> str:
    """The device the tune's first trial ran on, as its run.json names it ("?" where none says)."""
    for trial in sorted(child for child in path.iterdir() if (child / run_files.RUN_JSON).is_file()):
        try:
            device = run_files.read_run_json(trial / run_files.RUN_JSON).get("device") or {}
        except run_files.RunFileError:
            continue
        return str(device.get("name") or device.get("kind") or "?")
    return "?"
