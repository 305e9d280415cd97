r"""Figures of a profile summary (matplotlib, imported lazily; every function takes ``ax=None`` and returns the axes).

Every figure draws the estimates of one set of positions (:attr:`ProfileSummary.sets`), named in its
title, so that no curve is set beside another computed on other positions: by default the set on which
every profiled scheme was computed.
"""

from __future__ import annotations

import numpy as np

from .._registry import get_verifier, unknown_name_message

__all__ = ["plot_acceptance_vs_k", "plot_tokens_vs_L", "plot_speedup", "position_set", "plot_tree_tokens",
           "plot_tree_speedup", "plot_chosen_tree", "family_styles", "chosen_tree_size", "TREE_POSITIONS"]


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6, 4))
    return ax


def position_set(summary, positions: str | None = None):
    """The :class:`PositionSet` a figure draws: ``positions`` by name, or (None) the one the recommendation ranks
    (:attr:`ProfileSummary.recommendation`: the subsample when it holds enough positions to rank every scheme,
    else every profiled position), so that a figure shows what the report's answer rests on.

    Raises
    ------
    ValueError
        ``positions`` names no set of the summary.
    """
    sets = summary.sets
    if positions is None:
        rec = summary.recommendation
        positions = next((name for name, ps in sets.items() if rec is not None and ps.recommendation is rec),
                         "all" if "all" in sets else next(iter(sets), "all"))
    if positions not in sets:
        raise ValueError(unknown_name_message("positions", positions, tuple(sets)))
    return sets[positions]


def _where(ps, summary=None) -> str:
    every = summary is not None and summary.settings.get("subsample") == 1
    return f"{ps.positions} positions" + ("" if ps.name == "all" or every else " of the subsample")


def _errorbar(ax, x, est, **style):
    y = np.array([e.value for e in est])
    err = np.array([[e.value - e.lo for e in est], [e.hi - e.value for e in est]])
    ax.errorbar(x, y, yerr=np.clip(np.nan_to_num(err), 0, None), capsize=2, **style)


def _legend_outside(ax, **kw):
    """The legend right of the axes (it never covers a point); the figure is saved with a tight bounding box."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False, **kw)


def _integer_axis(axis, values):
    values = sorted(set(int(v) for v in values))
    axis.set_ticks(values, [str(v) for v in values])


def _log_node_axis(ax):
    """The logarithmic axis of draft nodes labelled with plain integers (powers of 2 and the largest size), not
    matplotlib's ``2 x 10^0`` minor labels, which overlap below one decade."""
    from matplotlib.ticker import NullFormatter

    xs = [float(x) for ln in ax.get_lines() for x in np.atleast_1d(ln.get_xdata())]
    xs += [float(c.lines[0].get_xdata()[0]) for c in ax.containers if c.lines and c.lines[0] is not None]
    xs = [x for x in xs if np.isfinite(x) and x >= 1]
    if not xs:
        return
    lo, hi = int(min(xs)), int(max(xs))
    ticks = [1 << e for e in range(hi.bit_length()) if lo <= 1 << e <= hi] or [lo]
    if hi / ticks[-1] >= 1.25:
        ticks.append(hi)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


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
    styles = family_styles(names)
    for name in names:
        ks = sorted(k for v, k, j in ps.acceptance if v == name and j == depth)
        ks_all.update(ks)
        est = [ps.acceptance[(name, k, depth)] for k in ks]
        marker, color = styles[name]
        if name == "optimal":
            style = dict(color="black", lw=2.5, zorder=1, label="alpha_k: ceiling of k i.i.d. drafts")
        elif get_verifier(name).draft_process != "iid":
            style = dict(marker=marker, color=color, ms=4, ls="--", label=f"{name} (own draft process)")
        else:
            style = dict(marker=marker, color=color, ms=4, label=name)
        _errorbar(ax, ks, est, **style)
    _integer_axis(ax.xaxis, ks_all)
    ax.set_xlabel("drafts k")
    ax.set_ylabel(f"mean acceptance at depth {depth}")
    ax.set_title(f"Depth {depth} ({_where(ps, summary)})", fontsize=9)
    _legend_outside(ax)
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
    styles = family_styles(list(dict.fromkeys(f for f, _, _ in ps.tokens_per_call)))
    for f in fams:
        Ls = sorted(L for ff, kk, L in ps.tokens_per_call if ff == f and kk == k)
        Ls_all.update(Ls)
        _errorbar(ax, Ls, [ps.tokens_per_call[(f, k, L)] for L in Ls], marker=styles[f][0], color=styles[f][1],
                  ms=4, ls="--" if not get_verifier(f).lossless else "-", label=f)
    _integer_axis(ax.xaxis, Ls_all)
    ax.set_xlabel("draft length L")
    ax.set_ylabel("tokens per target call")
    ax.set_title(f"k = {k} ({_where(ps, summary)})", fontsize=9)
    _legend_outside(ax)
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


# --------------------------------------------------------------------------- draft trees
_MARKERS = ("o", "D", "s", "^", "v", "P", "X", "*", "<", ">", "h", "p", "d", "H", "8")
#: The position sets of the tree figures: every profiled position, or the held-out (odd-indexed) prompts.
TREE_POSITIONS = ("all", "held out")


def family_styles(names) -> dict:
    """One marker and one colour per family, ``name -> (marker, colour)``: no two families share both (the
    first fifteen share neither a marker nor, up to ten, a colour)."""
    out = {}
    for i, name in enumerate(names):
        out[name] = (_MARKERS[i % len(_MARKERS)], f"C{i % 10}")
    return out


def _trees_of(summary):
    ts = getattr(summary, "trees", None)
    if ts is None:
        raise ValueError("`summary` holds no draft trees: profile with `trees=` (or `tree_universe=`)")
    return ts


def _tree_points(summary, which: str, positions: str) -> dict:
    """``name -> Estimate`` of every tree family on one position set."""
    ts = _trees_of(summary)
    if positions not in TREE_POSITIONS:
        raise ValueError(unknown_name_message("positions", positions, TREE_POSITIONS))
    if positions == "all":
        return dict(ts.tokens_per_call if which == "tokens" else ts.speedup)
    ch = ts.choice
    if ch is None:
        raise ValueError(f"`positions`={positions!r} needs the held-out choice: {ts.note or 'none was made'}")
    return dict(ch.heldout if which == "tokens" else ch.heldout_speedup)


def tree_positions_title(summary, positions: str) -> str:
    """The words naming a tree figure's positions, for its title."""
    ts = _trees_of(summary)
    if positions == "all":
        return f"all {ts.positions} profiled positions"
    ch = ts.choice
    return f"{ch.positions[1]} held-out positions ({ch.evaluate_prompts} odd-indexed prompts)"


def _plot_trees(summary, which: str, positions: str, ax):
    ts = _trees_of(summary)
    est = _tree_points(summary, which, positions)
    styles = family_styles(list(ts.families))
    for name, e in est.items():
        fam = ts.families[name]
        marker, color = styles[name]
        ax.errorbar([fam["n"]], [e.value], yerr=[[max(e.value - e.lo, 0)], [max(e.hi - e.value, 0)]], fmt=marker,
                    color=color, ms=6, capsize=2, label=name)
    if positions == "all":
        chains = ts.chains if which == "tokens" else ts.chains_speedup
        best: dict = {}
        for (f, k, L), e in chains.items():
            if get_verifier(f).lossless and (k * L not in best or e.value > best[k * L][1].value):
                best[k * L] = ((f, k, L), e)
        if best:
            xs = sorted(best)
            ax.plot(xs, [best[x][1].value for x in xs], ls=":", marker=".", color="gray",
                    label="best (k, L) scheme, k L nodes")
    ch = ts.choice
    if positions == "held out" and ch.static:
        xs = [s.n for s in ch.static]
        pick = [s.tokens_per_call if which == "tokens" else s.speedup for s in ch.static]
        ax.plot(xs, [e.value for e in pick], color="black", lw=1.2, label="best static top-k shape of each size")
        ax.fill_between(xs, [e.lo for e in pick], [e.hi for e in pick], color="gray", alpha=0.25, lw=0)
    if positions == "held out" and which == "tokens":
        seq = [s for s in ch.sequoia if s.tokens_per_call is not None]
        if seq:
            ax.plot([s.n for s in seq], [s.tokens_per_call.value for s in seq], color="black", lw=1, ls="--",
                    label="Sequoia's shape, measured")
    ax.set_xscale("log")
    _log_node_axis(ax)
    ax.set_xlabel("draft nodes n")
    ax.set_ylabel("tokens per target call" if which == "tokens" else "speed-up over plain decoding")
    if which == "speedup":
        ax.axhline(1.0, color="black", lw=0.8)
    _legend_outside(ax)
    return ax


def plot_tree_tokens(summary, *, positions: str = "all", ax=None):
    r"""Tokens per target call against the tree size, per draft-tree family, on one set of positions.

    .. math::

        \widehat{\text{tpc}}(T) = 1 + \overline{\mathbb E[\tau \mid T]} \quad\text{against } n(T),

    each family at its number of draft nodes (95 % intervals over prompts; one marker and colour per
    family). On ``"all"`` profiled positions, beside the best ``(k, L)`` scheme at ``k L`` nodes; on the
    ``"held out"`` positions (the odd-indexed prompts), beside the best static top-k shape of every size and
    Sequoia's shape (both chosen on the even-indexed prompts), so that a family and the shapes it is compared
    with rest on the same positions.

    Parameters
    ----------
    summary : ProfileSummary
        Of a run with ``trees``.
    positions : {"all", "held out"}, keyword-only
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        The run profiled no draft tree; ``positions`` unknown, or ``"held out"`` without a choice.
    """
    ax = _axes(ax)
    _plot_trees(summary, "tokens", positions, ax)
    ax.set_title(f"Tokens per call against tree size,\non {tree_positions_title(summary, positions)}", fontsize=9)
    return ax


def plot_tree_speedup(summary, *, positions: str = "all", ax=None):
    r"""Predicted speed-up over plain decoding against the tree size, per draft-tree family, on one set of positions.

    .. math::

        \widehat S(T) = \frac{\widehat{\text{tpc}}(T)\ t_{\text{plain}}}
        {\sum_{d < D} t_{\text{draft}}(r_d) + t_{\text{tree}}(n)},

    with the run's measured seconds of the target scoring ``n`` nodes and of the draft stepping the ``r_d``
    nodes of depth ``d`` that get children.

    Parameters
    ----------
    summary : ProfileSummary
    positions : {"all", "held out"}, keyword-only
        As in :func:`plot_tree_tokens`.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        The run profiled no draft tree; ``positions`` unknown, or ``"held out"`` without a choice.
    """
    ax = _axes(ax)
    _plot_trees(summary, "speedup", positions, ax)
    ax.set_title(f"Predicted speed-up against tree size,\non {tree_positions_title(summary, positions)}",
                 fontsize=9)
    return ax


def _layout(shape):
    """x of every node (leaves in depth-first order, a parent above the middle of its children), y = -depth."""
    x = np.zeros(shape.n + 1)
    nxt = [0.0]

    def place(v):
        kids = shape.children(v)
        if not kids:
            x[v] = nxt[0]
            nxt[0] += 1.0
            return
        for c in kids:
            place(c)
        x[v] = 0.5 * (x[kids[0]] + x[kids[-1]])

    place(0)
    return x, -shape.depth.astype(float)


#: Font size (points) of the chosen tree's node labels, and the width (inches) given to each of its leaves.
LABEL_POINTS = 7
LEAF_INCHES = 0.62


def _chosen(summary, n):
    ch = _trees_of(summary).choice
    if ch is None or not ch.static:
        raise ValueError("`summary` holds no chosen shape: profile with a top-k universe (`tree_universe=` or a "
                         "'topk' family) on prompts of both parities")
    if n is None:
        return ch.fastest
    if not 1 <= n <= len(ch.static):
        raise ValueError(f"`n` must be a node budget in [1, {len(ch.static)}], got {n}")
    return ch.static[n - 1]


def chosen_tree_size(summary, *, n: int | None = None) -> tuple:
    """The figure size (inches) at which every node label of :func:`plot_chosen_tree` is readable: a leaf's
    label (``rank: value`` at :data:`LABEL_POINTS` points) gets :data:`LEAF_INCHES`, a level 0.9 inch."""
    shape = _chosen(summary, n).shape
    return (max(6.4, LEAF_INCHES * len(shape.leaves) + 2.4), max(3.6, 0.9 * shape.max_depth + 1.6))


def plot_chosen_tree(summary, *, n: int | None = None, ax=None):
    r"""The chosen static top-k tree, each node drawn with its mean acceptance on the held-out prompts.

    .. math::

        \bar Q(v) = \frac{1}{\#\text{evaluate}} \sum_{t} Q_t(x_t(v)),

    the probability that a target sample passes through node ``v`` (every node labelled ``rank: value``); by
    default the device-aware choice (the largest predicted speed-up on the choosing half). Without ``ax`` the
    figure is sized so that every label is readable (:func:`chosen_tree_size`).

    Parameters
    ----------
    summary : ProfileSummary
    n : int or None, keyword-only
        The node budget whose best static shape to draw (None: the device-aware choice).
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        No choice was made (no universe, or prompts of one parity only), or ``n`` outside the budgets.
    """
    st = _chosen(summary, n)
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=chosen_tree_size(summary, n=n))
    shape = st.shape
    x, y = _layout(shape)
    vals = np.array((1.0,) + tuple(st.node_values))
    for v in range(1, shape.n + 1):
        p = int(shape.parents[v])
        ax.plot([x[p], x[v]], [y[p], y[v]], color="gray", lw=0.8, zorder=1)
    sc = ax.scatter(x[1:], y[1:], c=vals[1:], cmap="viridis", vmin=0.0, vmax=max(float(vals[1:].max()), 1e-12),
                    s=60, zorder=2, edgecolors="black", linewidths=0.5)
    ax.scatter([x[0]], [y[0]], marker="s", color="black", s=40, zorder=2)
    for v in range(1, shape.n + 1):  # every node labelled: the figure is sized to its leaves (chosen_tree_size)
        ax.annotate(f"{shape.ranks[v]}: {vals[v]:.2f}", (x[v], y[v]), textcoords="offset points", xytext=(0, -12),
                    ha="center", va="top", fontsize=LABEL_POINTS,
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.85))
    ax.set_xlim(-0.6, max(float(x.max()), 0.0) + 0.6)
    ax.set_ylim(float(y.min()) - 0.6, 0.4)
    ax.figure.colorbar(sc, ax=ax, label="mean acceptance (held out)", fraction=0.03, pad=0.01)
    ax.set_yticks(sorted(set(y.tolist())), [str(int(-d)) for d in sorted(set(y.tolist()))])
    ax.set_ylabel("depth")
    ax.set_xticks([])
    ax.set_title(f"n = {st.n}: {st.tokens_per_call.value:.3f} tokens per call, speed-up {st.speedup.value:.2f} "
                 "(held out)\nlabels: rank: mean acceptance", fontsize=8)
    return ax
