r"""Multi-draft token verifiers compared: SpecTr Figures 4, 5, 6 and the conference Figure 3.

Every value is computed by the package's exact functions: OTM-k by
:func:`otspec.alpha_k` (one sort), k-Seq by :meth:`otspec.KSeq.acceptance` at
the exact :math:`\rho^*`, multi-round by :meth:`otspec.MultiRound.acceptance`.
``p`` is the draft, ``q`` the target; ``Ber(b)`` puts mass ``b`` on token 1
(the vector ``[1 - b, b]``), ``U(d)`` is uniform on the first ``d`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import otspec

from .._registry import unknown_name_message
from .._validation import validate_positive_int, validate_probability, validate_size
from ._common import check_cells, grid_items, legend_outside, new_axes, palette, reject_axes

__all__ = [
    "METHODS",
    "AcceptanceCurves",
    "acceptance_curves",
    "bernoulli_pair",
    "uniform_pair",
    "plot_spectr_fig4",
    "plot_spectr_fig5",
    "plot_spectr_fig6",
    "plot_acceptance_vs_b",
]

#: Verifier names understood by :func:`acceptance_curves`.
METHODS = ("otm", "kseq", "multiround", "multiround-wor")
_LABEL = {
    "otm": "OTM-k (optimal)",
    "kseq": "k-Seq",
    "multiround": "multi-round",
    "multiround-wor": "multi-round w/o repl.",
}
_STYLE = {"otm": "-", "kseq": "--", "multiround": ":", "multiround-wor": "-."}
_MARKER = {"otm": "o", "kseq": "s", "multiround": "^", "multiround-wor": "v"}


def bernoulli_pair(p: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """Draft ``Ber(p)`` and target ``Ber(b)`` as vectors ``[1 - p, p]``, ``[1 - b, b]``.

    Parameters
    ----------
    p : float
        Draft's probability of token 1, in [0, 1].
    b : float
        Target's probability of token 1, in [0, 1].

    Returns
    -------
    p, q : (2,) ndarray of float64
        ``[1 - p, p]`` (draft) and ``[1 - b, b]`` (target).

    Raises
    ------
    ValueError
        A probability outside [0, 1].
    TypeError
        A non-numeric argument.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
       Transport", arXiv:2310.15141, Appendix B (the Bernoulli pairs of Figures 4 and 6).

    Examples
    --------
    >>> from otspec.plotting.multidraft import bernoulli_pair
    >>> [v.tolist() for v in bernoulli_pair(0.25, 0.75)]
    [[0.75, 0.25], [0.25, 0.75]]
    """
    p = validate_probability(p, "p")
    b = validate_probability(b, "b")
    return np.array([1.0 - p, p]), np.array([1.0 - b, b])


def uniform_pair(d: int, d_q: int) -> tuple[np.ndarray, np.ndarray]:
    """Draft ``U(d)`` and target ``U(d_q)`` on nested supports (the first tokens), length ``max(d, d_q)``.

    Parameters
    ----------
    d : int
        Draft support size (``>= 1``, at most :data:`MAX_UNIFORM_SUPPORT` = 2**22, as ``d_q``).
    d_q : int
        Target support size (``>= 1``).

    Returns
    -------
    p, q : (max(d, d_q),) ndarray of float64
        ``U(d)`` and ``U(d_q)``, both on the first tokens.

    Raises
    ------
    ValueError
        ``d`` or ``d_q`` below 1.
    TypeError
        A non-integer argument.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
       Transport", arXiv:2310.15141, Appendix B.2 (the uniform pairs of Figure 5).

    Examples
    --------
    >>> from otspec.plotting.multidraft import uniform_pair
    >>> [v.tolist() for v in uniform_pair(4, 2)]
    [[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]]
    """
    hint = "the pair's arrays have max(d, d_q) entries"
    d = validate_size(d, "d", cap=MAX_UNIFORM_SUPPORT, cap_name="MAX_UNIFORM_SUPPORT", hint=hint)
    d_q = validate_size(d_q, "d_q", cap=MAX_UNIFORM_SUPPORT, cap_name="MAX_UNIFORM_SUPPORT", hint=hint)
    n = max(d, d_q)
    p = np.zeros(n)
    q = np.zeros(n)
    p[:d] = 1.0 / d
    q[:d_q] = 1.0 / d_q
    return p, q


#: Largest support size of :func:`uniform_pair` (two float64 arrays of ``max(d, d_q)`` entries: 64 MiB); SpecTr's
#: Figure 5 takes ``d = 120``.
MAX_UNIFORM_SUPPORT = 2**22

#: Largest number of drafts on a curve of :func:`acceptance_curves` (its ``ks`` are an int64 array).
_MAX_K = int(np.iinfo(np.int64).max)


@dataclass(frozen=True, eq=False)
class AcceptanceCurves:
    """Exact acceptances of several verifiers over ``k``.

    Attributes
    ----------
    ks : (m,) ndarray of int
        Numbers of drafts.
    values : dict of str to (m,) ndarray of float64
        ``values[method][j]`` is the exact acceptance at ``ks[j]``.
    """

    ks: np.ndarray
    values: dict


def acceptance_curves(p, q, ks, methods=("otm", "kseq")) -> AcceptanceCurves:
    r"""Exact acceptance :math:`P(Y \in S(X))` of each verifier for each ``k``.

    .. math::

        \alpha_k(p, q), \quad \alpha(\pi^{\text{k-Seq}}_{\rho^*}), \quad
        1 - \prod_{i=1}^k (1 - \beta_i) \ (\text{multi-round}).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    ks : iterable of int
        Numbers of drafts (at most :data:`otspec.lossy.MAX_CURVE_POINTS` of them, each below 2**63).
    methods : sequence of str
        Any of ``"otm"``, ``"kseq"``, ``"multiround"``, ``"multiround-wor"``
        (without replacement; ``k`` beyond the support of ``p`` gives NaN).

    Returns
    -------
    AcceptanceCurves

    Raises
    ------
    ValueError
        Unknown method or invalid inputs.

    Examples
    --------
    >>> from otspec.plotting.multidraft import acceptance_curves
    >>> c = acceptance_curves([0.75, 0.25], [0.25, 0.75], [1, 2], methods=("otm", "multiround"))
    >>> c.values["otm"].tolist(), c.values["multiround"].tolist()
    ([0.5, 0.6875], [0.5, 0.625])
    """
    ks_list = [validate_positive_int(k, "ks") for k in grid_items(ks, "ks")]
    if ks_list and max(ks_list) > _MAX_K:
        raise ValueError(f"`ks` must hold numbers of drafts at most 2**63 - 1 (an int64 array), got {max(ks_list)}")
    ks_arr = np.array(ks_list, dtype=np.int64)
    for m in methods:
        if m not in METHODS:
            raise ValueError(unknown_name_message("methods", m, METHODS, entries=True))
    values = {}
    for m in methods:
        if m == "otm":
            values[m] = np.asarray(otspec.alpha_k(p, q, ks_arr.tolist()), dtype=np.float64)
            continue
        vals = np.empty(ks_arr.shape[0])
        for j, k in enumerate(ks_arr.tolist()):
            if m == "kseq":
                vals[j] = otspec.kseq(p, q, k).acceptance()
            elif m == "multiround":
                vals[j] = otspec.multiround(p, q, k).acceptance()
            else:
                try:
                    vals[j] = otspec.multiround(p, q, k, replacement=False).acceptance()
                except ValueError:
                    vals[j] = np.nan  # k larger than the support of p
        values[m] = vals
    return AcceptanceCurves(ks=ks_arr, values=values)


#: Marker size (points) and horizontal offset step (in units of k) of the Figure 4/6 drawings.
_MS = {"otm": 3.5, "kseq": 6.0, "multiround": 5.0, "multiround-wor": 5.0}
_DODGE = 0.14


def _dodge(i: int, n_series: int) -> float:
    """Horizontal offset of series ``i`` of ``n_series``: symmetric about 0, ``_DODGE`` apart."""
    return (i - (n_series - 1) / 2.0) * _DODGE


def _draw_methods(ax, x, curves, methods, color, i, n_series):
    """Draw one series' methods so that coinciding curves stay readable.

    Thin lines, one style and marker per method (OTM-k solid with small filled dots, k-Seq dashed
    with hollow squares, multi-round dotted with hollow triangles), so that a method drawn on top of
    another one still shows both shapes. Series ``i`` is shifted by :func:`_dodge` along ``k``
    (a few hundredths of a draft), so where several series meet (at acceptance 1) their markers sit
    side by side instead of on top of each other; the values themselves are not moved.
    """
    xs = np.asarray(x, dtype=np.float64) + _dodge(i, n_series)
    for m in methods:
        hollow = m != "otm"
        ax.plot(xs, curves.values[m], linestyle=_STYLE[m], linewidth=1.0, marker=_MARKER[m], markersize=_MS[m],
                markerfacecolor="none" if hollow else color, markeredgecolor=color, markeredgewidth=1.0,
                color=color, zorder=3 if hollow else 2)


def _method_handles(methods):
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="0.3", linestyle=_STYLE[m], linewidth=1.0, marker=_MARKER[m], markersize=_MS[m],
                   markerfacecolor="0.3" if m == "otm" else "none", markeredgecolor="0.3", label=_LABEL[m])
            for m in methods]


def _series_handles(colors, labels):
    from matplotlib.lines import Line2D

    return [Line2D([], [], color=c, linewidth=2, label=lab) for c, lab in zip(colors, labels)]


def _bernoulli_vs_k(ax, p, bs, ks, methods, title):
    reject_axes(p, "p")
    bs = [validate_probability(b, "bs") for b in grid_items(bs, "bs")]
    ks = grid_items(ks, "ks")
    check_cells(len(bs) * len(ks), "len(`bs`) * len(`ks`)")
    ax = new_axes(ax, (7.0, 4.2))
    colors = palette(len(bs))
    for i, b in enumerate(bs):
        pv, qv = bernoulli_pair(p, b)
        curves = acceptance_curves(pv, qv, ks, methods)
        _draw_methods(ax, curves.ks, curves, methods, colors[i], i, len(bs))
    ax.set_xlabel("number of drafts $k$")
    ax.set_ylabel("acceptance probability")
    ax.set_xticks(np.asarray(list(ks)))
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    legend_outside(ax, [("target Ber(b)", _series_handles(colors, [f"b = {b:g}" for b in bs])),
                        ("verifier", _method_handles(methods))])
    return ax


def plot_spectr_fig4(*, p: float = 0.25, bs=(0.1, 0.25, 0.75, 1.0), ks=range(1, 11), ax=None):
    r"""SpecTr Figure 4: OTM-k against k-Seq over ``k`` for ``p = Ber(0.25)``, ``q = Ber(b)``.

    .. math::

        k \mapsto \alpha_k(\mathrm{Ber}(p), \mathrm{Ber}(b)) \ \text{and}\
        \alpha(\pi^{\text{k-Seq}}_{\rho^*}).

    One colour per target ``b``; thin lines, OTM-k solid with small filled
    dots and k-Seq dashed with hollow squares drawn over it, so both shapes
    show where the two coincide. Each ``b`` is shifted along ``k`` by a few
    hundredths of a draft (the values are not moved), so that where several
    curves meet at acceptance 1 their markers sit side by side.

    Parameters
    ----------
    p : float, keyword-only
        Draft probability of token 1.
    bs : sequence of float, keyword-only
        Target probabilities of token 1 (the paper discusses 0.1, 0.25, 0.75 and 1).
    ks : sequence of int, keyword-only
        Numbers of drafts.
    ax : matplotlib Axes or None, keyword-only
        Axes to draw on (a new figure when None).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on; line ``2 j`` holds OTM-k and ``2 j + 1`` k-Seq for ``bs[j]`` (y data: the
        exact values; x data: ``ks`` shifted by the series' offset).

    Raises
    ------
    ValueError
        A probability outside [0, 1] or ``k < 1``.
    TypeError
        ``p`` given a matplotlib Axes (pass it as ``ax=``).

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport", arXiv:2310.15141 v2,
       Appendix B, Figure 4.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.multidraft import plot_spectr_fig4
    >>> ax = plot_spectr_fig4(bs=(0.75,), ks=range(1, 4))
    >>> [round(float(y), 4) for y in ax.lines[0].get_ydata()]   # OTM-k at b = 0.75
    [0.5, 0.6875, 0.8281]
    """
    return _bernoulli_vs_k(ax, p, bs, ks, ("otm", "kseq"), f"OTM-k vs k-Seq, p = Ber({p:g}), q = Ber(b)")


def plot_spectr_fig6(*, p: float = 0.25, bs=(0.1, 0.75, 1.0), ks=range(1, 11), ax=None):
    r"""SpecTr Figure 6: OTM-k, k-Seq and multi-round over ``k`` for ``p = Ber(0.25)``, ``q = Ber(b)``.

    .. math::

        k \mapsto \alpha_k, \ \alpha(\pi^{\text{k-Seq}}_{\rho^*}), \
        1 - \prod_{i \le k} (1 - \beta_i).

    Drawn as :func:`plot_spectr_fig4` (OTM-k solid with small dots, k-Seq
    dashed with hollow squares, multi-round dotted with hollow triangles; each
    ``b`` shifted along ``k`` by a few hundredths of a draft).

    Parameters
    ----------
    p : float, keyword-only
        Draft probability of token 1.
    bs : sequence of float, keyword-only
        Target probabilities of token 1 (the paper omits b = 0.25, where all are 1).
    ks : sequence of int, keyword-only
        Numbers of drafts.
    ax : matplotlib Axes or None, keyword-only
        Axes to draw on (a new figure when None).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on; lines ``3 j``, ``3 j + 1``, ``3 j + 2`` hold OTM-k,
        k-Seq and multi-round for ``bs[j]``.

    Raises
    ------
    ValueError
        A probability outside [0, 1] or ``k < 1``.
    TypeError
        ``p`` given a matplotlib Axes (pass it as ``ax=``).

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport", arXiv:2310.15141 v2,
       Appendix B.3, Figure 6.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.multidraft import plot_spectr_fig6
    >>> ax = plot_spectr_fig6(bs=(0.75,), ks=range(1, 3))
    >>> [[round(float(y), 4) for y in line.get_ydata()] for line in ax.lines]
    [[0.5, 0.6875], [0.5, 0.6483], [0.5, 0.625]]
    """
    return _bernoulli_vs_k(
        ax, p, bs, ks, ("otm", "kseq", "multiround"), f"OTM-k, k-Seq, multi-round; p = Ber({p:g}), q = Ber(b)"
    )


def plot_spectr_fig5(*, d: int = 120, d_qs=(5, 10, 20, 40, 60, 120), ks=range(1, 31), show_kseq: bool = True,
                     ax=None):
    r"""SpecTr Figure 5: :math:`\alpha_k` over ``k`` for ``p = U(d)``, ``q = U(d_q)``.

    .. math::

        \alpha_k(U(d), U(d_q)) = 1 - (1 - d_q/d)^k \quad (d_q \le d),

    computed by :func:`otspec.alpha_k` on the vectors; with ``show_kseq`` the
    k-Seq acceptance is overlaid as hollow markers (it equals :math:`\alpha_k`,
    App. B.2). One distinct colour per :math:`d_q` (Okabe-Ito palette).

    Parameters
    ----------
    d : int, keyword-only
        Draft support size (120 in the paper).
    d_qs : sequence of int, keyword-only
        Target support sizes (the paper does not print them; these are a spread).
    ks : sequence of int, keyword-only
        Numbers of drafts.
    show_kseq : bool, keyword-only
        Overlay the k-Seq acceptance as markers.
    ax : matplotlib Axes or None, keyword-only
        Axes to draw on (a new figure when None).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on; per :math:`d_q` one line for :math:`\alpha_k`, then (with ``show_kseq``) one for k-Seq.

    Raises
    ------
    ValueError
        ``d``, a ``d_q`` or a ``k`` below 1.
    TypeError
        ``d`` given a matplotlib Axes (pass it as ``ax=``).

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport", arXiv:2310.15141 v2,
       Appendix B, Figure 5 and B.2; conference version, Figure 1.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.multidraft import plot_spectr_fig5
    >>> ax = plot_spectr_fig5(d_qs=(60,), ks=[1, 2], show_kseq=False)
    >>> ax.lines[0].get_ydata().tolist()          # 1 - (1/2)**k
    [0.5, 0.75]
    """
    reject_axes(d, "d")
    d_qs = [validate_positive_int(dq, "d_qs") for dq in grid_items(d_qs, "d_qs")]
    ks = grid_items(ks, "ks")
    check_cells(len(d_qs) * len(ks), "len(`d_qs`) * len(`ks`)")
    ax = new_axes(ax, (7.0, 4.2))
    colors = palette(len(d_qs))
    methods = ("otm", "kseq") if show_kseq else ("otm",)
    for i, dq in enumerate(d_qs):
        pv, qv = uniform_pair(d, dq)
        curves = acceptance_curves(pv, qv, ks, methods)
        ax.plot(curves.ks, curves.values["otm"], "-", color=colors[i], linewidth=1.8)
        if show_kseq:
            ax.plot(curves.ks, curves.values["kseq"], "o", color=colors[i], markersize=4, markerfacecolor="none")
    ax.set_xlabel("number of drafts $k$")
    ax.set_ylabel(r"optimal acceptance probability ($\alpha_k$)")
    ax.set_title(f"p = U({d}), q = U($d_q$)")
    ax.grid(True, alpha=0.3)
    groups = [("target U($d_q$)", _series_handles(colors, [f"$d_q$ = {dq}" for dq in d_qs]))]
    if show_kseq:
        from matplotlib.lines import Line2D

        groups.append(("verifier", [Line2D([], [], color="0.35", linewidth=1.8, label=r"OTM-k ($\alpha_k$)"),
                                    Line2D([], [], color="0.35", linestyle="none", marker="o",
                                           markerfacecolor="none", label="k-Seq")]))
    legend_outside(ax, groups)
    return ax


def plot_acceptance_vs_b(*, p: float = 0.25, ks=(1, 2, 4, 8), bs=None, methods=("otm",), ax=None):
    r"""Acceptance against the target's ``b`` for several ``k`` (SpecTr conference version, Figure 3).

    .. math::

        b \mapsto \alpha_k(\mathrm{Ber}(p), \mathrm{Ber}(b)), \quad k \in \{1, 2, 4, 8\}.

    Parameters
    ----------
    p : float, keyword-only
        Draft probability of token 1 (0.25 in the paper).
    ks : sequence of int, keyword-only
        Numbers of drafts, one colour each.
    bs : (m,) array_like of float or None, keyword-only
        Grid of target probabilities (default: 201 points on [0, 1]).
    methods : sequence of str, keyword-only
        Verifiers to draw (``"otm"`` only in the paper; ``"kseq"`` and
        ``"multiround"`` add dashed / dotted curves).
    ax : matplotlib Axes or None, keyword-only
        Axes to draw on (a new figure when None).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on; one line per ``(k, method)``, then the vertical line at ``b = p``.

    Raises
    ------
    ValueError
        A probability outside [0, 1], ``k < 1`` or an unknown method.
    TypeError
        ``p`` given a matplotlib Axes (pass it as ``ax=``).

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport", NeurIPS 2023
       (conference version), Figure 3.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otspec.plotting.multidraft import plot_acceptance_vs_b
    >>> ax = plot_acceptance_vs_b(ks=(2,), bs=[0.25, 0.75])
    >>> ax.lines[0].get_ydata().tolist()
    [1.0, 0.6875]
    """
    reject_axes(p, "p")
    bs = np.linspace(0.0, 1.0, 201) if bs is None else np.asarray(grid_items(bs, "bs"), dtype=np.float64)
    ks = grid_items(ks, "ks")
    check_cells(len(bs) * len(ks), "len(`bs`) * len(`ks`)")  # before any figure is made
    ax = new_axes(ax, (6.4, 4.2))
    colors = palette(len(ks))
    for i, k in enumerate(ks):
        for m in methods:
            vals = [acceptance_curves(*bernoulli_pair(p, float(b)), [k], (m,)).values[m][0] for b in bs]
            ax.plot(bs, vals, linestyle=_STYLE[m], color=colors[i],
                    label=f"k = {k}" if len(methods) == 1 else f"{_LABEL[m]}, k = {k}")
    ax.axvline(p, color="gray", linewidth=0.8, linestyle=":")
    ax.set_xlabel("target q = Ber(b): b")
    ax.set_ylabel("acceptance probability")
    ax.set_title(f"p = Ber({p:g})")
    ax.grid(True, alpha=0.3)
    from matplotlib.lines import Line2D

    groups = [("drafts", [Line2D([], [], color=colors[i], linewidth=2, label=f"k = {k}") for i, k in enumerate(ks)])]
    if len(methods) > 1:
        groups.append(("verifier", [Line2D([], [], color="0.35", linestyle=_STYLE[m], label=_LABEL[m])
                                    for m in methods]))
    legend_outside(ax, groups)
    return ax
