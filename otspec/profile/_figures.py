r"""Figures of a profile summary (matplotlib, imported lazily; every function takes ``ax=None`` and returns the axes).

Every figure draws the estimates of one set of positions (:attr:`ProfileSummary.sets`), named in its
title, so that no curve is set beside another computed on other positions: by default the set on which
every profiled scheme was computed.
"""

from __future__ import annotations

import numpy as np

from .._registry import get_verifier, unknown_name_message

__all__ = ["plot_acceptance_vs_k", "plot_tokens_vs_L", "plot_speedup", "position_set"]


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6, 4))
    return ax


def position_set(summary, positions: str | None = None):
    """The :class:`PositionSet` a figure draws: ``positions`` by name, or (None) the one holding every scheme.

    Raises
    ------
    ValueError
        ``positions`` names no set of the summary.
    """
    sets = summary.sets
    if positions is None:
        sub = sets.get("subsample")
        every = sets.get("all")
        needs_sub = sub is not None and every is not None and (
            {key[0] for key in sub.tokens_per_call} - {key[0] for key in every.tokens_per_call}
            or {key[0] for key in sub.acceptance} - {key[0] for key in every.acceptance})
        positions = "subsample" if needs_sub or every is None else "all"
    if positions not in sets:
        raise ValueError(unknown_name_message("positions", positions, tuple(sets)))
    return sets[positions]


def _where(ps) -> str:
    return f"{ps.positions} positions" + ("" if ps.name == "all" else " of the subsample")


def _errorbar(ax, x, est, **style):
    y = np.array([e.value for e in est])
    err = np.array([[e.value - e.lo for e in est], [e.hi - e.value for e in est]])
    ax.errorbar(x, y, yerr=np.clip(np.nan_to_num(err), 0, None), capsize=2, **style)


def _integer_axis(axis, values):
    values = sorted(set(int(v) for v in values))
    axis.set_ticks(values, [str(v) for v in values])


def plot_acceptance_vs_k(summary, *, depth: int = 1, positions: str | None = None, ax=None):
    r"""Mean exact acceptance at one depth against ``k``, per verifier, under the :math:`\alpha_k` ceiling.

    .. math::

        \bar a_j(k) = \frac{1}{N} \sum_{t} P\big(Y \in S(X_{1..k})\big)_t \ \le\ \overline{\alpha_k}
        \quad\text{(verifiers of } k \text{ i.i.d. drafts).}

    :math:`\alpha_k` bounds the verifiers of ``k`` i.i.d. drafts only; a verifier
    with its own draft process (greedy drafts, without replacement) is drawn
    dashed and may lie above it.

    Parameters
    ----------
    summary : ProfileSummary
    depth : int, keyword-only
        The depth ``j`` (1: the first drafted token).
    positions : {"all", "subsample"} or None, keyword-only
        The position set (:func:`position_set`).
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        ``depth`` not profiled on these positions.
    """
    ax = _axes(ax)
    ps = position_set(summary, positions)
    names = list(dict.fromkeys(v for v, _, j in ps.acceptance if j == depth))
    if not names:
        raise ValueError(f"`depth` must be a profiled depth, got {depth}")
    ks_all = set()
    for name in names:
        ks = sorted(k for v, k, j in ps.acceptance if v == name and j == depth)
        ks_all.update(ks)
        est = [ps.acceptance[(name, k, depth)] for k in ks]
        if name == "optimal":
            style = dict(color="black", lw=2.5, zorder=1, label="alpha_k: ceiling of k i.i.d. drafts")
        elif get_verifier(name).draft_process != "iid":
            style = dict(marker="s", ms=4, ls="--", label=f"{name} (own draft process)")
        else:
            style = dict(marker="o", ms=4, label=name)
        _errorbar(ax, ks, est, **style)
    _integer_axis(ax.xaxis, ks_all)
    ax.set_xlabel("drafts k")
    ax.set_ylabel(f"mean acceptance at depth {depth}")
    ax.set_title(f"Depth {depth} ({_where(ps)})", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    return ax


def plot_tokens_vs_L(summary, *, k: int = 1, positions: str | None = None, ax=None):
    r"""Expected tokens per target call against the draft length ``L``, per scheme, at ``k`` drafts.

    .. math::

        \widehat{\text{tpc}}(f, k, L), \qquad L = 1, \dots, L_{\max}.

    Parameters
    ----------
    summary : ProfileSummary
    k : int, keyword-only
        Number of drafts (single-draft schemes exist at ``k = 1`` only).
    positions : {"all", "subsample"} or None, keyword-only
        The position set (:func:`position_set`).
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        No scheme profiled at ``k`` drafts.
    """
    ax = _axes(ax)
    ps = position_set(summary, positions)
    fams = list(dict.fromkeys(f for f, kk, _ in ps.tokens_per_call if kk == k))
    if not fams:
        raise ValueError(f"`k` must be a profiled number of drafts, got {k}")
    Ls_all = set()
    for f in fams:
        Ls = sorted(L for ff, kk, L in ps.tokens_per_call if ff == f and kk == k)
        Ls_all.update(Ls)
        _errorbar(ax, Ls, [ps.tokens_per_call[(f, k, L)] for L in Ls], marker="o", ms=4,
                  ls="--" if not get_verifier(f).lossless else "-", label=f)
    _integer_axis(ax.xaxis, Ls_all)
    ax.set_xlabel("draft length L")
    ax.set_ylabel("tokens per target call")
    ax.set_title(f"k = {k} ({_where(ps)})", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    return ax


def plot_speedup(summary, *, family: str = "optimal", positions: str | None = None, ax=None):
    r"""Predicted wall-clock speed-up over the grid ``(k, L)`` for one scheme (a heat map, its best cell framed).

    .. math::

        \widehat S(k, L) = \frac{\widehat{\text{tpc}}(k, L)\, t_{\text{plain}}}{t(k, L)}
        \quad\text{(1: as fast as plain decoding).}

    Parameters
    ----------
    summary : ProfileSummary
    family : str, keyword-only
    positions : {"all", "subsample"} or None, keyword-only
        The position set (:func:`position_set`).
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        ``family`` not profiled.
    """
    from matplotlib.patches import Rectangle

    ax = _axes(ax)
    ps = position_set(summary, positions)
    cells = {(k, L): e.value for (f, k, L), e in ps.speedup.items() if f == family}
    if not cells:
        raise ValueError(unknown_name_message("family", family, sorted({f for f, _, _ in ps.speedup}),
                                              note=" (the schemes profiled on these positions)"))
    ks = sorted({k for k, _ in cells})
    Ls = sorted({L for _, L in cells})
    Z = np.array([[cells.get((k, L), np.nan) for L in Ls] for k in ks])
    im = ax.imshow(Z, origin="lower", cmap="RdYlGn", vmin=min(0.5, np.nanmin(Z)), vmax=max(1.5, np.nanmax(Z)),
                   aspect="auto")
    for a in range(len(ks)):
        for b in range(len(Ls)):
            if np.isfinite(Z[a, b]):
                ax.text(b, a, f"{Z[a, b]:.2f}", ha="center", va="center", color="black", fontsize=8)
    a, b = np.unravel_index(np.nanargmax(Z), Z.shape)
    ax.add_patch(Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False, lw=2, ec="black"))
    ax.set_xticks(range(len(Ls)), [str(L) for L in Ls])
    ax.set_yticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("draft length L")
    ax.set_ylabel("drafts k")
    ax.set_title(f"{family}: best k = {ks[a]}, L = {Ls[b]}", fontsize=9)
    ax.figure.colorbar(im, ax=ax, label="speed-up (1 = plain)")
    return ax
