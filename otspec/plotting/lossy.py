r"""Figures for lossy verification and the economics of speculative decoding.

* :func:`plot_lossy_frontier`: the KL-optimal acceptance (mentored decoding)
  against :math:`\mathrm{KL}(q \| \pi)`, with Leviathan et al.'s lenience curve
  on the same axes.
* :func:`plot_expected_tokens`: Leviathan et al.'s Figure 2.
* :func:`plot_optimal_gamma`: Leviathan et al.'s Figure 3.
* :func:`synthetic_llm_pair`: the fixed LLM-like (draft, target) pair used by
  the reproduction (softmax of Gaussian logits with a perturbed draft). The
  reproduction also draws the frontier on real SmolLM2 next-token pairs from
  the decoding adapter (``experiments/real_pair_dists.py``).

matplotlib is imported inside each plotting function; ``import otspec`` never
imports it. Notation: ``p`` is the draft, ``q`` the target (Leviathan et al.
swap the letters).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._validation import as_rng, validate_bool, validate_pair, validate_positive_int, validate_size
from ..lossy._ensemble import ensemble_verifier
from ..lossy._lenience import lenience_curve
from ..lossy._mentored import mentored_frontier
from ..lossy._typical import typical_acceptance_verifier
from ..speculative import expected_tokens, optimal_gamma, walltime_improvement
from ._common import MAX_CURVE_POINTS, grid_array, grid_items, legend_outside, new_axes, reject_axes

#: Largest vocabulary of :func:`synthetic_llm_pair` (four float64 arrays of ``n`` entries: 128 MiB); real
#: vocabularies are below 2**18.
MAX_SYNTHETIC_VOCAB = 2**22


__all__ = ["plot_lossy_frontier", "plot_lossy_rules", "plot_expected_tokens", "plot_optimal_gamma", "synthetic_llm_pair"]


def _finite_real(x, name: str) -> float:
    """A finite real number (no bool, text or None) as a float, refused naming ``name``."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"`{name}` must be a finite real number, got {type(x).__name__}")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"`{name}` must be a finite real number, got {v!r}")
    return v


def synthetic_llm_pair(n: int = 1000, *, sigma: float = 3.0, perturbation: float = 1.0, rng=0):
    r"""A fixed LLM-like (draft, target) pair: softmax of Gaussian logits, the draft perturbed.

    .. math::

        q = \mathrm{softmax}(\sigma z), \qquad p = \mathrm{softmax}(\sigma z + \tau \varepsilon),
        \qquad z, \varepsilon \sim \mathcal N(0, I_n),

    with :math:`\sigma` = ``sigma`` and :math:`\tau` = ``perturbation``. Heavy
    head, long tail, like next-token distributions; with the defaults
    :math:`\sum_x \min(p, q) \approx 0.52` and :math:`\mathrm{KL}(q \| p) \approx 0.70`. Real-model pairs come from the
    decoding adapter (``experiments/real_pair_dists.py``).

    Parameters
    ----------
    n : int
        Vocabulary size, at most :data:`MAX_SYNTHETIC_VOCAB` (2**22).
    sigma : float, keyword-only
        Logit scale (temperature inverse).
    perturbation : float, keyword-only
        Standard deviation of the draft's logit noise.
    rng : numpy.random.Generator, int or None, keyword-only
        Seed or generator (default 0: a fixed pair).

    Returns
    -------
    p, q : (n,) ndarray of float64
        Draft and target.

    Raises
    ------
    ValueError
        ``n < 1`` or above :data:`MAX_SYNTHETIC_VOCAB`; ``sigma`` or ``perturbation`` not finite, or so large
        that the logits overflow.
    TypeError
        A non-integer ``n``, a ``sigma`` / ``perturbation`` that is no real number, or a bad ``rng``.

    Examples
    --------
    >>> from otspec.plotting.lossy import synthetic_llm_pair
    >>> p, q = synthetic_llm_pair(50)
    >>> p.shape, bool(abs(p.sum() - 1) < 1e-12 and abs(q.sum() - 1) < 1e-12)
    ((50,), True)
    """
    n = validate_size(n, "n", cap=MAX_SYNTHETIC_VOCAB, cap_name="MAX_SYNTHETIC_VOCAB",
                      hint="draw a smaller vocabulary")
    sigma = _finite_real(sigma, "sigma")
    perturbation = _finite_real(perturbation, "perturbation")
    gen = as_rng(rng)
    z = gen.standard_normal(n)
    eps = gen.standard_normal(n)

    def softmax(v):
        with np.errstate(over="ignore"):  # v - max <= 0: an overflow is -inf, whose exp is the 0 it rounds to anyway
            w = np.exp(v - v.max())
        return w / w.sum()

    with np.errstate(over="ignore", invalid="ignore"):
        target, draft = sigma * z, sigma * z + perturbation * eps
    if not (np.all(np.isfinite(target)) and np.all(np.isfinite(draft))):
        raise ValueError(f"`sigma` = {sigma!r} and `perturbation` = {perturbation!r} overflow the logits (above "
                         "1.8e308); take smaller scales")
    return softmax(draft), softmax(target)


def plot_lossy_frontier(p, q, *, ls=None, n_points: int = 200, d_max=None, ax=None, title=None):
    r"""Acceptance against :math:`\mathrm{KL}(q \| \pi)`: mentored decoding's frontier and lenience.

    .. math::

        D \mapsto R^*(D) = \max\{\textstyle\sum_i p_i r_i : \mathrm{KL}(q \| \pi) \le D\}
        \quad\text{and}\quad l \mapsto \big(\mathrm{KL}(q \| \pi_l), \textstyle\sum_x \min(q/l, p)\big).

    Every lenience point lies on or below the frontier (mentored decoding is
    KL-optimal); for a Bernoulli pair it lies on it.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    ls : (m,) array_like of float, keyword-only
        Lenience values in ``(0, 1]`` (default: 50 values from 0.02 to 1, evenly spaced).
    n_points : int, keyword-only
        Budgets on the frontier.
    d_max : float, keyword-only
        Largest budget shown (default: just beyond ``KL(q || p)``, or the
        largest finite lenience KL when that is infinite).
    ax : matplotlib Axes, optional
        Axes to draw on (a new figure otherwise).
    title : str, optional
        Axes title.

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        ``p`` or ``q`` not distributions of one length, lenience values outside
        ``(0, 1]``, ``n_points < 1``.
    TypeError
        ``p`` given a matplotlib Axes (pass it as ``ax=``).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.lossy import plot_lossy_frontier
    >>> ax = plot_lossy_frontier([0.75, 0.25], [0.25, 0.75], n_points=5)
    >>> ax.get_xlabel()
    '$\\mathrm{KL}(q\\,\\|\\,\\pi)$ (nats)'
    """
    reject_axes(p, "p")
    p_, q_ = validate_pair(p, q, normalizable=False)
    n_points = validate_size(n_points, "n_points", cap=MAX_CURVE_POINTS, cap_name="MAX_CURVE_POINTS",
                             hint="plot fewer points")
    ls_ = np.linspace(0.02, 1.0, 50) if ls is None else np.asarray(grid_array(ls, "ls"), dtype=np.float64)
    lc = lenience_curve(p_, q_, ls_)
    fr0 = mentored_frontier(p_, q_, [0.0])
    if d_max is None:
        if math.isfinite(fr0.kl_qp) and fr0.kl_qp > 0:
            d_max = 1.05 * fr0.kl_qp
        else:
            finite = lc.kl[np.isfinite(lc.kl)]
            d_max = 1.05 * float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    Ds = np.linspace(0.0, float(d_max), n_points)
    fr = mentored_frontier(p_, q_, Ds)
    ax = new_axes(ax, (6.8, 4))
    ax.plot(fr.D, fr.acceptance, color="C0", lw=2, label="mentored decoding (KL-optimal)")
    keep = np.isfinite(lc.kl) & (lc.kl <= d_max)
    ax.plot(lc.kl[keep], lc.acceptance[keep], "o", ms=4, color="C3", label="lenience $l$ (Leviathan A.5)")
    ax.plot([0.0], [fr.acceptance0], "k*", ms=10, label="speculative sampling ($D=0$, $l=1$)")
    if math.isfinite(fr.kl_qp) and fr.kl_qp <= d_max:
        ax.axvline(fr.kl_qp, color="0.6", ls=":", lw=1, label=r"$\mathrm{KL}(q\,\|\,p)$: $R=1$")
    ax.set_xlabel(r"$\mathrm{KL}(q\,\|\,\pi)$ (nats)")
    ax.set_ylabel("acceptance $P(Y = X)$")
    ax.set_ylim(min(fr.acceptance0, float(lc.acceptance[keep].min()) if keep.any() else 1.0) - 0.02, 1.01)
    ax.grid(alpha=0.3)
    legend_outside(ax, [(None, ax.get_legend_handles_labels()[0])])
    if title:
        ax.set_title(title)
    return ax


def plot_expected_tokens(gammas=(1, 2, 3, 5, 7, 10), *, include_limit: bool = True, ax=None):
    r"""Expected tokens per target call against :math:`\alpha` for several :math:`\gamma` (Leviathan Fig. 2).

    .. math::

        \alpha \mapsto \frac{1 - \alpha^{\gamma+1}}{1 - \alpha},
        \qquad \gamma \to \infty: \frac{1}{1 - \alpha}.

    Parameters
    ----------
    gammas : sequence of int
        Numbers of drafts, each ``>= 1``.
    include_limit : bool, keyword-only
        Also draw the :math:`\gamma = \infty` curve (clipped at the top).
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        A ``gamma`` below 1.
    TypeError
        ``gammas`` given a matplotlib Axes (pass it as ``ax=``).

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding",
       arXiv:2211.17192, Section 3.1, Figure 2 (their :math:`\alpha` and :math:`\gamma`).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.lossy import plot_expected_tokens
    >>> ax = plot_expected_tokens(gammas=(1, 3))
    >>> round(float(ax.lines[1].get_ydata()[200]), 6)          # gamma = 3 at alpha = 0.5
    1.875
    """
    reject_axes(gammas, "gammas")
    gammas = [validate_positive_int(g, "gammas") for g in grid_items(gammas, "gammas")]
    if not gammas:
        raise ValueError("`gammas` must hold at least one number of drafts, got none")
    include_limit = validate_bool(include_limit, "include_limit")
    ax = new_axes(ax, (5.5, 4))
    alpha = np.linspace(0.0, 1.0, 401)
    for i, g in enumerate(gammas):
        ax.plot(alpha, expected_tokens(alpha, g), color=f"C{i}", label=rf"$\gamma = {g}$")
    top = max(gammas) + 1
    if include_limit:
        a = alpha[alpha < 1 - 1 / (top + 1)]
        ax.plot(a, 1 / (1 - a), "k--", lw=1, label=r"$\gamma = \infty$")
    ax.set_xlabel(r"$\alpha$ (expected acceptance per token)")
    ax.set_ylabel("expected tokens per target call")
    ax.set_xlim(0, 1)
    ax.set_ylim(1, top + 0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_optimal_gamma(cs=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5), *, max_gamma: int = 1000, ax=None):
    r"""The walltime-optimal number of drafts against :math:`\alpha` for several costs :math:`c` (Leviathan Fig. 3).

    .. math::

        \gamma^*(\alpha, c) = \arg\max_{\gamma \ge 1}
        \frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)},

    drawn only where speculative decoding helps (:math:`\alpha > c`).

    Parameters
    ----------
    cs : sequence of float
        Cost coefficients, each ``>= 0``.
    max_gamma : int, keyword-only
        Cap passed to :func:`otspec.speculative.optimal_gamma`.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        A cost below 0 or ``max_gamma < 1``.
    TypeError
        ``cs`` given a matplotlib Axes (pass it as ``ax=``).

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding",
       arXiv:2211.17192, Section 3.5, Figure 3.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.lossy import plot_optimal_gamma
    >>> ax = plot_optimal_gamma(cs=(0.05,))
    >>> ax.get_yscale()
    'log'
    """
    reject_axes(cs, "cs")
    cs = [_finite_real(c, "cs") for c in grid_items(cs, "cs")]  # no text read by float()
    ax = new_axes(ax, (5.5, 4))
    alpha = np.linspace(0.0, 0.99, 397)
    for i, c in enumerate(cs):
        g = optimal_gamma(alpha, float(c), max_gamma=max_gamma)
        helps = walltime_improvement(alpha, g, float(c)) > 1
        ax.step(alpha[helps], g[helps], where="mid", color=f"C{i}", label=rf"$c = {float(c):g}$")
    ax.set_yscale("log")
    ax.set_xlabel(r"$\alpha$ (expected acceptance per token)")
    ax.set_ylabel(r"optimal $\gamma$")
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    return ax


def _off_scale_column(ax, d_max: float, points) -> None:
    """Points whose KL is infinite (or beyond ``d_max``) in a column right of a break, never at a finite KL.

    The column and the break are placed in axes coordinates (x) and data coordinates (y): the
    numeric ticks stop at ``d_max``, a dashed line marks the break, and each point is a right-pointing
    triangle at the "∞" tick, labelled with its KL.
    """
    import matplotlib.transforms as mtransforms
    from matplotlib.ticker import FixedLocator

    lo, hi = -0.02 * d_max, 1.17 * d_max
    ax.set_xlim(lo, hi)
    ticks = [t for t in ax.get_xticks() if 0.0 <= t <= d_max + 1e-12]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    frac = lambda x: (x - lo) / (hi - lo)  # noqa: E731 - data x to axes fraction at these limits
    col, brk = frac(1.11 * d_max), frac(1.05 * d_max)
    ax.plot([brk, brk], [0.0, 1.0], transform=ax.transAxes, color="0.5", linestyle=(0, (4, 3)), linewidth=0.8)
    ax.annotate(r"$\infty$", xy=(col, 0.0), xycoords="axes fraction", xytext=(0, -4), textcoords="offset points",
                ha="center", va="top", fontsize=11)
    edge = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)  # x: axes fraction, y: data
    for acc, kl, label in points:
        what = r"KL = $\infty$" if not math.isfinite(kl) else f"KL = {kl:.3g}, off scale"
        ax.plot([col], [acc], ">", ms=8, color="C4", transform=edge, clip_on=False, label=f"{label}, {what}")
        ax.annotate(what, xy=(col, acc), xycoords=edge, xytext=(0, 7), textcoords="offset points", ha="center",
                    va="bottom", fontsize=8, color="C4")


def plot_lossy_rules(p, q, *, weights=None, ls=None, typical=((0.09, 0.3),), n_points: int = 200, ax=None,
                     title=None):
    r"""Every lossy rule the engines ship on the KL-acceptance plane, against mentored decoding's frontier.

    .. math::

        w \mapsto \big(\mathrm{KL}(q \| w q + (1-w) p),\ 1 - w\,\mathrm{TV}(p, q)\big)
        \quad\text{(transformers' ensemble verification)},

    beside Leviathan et al.'s lenience and vLLM's typical acceptance. A
    typical-acceptance law usually misses target mass, so its
    :math:`\mathrm{KL}(q \| r)` is infinite: such a point is never drawn at a
    finite KL but in a column right of a dashed break, at a tick labelled
    :math:`\infty` (x in axes coordinates), as a right-pointing triangle
    labelled "KL = ∞" beside it and in the legend (a finite KL beyond the
    plotted range says "off scale"). Every finite point lies on or below the
    frontier.

    Parameters
    ----------
    p, q : (n,) array_like of float
        Draft and target distributions.
    weights : array_like of float, keyword-only
        Ensemble weights in [0, 1] (default 21 values from 0 to 1).
    ls : array_like of float, keyword-only
        Lenience values (as in :func:`plot_lossy_frontier`).
    typical : sequence of (epsilon, delta), keyword-only
        Typical-acceptance settings (default: vLLM's 0.09, 0.3).
    n_points : int, keyword-only
        Budgets on the frontier.
    ax : matplotlib Axes, keyword-only
        Axes to draw on (a new figure otherwise).
    title : str, keyword-only
        Axes title.

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        ``p``, ``q`` not distributions of one length; weights, lenience or typical
        settings out of range.
    TypeError
        ``p`` given a matplotlib Axes (pass it as ``ax=``).

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, arXiv:2211.17192, Appendix A.5 (lenience).
    .. [2] Cai et al., "Medusa", arXiv:2401.10774, Section 3.3.1 (typical acceptance).
    .. [3] Wang, Kasa et al., "Relaxed Speculative Decoding via Dynamic Ensemble Verification",
       arXiv:2604.07622 (static ensemble, transformers' ``assistant_ensemble_weight``).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.lossy import plot_lossy_rules
    >>> ax = plot_lossy_rules([0.75, 0.25], [0.25, 0.75], n_points=5)
    >>> ax.get_xlabel()
    '$\\mathrm{KL}(q\\,\\|\\,\\pi)$ (nats)'
    """
    p_, q_ = validate_pair(p, q, normalizable=False)
    ws = np.linspace(0.0, 1.0, 21) if weights is None else np.asarray(grid_array(weights, "weights"),
                                                                       dtype=np.float64)
    ens = [ensemble_verifier(p_, q_, float(w)) for w in ws]
    ens_kl = np.array([v.kl() for v in ens])
    ens_acc = np.array([v.acceptance() for v in ens])
    finite = ens_kl[np.isfinite(ens_kl)]
    fr0 = mentored_frontier(p_, q_, [0.0])
    d_max = 1.05 * (fr0.kl_qp if math.isfinite(fr0.kl_qp) and fr0.kl_qp > 0 else max(finite.max(initial=0.0), 1.0))
    ax = plot_lossy_frontier(p_, q_, ls=ls, n_points=n_points, d_max=d_max, ax=ax, title=title)
    keep = np.isfinite(ens_kl) & (ens_kl <= d_max)
    ax.plot(ens_kl[keep], ens_acc[keep], "s-", ms=3, lw=1, color="C2", label="ensemble $w$ (transformers)")
    lowest = float(ens_acc.min())
    off_scale = []
    for eps, delta in typical:
        v = typical_acceptance_verifier(p_, q_, epsilon=eps, delta=delta)
        acc, kl = v.acceptance(), v.kl()
        lowest = min(lowest, acc)
        label = f"typical $\\epsilon$={eps:g}, $\\delta$={delta:g} (vLLM)"
        if math.isfinite(kl) and kl <= d_max:
            ax.plot([kl], [acc], "D", ms=7, color="C4", label=label)
        else:
            off_scale.append((acc, kl, label))
    if not off_scale:
        ax.set_xlim(-0.02 * d_max, 1.06 * d_max)
    else:
        _off_scale_column(ax, d_max, off_scale)
    ax.set_ylim(min(ax.get_ylim()[0], lowest - 0.02), 1.01)
    ax.legend(fontsize=7, loc="lower center")
    return ax
