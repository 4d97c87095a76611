"""Matplotlib helpers shared by the inspection plots.

Figures are built with `matplotlib.figure.Figure` directly (no `pyplot`), so
nothing depends on, or changes, the process-wide matplotlib backend: saving
uses the Agg renderer (PNG) or the SVG/PDF writers, with or without a display.
"""

import os

import numpy as np


def _matplotlib_figure():
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the install.
        raise ImportError(
            "Plotting needs matplotlib: `pip install matplotlib` (the "
            "`recipes` extra has it)."
        ) from e
    return Figure


def new_figure(figsize):
    return _matplotlib_figure()(figsize=figsize, dpi=100)


FORMATS = ("png", "svg", "pdf")  # the figures' file formats


def save(figure, path):
    """Writes `figure` to `path` (format from the suffix); None skips.
    The path must name a file with one of `FORMATS` as its suffix: without
    one, matplotlib adds `.png` and writes a file of another name (a folder
    `out` gave `out.png` beside it)."""
    if path is None:
        return None
    try:
        path = os.fspath(path)
    except TypeError:
        raise ValueError(f"`path` must be None or a file path. Received: path={path!r}") from None
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if os.path.isdir(path) or suffix not in FORMATS:
        raise ValueError(f"`path` must name a file ending in one of {['.' + f for f in FORMATS]}. "
                         f"Received: path={path!r}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")
    return path


def to_display(images):
    """`(B, H, W, 3)` images in [-1, 1] -> float64 in [0, 1] for `imshow`."""
    images = np.asarray(images, dtype=np.float64)
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(
            "`images` must have shape (batch, height, width, 3), values in "
            f"[-1, 1]. Received: images.shape={images.shape}"
        )
    return np.clip((images + 1.0) / 2.0, 0.0, 1.0)
