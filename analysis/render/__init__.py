"""Every output format of `analyze` and `compare`, one module per format behind one registry.

A format module defines `render_analysis(analysis) -> str` and/or
`render_comparison(comparison) -> str`, each a pure function of the one result; none
computes anything. `REGISTRY` names each format, what it renders and the file extensions
that ask for it; `devprof analyze --format` and `compare --format` list their choices from it
without importing the modules (so `devprof --help` stays fast). A new format is one new
module and one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


@dataclass(frozen=True)
class Format:
    name: str  # the module analysis.render.<name>, and the --format value
    renders: tuple[str, ...]  # "analysis", "comparison"
    suffixes: tuple[str, ...] = ()  # file extensions that ask for it (-o/--output)


REGISTRY = (
    Format("text", ("analysis", "comparison"), (".txt",)),
    Format("markdown", ("analysis", "comparison"), (".md", ".markdown")),
    Format("json", ("analysis", "comparison"), (".json",)),
    Format("csv", ("analysis", "comparison"), (".csv",)),
    Format("html", ("analysis", "comparison"), (".html", ".htm")),
    # JSON too, but `.json` asks for the full document: the summary is asked for by name only.
    Format("summary", ("analysis",)),
)


def formats_for(kind: str) -> tuple[str, ...]:
    """The formats that render `kind` ("analysis" or "comparison"), in registry order."""
    return tuple(entry.name for entry in REGISTRY if kind in entry.renders)


def format_for_path(path: str | Path, kind: str, default: str = "text") -> str:
    """The format a file name asks for by its extension (`.md`, `.json`, `.csv`, ...)."""
    suffix = Path(path).suffix.lower()
    return next((entry.name for entry in REGISTRY if kind in entry.renders and suffix in entry.suffixes), default)


def format_of_output(path: str | Path, kind: str, fmt: str | None = None) -> str:
    """The format to write `path` in: `fmt` when given, else the one its extension asks for (text
    without one). An extension no format writes (`report.pdf`) is a ValueError: text in a file
    named .pdf opens as a broken file."""
    if fmt is not None:
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix and not any(kind in entry.renders and suffix in entry.suffixes for entry in REGISTRY):
        known = ", ".join(s for entry in REGISTRY if kind in entry.renders for s in entry.suffixes)
        raise ValueError(f"-o {path}: no format writes {suffix} files; name it {known}, or pass --format")
    return format_for_path(path, kind)


def renderer(fmt: str, kind: str):
    if fmt not in formats_for(kind):
        raise ValueError(f"unknown format {fmt!r} for {kind}; one of {', '.join(formats_for(kind))}")
    return getattr(importlib.import_module(f"analysis.render.{fmt}"), f"render_{kind}")


def render(result, fmt: str) -> str:
    """`result` (an `Analysis` or a `Comparison`) in format `fmt`."""
    return renderer(fmt, getattr(result, "KIND", "analysis"))(result)


class Rendered:
    """What an `Analysis` and a `Comparison` both offer: any registered format, their JSON
    document, and the HTML report as a file. `KIND` names which renderer of a format applies."""

    KIND: ClassVar[str] = "analysis"

    def render(self, fmt: str = "text") -> str:
        return render(self, fmt)

    def to_json(self) -> dict:
        from analysis.render import json as json_format

        return getattr(json_format, f"{self.KIND}_document")(self)

    def to_html(self, path: str | Path) -> Path:
        """The self-contained HTML report, written to `path` atomically (temporary file, then rename)."""
        from analysis.render import outputs

        return outputs.write_text_atomically(Path(path), renderer("html", self.KIND)(self), named=True)
