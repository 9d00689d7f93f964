"""The repository's root, for tests at any depth under tests/ (their own `Path(__file__).parents[N]`
changes when a file moves)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
