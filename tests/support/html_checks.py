"""Checks of HTML reports: self-contained (no network reference), escaped, charts drawn."""

from __future__ import annotations

import io
import re

import numpy as np

EVIL = "<script>alert('x')</script>"
NETWORK_REFERENCE = re.compile(
    r"""(?:src|href|xlink:href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|@import""", re.IGNORECASE
)


def assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "<script" not in page.lower(), "the report runs no script"
    assert not NETWORK_REFERENCE.findall(page), NETWORK_REFERENCE.findall(page)
    assert "<link" not in page.lower() and "<img" not in page.lower() and "<iframe" not in page.lower()
    assert "<svg" in page


def _pixels_drawn(png: bytes, box: dict) -> float:
    """Share of the pixels inside `box` that are not near-white."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    crop = image.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
    values = np.asarray(crop, dtype=int)
    return float((values.min(axis=2) < 200).mean())
