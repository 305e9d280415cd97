r"""Block verification figures: Figure 2 of the block verification paper (memoryless Bernoulli sources).

Reference: Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating
Speculative Decoding", arXiv:2403.10444 v1, Section 3, Figure 2.

Draft :math:`M_s = \mathrm{Ber}(p)` and target :math:`M_b = \mathrm{Ber}(q)` at
every step (``p`` = draft, ``q`` = target). The expected lengths of the three
block verifiers are computed exactly by :func:`otspec.block.expected_length`
(enumeration of :math:`\{0, 1\}^L`), never re-typed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validation import validate_at_most, validate_positive_int, validate_probability
from ..block import expected_length
from ..models import MemorylessModel
from ._common import grid_items, legend_outside, new_axes, palette, reject_axes

__all__ = ["Figure2Data", "figure2_data", "plot_figure2"]

_NAMES = ("token", "block-onestep", "block")
_STYLE = {"token": ":", "block-onestep": "--", "block": "-"}
_MARKER = {"token": "o", "block-onestep": "s", "block": "D"}
_LABEL = {"token": "TokenVerify", "block-onestep": "BlockVerify (one-step)", "block": "BlockVerify (v1, OT optimum)"}


#: Most enumerated blocks of :func:`figure2_data`: ``len(ps) * 2**L_max`` (seconds per p at ``L_max = 16``; the
#: paper's figure takes 3 ps and ``L_max = 10``).
MAX_FIGURE2_BLOCKS = 2**20

@dataclass(frozen=True, eq=False)
class Figure2Data:
    """Exact expected lengths behind :func:`plot_figure2`.

    Attributes
    ----------
    q : float
        Target's probability of token 1.
    ps : (m,) ndarray
        Draft probabilities of token 1, one curve family each.
    Ls : (k,) ndarray of int
        Block lengths ``1 .. L_max``.
    lengths : dict of str to (m, k) ndarray
        ``lengths[name][i, j]`` = :math:`E[\\tau]` (accepted draft tokens) of
        verifier ``name`` at ``ps[i]``, ``Ls[j]``; add 1 for the paper's count
        (its sums start at i = 0: tokens emitted per iteration, bonus included).
    """

    q: float
    ps: np.ndarray
    Ls: np.ndarray
    lengths: dict


def figure2_data(q: float = 0.75, ps=(0.25, 0.5, 0.6), L_max: int = 10) -> Figure2Data:
    r"""Expected accepted lengths of the three block verifiers for Bernoulli sources.

    .. math::

        E[\tau_v](p, q, L), \quad v \in \{\text{token}, \text{block-onestep}, \text{block}\},
        \ L = 1, \dots, L_{\max},

    each by exact enumeration (:func:`otspec.block.expected_length`).

    Parameters
    ----------
    q : float
        Target's probability of token 1 (0.75 in the paper).
    ps : sequence of float
        Draft probabilities of token 1.
    L_max : int
        Largest block length (<= 16 to keep the enumeration small).

    Returns
    -------
    Figure2Data

    Raises
    ------
    ValueError
        A probability outside [0, 1], no ``ps``, or ``L_max`` outside [1, 16].
    TypeError
        A non-numeric argument.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", arXiv:2403.10444 v1, Section 3, Figure 2.

    Examples
    --------
    >>> from otspec.plotting.block import figure2_data
    >>> d = figure2_data(0.75, (0.5,), 2)
    >>> [round(float(x), 4) for x in d.lengths["block"][0]]
    [0.75, 1.4375]
    """
    q = validate_probability(q, "q")
    ps_ = np.array([validate_probability(p, "ps") for p in grid_items(ps, "ps")], dtype=np.float64)
    if ps_.size == 0:
        raise ValueError("`ps` must hold at least one probability, got none")
    L_max = validate_positive_int(L_max, "L_max")
    if L_max > 16:
        raise ValueError(f"`L_max` must be <= 16 (exact enumeration of 2**L blocks), got {L_max}")
    validate_at_most(ps_.size * 2**L_max, "len(`ps`) * 2**`L_max`", MAX_FIGURE2_BLOCKS, "MAX_FIGURE2_BLOCKS",
                     f"fewer `ps` (2**L blocks enumerated for each p and L; L_max = {L_max})")
    Ls = np.arange(1, L_max + 1)
    target = MemorylessModel([1.0 - q, q])
    lengths = {n: np.empty((ps_.size, Ls.size)) for n in _NAMES}
    for i, p in enumerate(ps_):
        draft = MemorylessModel([1.0 - p, p])
        for j, L in enumerate(Ls):
            for n in _NAMES:
                lengths[n][i, j] = expected_length(draft, target, int(L), n)
    return Figure2Data(q=q, ps=ps_, Ls=Ls, lengths=lengths)


def plot_figure2(q: float = 0.75, ps=(0.25, 0.5, 0.6), L_max: int = 10, *, include_bonus: bool = True,
                 data: Figure2Data | None = None, ax=None):
    r"""Block verification paper's Figure 2: expected tokens per target call against the block length ``L``.

    .. math::

        L \mapsto 1 + \mathbb{E}[\tau_v](\mathrm{Ber}(p), \mathrm{Ber}(q), L),
        \quad v \in \{\text{token}, \text{block-onestep}, \text{block}\},

    where :math:`\tau_v` counts the accepted draft tokens and the 1 is the
    correction or bonus token every target call emits. This is what the
    paper's Figure 2 plots: its Bernoulli sums run from :math:`i = 0`, one
    more term than Theorems 1 and 2, although the caption and the paper's
    :math:`\mathbb{E}[\beta]` say "accepted tokens". With
    ``include_bonus=False`` the accepted draft tokens :math:`\mathbb{E}[\tau_v]`
    alone are drawn; the y label names which.

    One colour per draft ``p``; line style and marker per verifier (dotted
    with hollow circles TokenVerify, dashed with squares one-step
    BlockVerify, solid with diamonds v1 BlockVerify = the block-OT optimum).
    The legend sits to the right of the data.

    Parameters
    ----------
    q : float
        Target's probability of token 1 (0.75 in the paper).
    ps : sequence of float
        Draft probabilities of token 1.
    L_max : int
        Largest block length (at most 16).
    include_bonus : bool, keyword-only
        Plot :math:`E[\tau] + 1` (the paper's sums from :math:`i = 0`: tokens
        per iteration including the correction/bonus token; default) or
        :math:`E[\tau]`.
    data : Figure2Data, optional
        Precomputed values (from :func:`figure2_data`); otherwise computed.
    ax : matplotlib Axes or None, keyword-only
        Axes to draw on (a new figure when None).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on; one line per ``(p, verifier)``.

    Raises
    ------
    ValueError
        A probability outside [0, 1], no ``ps`` or ``L_max`` outside [1, 16].
    TypeError
        ``q`` given a matplotlib Axes (pass it as ``ax=``).

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating
       Speculative Decoding", arXiv:2403.10444 v1,
       Section 3, Figure 2 (its sums start at :math:`i = 0`: accepted tokens + 1).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.block import plot_figure2
    >>> ax = plot_figure2(0.75, (0.5,), 3)
    >>> len(ax.lines)
    3
    """
    reject_axes(q, "q")
    if data is None:
        data = figure2_data(q, ps, L_max)
    ax = new_axes(ax, (7.0, 4.4))
    from matplotlib.lines import Line2D

    shift = 1.0 if include_bonus else 0.0
    colors = palette(len(data.ps))
    for i, p in enumerate(data.ps):
        for n in _NAMES:
            ax.plot(data.Ls, data.lengths[n][i] + shift, linestyle=_STYLE[n], marker=_MARKER[n], markersize=4,
                    color=colors[i], markerfacecolor="white" if n == "token" else colors[i],
                    label=f"{_LABEL[n]}, p={p:g}")
    ax.set_xlabel("block length $L$")
    if include_bonus:
        ax.set_ylabel(r"expected tokens per target call, $\mathbb{E}[\tau] + 1$" "\n(accepted draft tokens + 1)")
    else:
        ax.set_ylabel(r"expected accepted draft tokens $\mathbb{E}[\tau]$")
    ax.set_title(f"Bernoulli sources: draft Ber(p), target Ber(q = {data.q:g})")
    h_p = [Line2D([], [], color=colors[i], linewidth=2, label=f"p = {p:g}") for i, p in enumerate(data.ps)]
    h_v = [Line2D([], [], color="0.3", linestyle=_STYLE[n], marker=_MARKER[n], markersize=4,
                  markerfacecolor="white" if n == "token" else "0.3", label=_LABEL[n]) for n in _NAMES]
    legend_outside(ax, [("draft Ber(p)", h_p), ("verifier", h_v)])
    ax.grid(alpha=0.3)
    return ax
