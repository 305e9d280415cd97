r"""Figures of a profile summary (matplotlib, imported lazily; every function takes ``ax=None`` and returns the axes)."""

from __future__ import annotations

import numpy as np

__all__ = ["plot_acceptance_vs_k", "plot_tokens_vs_L", "plot_speedup"]


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6, 4))
    return ax


def plot_acceptance_vs_k(summary, *, depth: int = 1, ax=None):
    r"""Mean exact acceptance at one depth against ``k``, per verifier, under the :math:`\alpha_k` ceiling.

    .. math::

        \bar a_j(k) = \frac{1}{N} \sum_{t} P\big(Y \in S(X_{1..k})\big)_t \ \le\ \overline{\alpha_k}.

    Parameters
    ----------
    summary : ProfileSummary
    depth : int, keyword-only
        The depth ``j`` (1: the first drafted token).
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        ``depth`` not profiled.
    """
    ax = _axes(ax)
    names = list(dict.fromkeys(v for v, _, j in summary.acceptance if j == depth))
    if not names:
        raise ValueError(f"`depth` must be a profiled depth, got {depth}")
    for name in names:
        ks = sorted(k for v, k, j in summary.acceptance if v == name and j == depth)
        est = [summary.acceptance[(name, k, depth)] for k in ks]
        y = np.array([e.value for e in est])
        err = np.array([[e.value - e.lo for e in est], [e.hi - e.value for e in est]])
        style = dict(color="black", lw=2.5, zorder=1, label="optimal (alpha_k ceiling)") if name == "optimal" else dict(
            marker="o", ms=4, label=name)
        ax.errorbar(ks, y, yerr=err, capsize=2, **style)
    ax.set_xlabel("drafts k")
    ax.set_ylabel(f"mean acceptance at depth {depth}")
    ax.set_title("Acceptance against k (95 % intervals over prompts)")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_tokens_vs_L(summary, *, k: int = 1, ax=None):
    r"""Expected tokens per target call against the draft length ``L``, per scheme, at ``k`` drafts.

    .. math::

        \widehat{\text{tpc}}(f, k, L), \qquad L = 1, \dots, L_{\max}.

    Parameters
    ----------
    summary : ProfileSummary
    k : int, keyword-only
        Number of drafts (single-draft schemes are drawn at ``k = 1`` only).
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes
    """
    ax = _axes(ax)
    fams = list(dict.fromkeys(f for f, kk, _ in summary.tokens_per_call if kk == k))
    for f in fams:
        Ls = sorted(L for ff, kk, L in summary.tokens_per_call if ff == f and kk == k)
        est = [summary.tokens_per_call[(f, k, L)] for L in Ls]
        ax.errorbar(Ls, [e.value for e in est], yerr=[[e.value - e.lo for e in est], [e.hi - e.value for e in est]],
                    marker="o", ms=4, capsize=2, label=f)
    ax.set_xlabel("draft length L")
    ax.set_ylabel("tokens per target call")
    ax.set_title(f"Tokens per call, k = {k}")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_speedup(summary, *, family: str = "optimal", ax=None):
    r"""Predicted wall-clock speed-up over the grid ``(k, L)`` for one scheme (a heat map).

    .. math::

        \widehat S(k, L) = \frac{\widehat{\text{tpc}}(k, L)}{L c + s}.

    Parameters
    ----------
    summary : ProfileSummary
    family : str, keyword-only
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        ``family`` not profiled.
    """
    ax = _axes(ax)
    cells = {(k, L): v for (f, k, L), v in summary.speedup.items() if f == family}
    if not cells:
        fams = sorted({f for f, _, _ in summary.speedup})
        raise ValueError(f"`family` must be one of the profiled schemes {fams}, got {family!r}")
    ks = sorted({k for k, _ in cells})
    Ls = sorted({L for _, L in cells})
    Z = np.array([[cells.get((k, L), np.nan) for L in Ls] for k in ks])
    im = ax.imshow(Z, origin="lower", cmap="viridis", aspect="auto")
    for a in range(len(ks)):
        for b in range(len(Ls)):
            if np.isfinite(Z[a, b]):
                ax.text(b, a, f"{Z[a, b]:.2f}", ha="center", va="center", color="white", fontsize=8)
    ax.set_xticks(range(len(Ls)), [str(L) for L in Ls])
    ax.set_yticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("draft length L")
    ax.set_ylabel("drafts k")
    ax.set_title(f"Predicted speed-up, {family} (draft cost c = {summary.draft_cost:.2f})")
    ax.figure.colorbar(im, ax=ax)
    return ax
