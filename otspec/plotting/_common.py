"""Shared figure helpers: one way to get the axes, one palette, one outside legend."""

from __future__ import annotations

import numbers

import numpy as np

from .._validation import validate_at_most, validate_count_of
from ..lossy._mentored import MAX_CURVE_POINTS

__all__ = ["new_axes", "palette", "legend_outside", "reject_axes", "grid_items", "grid_array", "check_cells", "MAX_CURVE_POINTS"]

_HINT = "plot fewer points (or draw the figure in parts)"


def grid_items(values, name: str) -> list:
    """The items of a grid argument (``ks``, ``bs``, ``gammas``, ``ls``) as a list, at most
    :data:`otspec.lossy.MAX_CURVE_POINTS` of them (a ``range(10**12)`` is refused before any work)."""
    return validate_count_of(values, name, cap=MAX_CURVE_POINTS, cap_name="MAX_CURVE_POINTS", hint=_HINT)


def grid_array(values, name: str):
    """A grid of reals read by ``np.asarray`` afterwards (``ls``, ``weights``): a number or an ndarray returned as
    is when it has at most :data:`otspec.lossy.MAX_CURVE_POINTS` entries, anything else through
    :func:`grid_items`."""
    if isinstance(values, (numbers.Number, np.ndarray)):
        if np.size(values) > MAX_CURVE_POINTS:
            raise ValueError(f"`{name}` must have at most MAX_CURVE_POINTS = {MAX_CURVE_POINTS:,} items, got "
                             f"{np.size(values):,}; {_HINT}")
        return values
    return grid_items(values, name)


def check_cells(n: int, what: str) -> None:
    """Refuse a figure of more than :data:`otspec.lossy.MAX_CURVE_POINTS` exact values in all (``what`` names the
    parameters whose product ``n`` is, e.g. ``"len(`bs`) * len(`ks`)"``)."""
    validate_at_most(n, what, MAX_CURVE_POINTS, "MAX_CURVE_POINTS", _HINT)

#: Okabe-Ito colours: distinguishable for colour-blind readers and in greyscale order, none pale.
_OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")


def new_axes(ax, figsize):
    """``ax`` itself, or the axes of a new constrained-layout figure (room for an outside legend)."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def palette(n: int) -> list:
    """``n`` colours that stay distinct from each other (Okabe-Ito, then tab20 beyond eight)."""
    if n <= len(_OKABE_ITO):
        return list(_OKABE_ITO[:n])
    import matplotlib as mpl

    cmap = mpl.colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


def legend_outside(ax, groups, *, fontsize: float = 8):
    """One legend to the right of the data, grouped: ``groups`` is a list of ``(title, handles)``.

    A single ``ax.legend`` (so constrained layout and ``bbox_inches="tight"`` make room for it); each
    group opens with its title as a row without a handle.
    """
    from matplotlib.lines import Line2D

    handles = []
    for title, hs in groups:
        if title:
            handles.append(Line2D([], [], linestyle="none", label=title))
        handles.extend(hs)
    leg = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                    fontsize=fontsize, frameon=False, handlelength=2.6)
    for h, text in zip(handles, leg.get_texts()):
        if h.get_linestyle() == "None" and h.get_marker() in ("None", None, ""):
            text.set_fontweight("bold")
    return leg


def reject_axes(value, name: str) -> None:
    """Point a user who passed the axes positionally to ``ax=`` (every plot function takes it by keyword)."""
    if hasattr(value, "figure") and hasattr(value, "plot"):
        raise TypeError(f"`{name}` got a matplotlib Axes: pass the axes by keyword, `ax=...`")
