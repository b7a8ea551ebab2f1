"""What a plot written as a PNG holds, read back from its pixels (the data each figure draws is
checked in tests/unit/test_plots.py; here, that a run wrote that figure, drawn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import image

FIRST_SERIES = (31, 119, 180)  # matplotlib's first colour (tab:blue): a run's first line or its bars


def drawn(path: Path) -> tuple[int, int, int]:
    """(width, height) in pixels, and how many pixels are in the first series' colour."""
    pixels = image.imread(path)
    rgb = np.rint(pixels[..., :3] * 255)
    series = int((np.abs(rgb - FIRST_SERIES).max(axis=-1) <= 2).sum())
    return pixels.shape[1], pixels.shape[0], series
