r"""SpecTr figures: block efficiency against the number of drafts ``K`` (Table 4 shape).

The values are computed by the caller with :func:`otspec.spectr.block_efficiency`
(exact) or :func:`otspec.spectr.block_efficiency_mc`; this module only draws.
"""

from __future__ import annotations

import numpy as np

from ._common import new_axes, palette, reject_axes

__all__ = ["plot_block_efficiency"]

_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "D", "^", "v")


def plot_block_efficiency(Ks, curves, *, paper=None, ax=None, title=None, legend: bool = True):
    r"""Block efficiency :math:`\mathbb E[\tau]` against ``K``, one line per curve, paper values as markers.

    Each curve gets its own colour, dash pattern and hollow marker, so curves
    that nearly coincide stay apart; the paper's values are black crosses.

    .. math::

        K \mapsto \mathbb E[\tau](K) = \text{decoded tokens per target call}.

    Parameters
    ----------
    Ks : (m,) array_like of int
        Numbers of drafts on the x axis.
    curves : dict of str to (m,) array_like of float
        ``label -> values`` (e.g. one per verifier), drawn as lines.
    paper : dict of str to (m,) array_like of float or None, keyword-only
        ``label -> printed values``, drawn as unconnected markers.
    ax : matplotlib Axes or None, keyword-only
        Axes to draw on (a new figure when None).
    title : str or None, keyword-only
    legend : bool, keyword-only
        Draw a legend on these axes (default). For a grid of panels pass
        False and draw one legend for the figure from any panel's
        ``ax.get_legend_handles_labels()``.

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        If a curve's length differs from ``len(Ks)``.
    TypeError
        ``Ks`` given a matplotlib Axes (pass it as ``ax=``).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.spectr import plot_block_efficiency
    >>> ax = plot_block_efficiency([1, 2, 4], {"k-Seq": [2.0, 2.3, 2.5]}, paper={"paper": [2.2, 2.4, 2.7]})
    >>> ax.get_xlabel()
    'number of drafts K'
    """
    reject_axes(Ks, "Ks")
    Ks = np.asarray(Ks)
    for name, group in (("curves", curves), ("paper", paper or {})):
        for label, vals in group.items():
            if np.asarray(vals).shape != Ks.shape:
                raise ValueError(
                    f"`{name}[{label!r}]` must have one value per K ({Ks.shape[0]}), got {np.asarray(vals).shape}"
                )
    ax = new_axes(ax, (5, 3.5))
    colors = palette(len(curves))
    for i, (label, vals) in enumerate(curves.items()):  # curves that nearly coincide differ in colour, dash, marker
        ax.plot(Ks, vals, color=colors[i], linestyle=_STYLES[i % len(_STYLES)], linewidth=1.2,
                marker=_MARKERS[i % len(_MARKERS)], markersize=4, markerfacecolor="none", label=label)
    for label, vals in (paper or {}).items():
        ax.plot(Ks, vals, linestyle="none", marker="x", color="k", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ks)
    ax.set_xticklabels([str(int(k)) for k in Ks])
    ax.set_xlabel("number of drafts K")
    ax.set_ylabel("block efficiency (tokens / target call)")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize="small")
    return ax
