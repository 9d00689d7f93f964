"""Test helpers in this folder (`trace_fixtures`, `fake_pynvml`) import by their plain names,
however pytest is started (from the repository root, from tests/, or with --import-mode=importlib)."""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
