r"""Multi-draft block optimal transport: ``k`` i.i.d. draft blocks of length ``L`` against a target block.

Draft model :math:`M_s` (the package's ``p``), target model :math:`M_b`
(``q``); :math:`P_\ell`, :math:`Q_\ell` are the laws of the first
:math:`\ell` tokens. Blocks :math:`X^1, \dots, X^k \sim P_L` are i.i.d.; the
reward of a target block :math:`Y \sim Q_L` is the longest common prefix of
:math:`Y` with any draft,

.. math::

    c(X, Y) = \max_{i \le k} \operatorname{lcp}(X^i, Y)
            = \sum_{\ell=1}^{L} \mathbb 1\{Y^\ell \in D_\ell(X)\},

:math:`D_\ell(X)` the set of depth-:math:`\ell` prefixes of the drafts. Its
optimum over couplings bounds the expected accepted length of every lossless
multi-draft block verifier (the argument of Sun et al., arXiv:2403.10444,
Theorem 1, with ``k`` drafts), and each level alone is OTM-k on prefixes, so

.. math::

    \mathrm{OPT} \le B = \sum_{\ell=1}^{L} \alpha_k(P_\ell, Q_\ell).

Equality holds for ``k = 1`` (Sun et al.'s Theorem 1) and ``L = 1`` (OTM-k),
and fails in general: see :func:`multidraft_exact` and the theory page
``docs/theory/multidraft_block.rst``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .._validation import validate_bool, validate_k, validate_positive_int
from ..models import conditional_tables, joint_from_tables, size_exceeds, validate_model_pair
from ..otm._alpha import alpha_k
from ..otm._highs import SolverError, solve_lp
from ..otm._lp import set_weights
from ..otm._multisets import n_multisets
from ._analysis import _common_prefix

__all__ = [
    "MAX_MULTIDRAFT_VARIABLES",
    "MAX_EXACT_VARIABLES",
    "MultiDraftOTResult",
    "MultiDraftExact",
    "level_alphas",
    "level_bound",
    "multidraft_ot",
    "multidraft_exact",
]

#: Largest multi-draft block LP built by :func:`multidraft_ot` (draft-block sets x target blocks),
#: bounded a priori by ``C(V**L + k - 1, k) * V**L``.
MAX_MULTIDRAFT_VARIABLES = 1_000_000
#: Largest LP solved in rationals by :func:`multidraft_exact` (sympy's exact simplex).
MAX_EXACT_VARIABLES = 400


def _check_args(draft, target, L, k):
    V = validate_model_pair(draft, target)
    L = validate_positive_int(L, "L")
    k = validate_k(k)
    return V, L, k


def _prefix_laws(draft, target, L):
    """``(P_1..P_L, Q_1..Q_L)``: flattened joint laws of the ``ell``-token prefixes."""
    cs = conditional_tables(draft, L, name="draft", length_name="L")
    cb = conditional_tables(target, L, name="target", length_name="L")
    Ps = [joint_from_tables(cs[:ell]).ravel() for ell in range(1, L + 1)]
    Qs = [joint_from_tables(cb[:ell]).ravel() for ell in range(1, L + 1)]
    return Ps, Qs


def level_alphas(draft, target, L, k) -> np.ndarray:
    r"""The per-level optima :math:`\alpha_k(P_\ell, Q_\ell)`, :math:`\ell = 1, \dots, L`, in closed form.

    .. math::

        \alpha_k(P_\ell, Q_\ell) = \min_{A \subseteq \Omega^\ell}
            \big[1 + Q_\ell(A) - P_\ell(A)^k\big],

    OTM-k (:func:`otspec.alpha_k`) on the alphabet of :math:`\ell`-token
    prefixes: the :math:`\ell`-prefixes of ``k`` i.i.d. draft blocks are ``k``
    i.i.d. draws from :math:`P_\ell`.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).
    L : int
        Block length.
    k : int
        Number of draft blocks.

    Returns
    -------
    (L,) ndarray of float64

    Raises
    ------
    ValueError
        ``L`` or ``k`` below 1, different vocabularies, or ``V**L`` above the
        enumeration limit of :func:`otspec.models.conditional_tables`.
    TypeError
        Non-integer ``L`` or ``k``, or objects that are not models.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal Transport",
       arXiv:2310.15141, eq. (4) (OTM-k) and Lemma 3.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import level_alphas
    >>> (256 * level_alphas(MemorylessModel([3/4, 1/4]), MemorylessModel([1/2, 1/2]), 2, 2)).tolist()
    [240.0, 223.0]
    """
    _, L, k = _check_args(draft, target, L, k)
    Ps, Qs = _prefix_laws(draft, target, L)
    return np.array([alpha_k(P, Q, k, normalize=True) for P, Q in zip(Ps, Qs)], dtype=np.float64)


def level_bound(draft, target, L, k) -> float:
    r"""The level-wise upper bound :math:`B = \sum_{\ell=1}^{L} \alpha_k(P_\ell, Q_\ell)` on the multi-draft block OT.

    .. math::

        \max_{\pi \in \Pi(P_L^{\otimes k}, Q_L)} \mathbb E_\pi[c(X, Y)]
        \le B = \sum_{\ell=1}^{L} \alpha_k(P_\ell, Q_\ell).

    Tight for ``k = 1`` (it is Sun et al.'s Theorem 1 sum
    :math:`\sum_\ell \sum_{x^\ell} \min(P_\ell, Q_\ell)`) and for ``L = 1``;
    strictly loose in general (:func:`multidraft_exact`).

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).
    L, k : int
        Block length and number of draft blocks.

    Returns
    -------
    float
        Accurate to float rounding (each term is a closed form after one sort).

    Raises
    ------
    ValueError, TypeError
        As :func:`level_alphas`.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", arXiv:2403.10444 v1, Theorem 1 (the ``k = 1`` case).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import level_bound
    >>> 256 * level_bound(MemorylessModel([3/4, 1/4]), MemorylessModel([1/2, 1/2]), 2, 2)
    463.0
    """
    return math.fsum(level_alphas(draft, target, L, k).tolist())


# ---------------------------------------------------------------------------
# the LP over couplings, symmetrised over sets of draft blocks
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class MultiDraftOTResult:
    r"""Result of :func:`multidraft_ot`.

    Attributes
    ----------
    value : float
        :math:`\mathrm{OPT}`, the LP optimum (``nan`` on failure).
    bound : float
        The level-wise bound :math:`B` (:func:`level_bound`).
    status : str
        ``"optimal"``, a HiGHS model status name, or ``"check_failed"``.
    success : bool
    keys : tuple of tuple of int
        The distinct-block sets of the drafts with positive probability; a block is
        its index in lexicographic order of :math:`\Omega^L` (``np.ravel_multi_index``).
    weights : (n_keys,) ndarray
        :math:`w(A) = P(\{X^1, \dots, X^k\} = A)`.
    plan : (n_keys, V**L) ndarray or None
        An optimal coupling :math:`\pi(A, y)`, repaired to exact marginals
        (row sums ``weights``, column sums :math:`Q_L`, to float rounding).
    plan_value : float
        :math:`\sum \pi c` of the repaired plan (within ``max_violation`` of ``value``).
    reward : (n_keys, V**L) ndarray or None
        :math:`c(A, y) = \max_{x \in A} \operatorname{lcp}(x, y)`.
    target_law : (V**L,) ndarray
        :math:`Q_L`.
    max_violation : float
        Largest marginal / sign violation of the solver's raw solution.
    n_variables : int
    message : str
    V, L, k : int
    target_dual : (V**L,) ndarray
        HiGHS's duals of the target-marginal rows (empty on failure), the start
        of :func:`multidraft_exact`'s certificate.
    """

    value: float
    bound: float
    status: str
    success: bool
    keys: tuple
    weights: np.ndarray
    plan: np.ndarray | None
    plan_value: float
    reward: np.ndarray | None
    target_law: np.ndarray
    max_violation: float
    n_variables: int
    message: str
    V: int
    L: int
    k: int
    target_dual: np.ndarray

    @property
    def gap(self) -> float:
        """:math:`B - \\mathrm{OPT}` (``nan`` on failure)."""
        return self.bound - self.value


def _block_sets(PL: np.ndarray, k: int):
    """Distinct-block sets of ``k`` i.i.d. blocks with their probabilities, as a padded key array."""
    keys, w = set_weights(PL, k)
    arr = np.array([list(a) + [a[0]] * (k - len(a)) for a in keys], dtype=np.int64).reshape(len(keys), k)
    return keys, w, arr


def _round_to_marginals(X: np.ndarray, r: np.ndarray, c: np.ndarray) -> np.ndarray:
    r"""A coupling with row sums ``r`` and column sums ``c`` near ``X`` (Altschuler, Weed, Rigollet 2017, Algorithm 2).

    Clip, scale over-full rows then over-full columns down, and add the
    rank-one coupling of the row and column deficits; the objective moves by at
    most the reward range times the total violation.
    """
    X = np.maximum(X, 0.0)
    for axis, m in ((1, r), (0, c)):
        s = X.sum(axis=axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            f = np.where(s > m, m / np.where(s > 0, s, 1.0), 1.0)
        X = X * (f[:, None] if axis == 1 else f[None, :])
    er = np.maximum(r - X.sum(axis=1), 0.0)
    ec = np.maximum(c - X.sum(axis=0), 0.0)
    if ec.sum() > 0:
        X = X + np.outer(er, ec / ec.sum())
    return X


def _lp_size(V: int, L: int, k: int, limit: int) -> int:
    """An a-priori upper bound on the LP's variables (multisets of blocks x blocks), capped above ``limit``."""
    if size_exceeds(V, L, limit):
        return limit + 1
    N = V**L
    if math.lgamma(N + k) - math.lgamma(k + 1) - math.lgamma(N) + math.log(N) > math.log(limit) + 1.0:
        return limit + 1
    return n_multisets(N, k) * N


def check_multidraft_size(V: int, L: int, k: int, limit: int, name: str) -> None:
    """Refuse (ValueError, before anything is enumerated) an LP over more than ``limit`` (set, block) pairs."""
    if _lp_size(V, L, k, limit) > limit:
        raise ValueError(
            f"the multi-draft block LP for V={V}, `L`={L}, `k`={k} would have up to C(V**L + k - 1, k) * V**L "
            f"variables, above the limit {name}={limit}"
        )


def solve_transport(reward: np.ndarray, w: np.ndarray, q: np.ndarray):
    r"""The transport LP :math:`\max \sum \pi c` with marginals ``w`` (rows) and ``q`` (columns): ``(sol, plan)``.

    Solved as a partial transport (row sums at most ``w``, column sums at
    most ``q``): the same optimum as the full coupling since rewards are
    >= 0 (leftover mass is paired independently), and no infeasibility from
    the rounding-level difference between the two totals. ``plan`` is the
    solution repaired to exact marginals (None on a failed solve).
    """
    nk, N = reward.shape
    nv = nk * N
    index = np.empty(2 * nv, dtype=np.int32)
    index[0::2] = np.repeat(np.arange(nk), N)
    index[1::2] = nk + np.tile(np.arange(N), nk)
    rhs = np.concatenate([w, q])
    sol = solve_lp(reward.ravel(), np.arange(0, 2 * nv + 1, 2), index, np.ones(2 * nv),
                   np.full(nk + N, -np.inf), rhs)
    plan = _round_to_marginals(sol.x.reshape(nk, N), w, q) if sol.success else None
    return sol, plan


def multidraft_ot(draft, target, L, k, *, max_variables: int = MAX_MULTIDRAFT_VARIABLES,
                  raise_on_failure: bool = False) -> MultiDraftOTResult:
    r"""The exact optimum of the multi-draft block OT problem, as a HiGHS LP over couplings.

    .. math::

        \mathrm{OPT} = \max_{\pi \in \Pi(P_L^{\otimes k},\, Q_L)}
            \mathbb E_\pi\Big[\max_{i \le k} \operatorname{lcp}(X^i, Y)\Big].

    The reward depends on the drafts only through the *set* :math:`A` of
    distinct blocks and :math:`P_L^{\otimes k}` is exchangeable, so the LP is
    solved over these sets with weights :math:`w(A)` (multisets of blocks
    summed by their multinomial probabilities) — same optimum, and a
    tuple-level plan is the set's row shared among its tuples. ``V = 3, L = 3,
    k = 3`` (3,303 sets, 89,181 variables) and ``V = 2, L = 4, k = 4`` solve in
    seconds. The solution is re-checked by the package's HiGHS helper (signs,
    marginals and objective within 1e-9) and the plan is then repaired to
    exact marginals. It is solved as a partial transport (row sums at most
    :math:`w`, column sums at most :math:`Q_L`): the rewards are
    non-negative, so the optimum is the same and leftover mass is paired
    independently.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).
    L : int
        Block length.
    k : int
        Number of i.i.d. draft blocks.
    max_variables : int, keyword-only
        Refuse (ValueError, before anything is enumerated) when
        :math:`\binom{V^L + k - 1}{k} V^L` exceeds it.
    raise_on_failure : bool, keyword-only
        Raise :class:`otspec.SolverError` instead of returning a failed result.

    Returns
    -------
    MultiDraftOTResult
        ``value`` (OPT), ``bound`` (:math:`B`), the plan and its sets.

    Raises
    ------
    ValueError
        Invalid models, ``L`` or ``k`` below 1, or the LP above ``max_variables``.
    TypeError
        Non-integer ``L``, ``k`` or ``max_variables``; ``raise_on_failure`` not a bool.
    SolverError
        Only with ``raise_on_failure=True``.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", arXiv:2403.10444 v1, eq. (3) and Theorem 1 (``k = 1``).
    .. [2] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal Transport",
       arXiv:2310.15141, eq. (4) (``L = 1``).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import multidraft_ot
    >>> res = multidraft_ot(MemorylessModel([3/4, 1/4]), MemorylessModel([1/2, 1/2]), 2, 2)
    >>> res.status, round(128 * res.value, 7), round(256 * res.bound, 7)
    ('optimal', 231.0, 463.0)
    """
    V, L, k = _check_args(draft, target, L, k)
    max_variables = validate_positive_int(max_variables, "max_variables")
    raise_on_failure = validate_bool(raise_on_failure, "raise_on_failure")
    check_multidraft_size(V, L, k, max_variables, "`max_variables`")
    Ps, Qs = _prefix_laws(draft, target, L)
    bound = math.fsum(alpha_k(P, Q, k, normalize=True) for P, Q in zip(Ps, Qs))
    PL, QL = Ps[-1] / math.fsum(Ps[-1]), Qs[-1] / math.fsum(Qs[-1])
    keys, w, arr = _block_sets(PL, k)
    N = PL.shape[0]
    lc = _common_prefix(V, L)
    reward = lc[arr].max(axis=1)  # (n_keys, N)
    nk = len(keys)
    nv = nk * N
    sol, plan = solve_transport(reward, w, QL)
    if not sol.success:
        if raise_on_failure:
            sol.raise_for_status("multi-draft block LP")
        return MultiDraftOTResult(math.nan, bound, sol.status, False, tuple(keys), w, None, math.nan, reward, QL,
                                  sol.max_violation, nv, sol.message, V, L, k, np.empty(0))
    plan_value = math.fsum((plan * reward).ravel().tolist())
    return MultiDraftOTResult(sol.objective, bound, "optimal", True, tuple(keys), w, plan, plan_value, reward, QL,
                              sol.max_violation, nv, sol.message, V, L, k, sol.row_dual[nk:])


# ---------------------------------------------------------------------------
# exact rationals: the LP and the bound in fractions, and a dual certificate
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class MultiDraftExact:
    r"""Result of :func:`multidraft_exact`: OPT, :math:`B` and the gap in exact rationals.

    Attributes
    ----------
    opt : Fraction or None
        The LP optimum solved in rationals (sympy's exact simplex); None when
        the LP is above ``MAX_EXACT_VARIABLES`` and only the certificate is computed.
    bound : Fraction
        :math:`B = \sum_\ell \alpha_k(P_\ell, Q_\ell)` in rationals.
    level_alphas : tuple of Fraction
    upper : Fraction
        An upper bound on OPT from an exact dual certificate (see ``dual``).
    dual : tuple of Fraction
        The certificate :math:`v(y)` on target blocks: with
        :math:`u(A) = \max_y [c(A, y) - v(y)]`, weak duality gives
        :math:`\mathrm{OPT} \le \sum_A w(A) u(A) + \sum_y Q_L(y) v(y) =` ``upper``.
    gap_proved : bool
        ``upper < bound``: OPT < B proved in exact arithmetic.
    """

    opt: Fraction | None
    bound: Fraction
    level_alphas: tuple
    upper: Fraction
    dual: tuple
    gap_proved: bool

    @property
    def gap(self) -> Fraction | None:
        """:math:`B - \\mathrm{OPT}` exactly (None when ``opt`` is)."""
        return None if self.opt is None else self.bound - self.opt


def _fraction_tables(model, L, name):
    return [np.vectorize(Fraction, otypes=[object])(t) for t in conditional_tables(model, L, name=name, length_name="L")]


def _exact_alpha(P, Q, k) -> Fraction:
    """:math:`\\min_A 1 + Q(A) - P(A)^k` in rationals over the prefixes of the ``Q/P``-ascending order."""
    order = sorted(range(len(P)), key=lambda i: (P[i] == 0, Q[i] / P[i] if P[i] else 0))
    best, sp, sq = Fraction(1), Fraction(0), Fraction(0)
    for i in order:
        sp += P[i]
        sq += Q[i]
        best = min(best, 1 + sq - sp**k)
    return best


def _exact_set_weights(PL, k):
    acc: dict[tuple[int, ...], Fraction] = {}
    support = [i for i, v in enumerate(PL) if v > 0]
    for ms in itertools.combinations_with_replacement(support, k):
        coef = math.factorial(k)
        for _, g in itertools.groupby(ms):
            coef //= math.factorial(len(list(g)))
        key = tuple(sorted(set(ms)))
        acc[key] = acc.get(key, Fraction(0)) + coef * math.prod((PL[i] for i in ms), start=Fraction(1))
    return list(acc), [acc[a] for a in acc]


def multidraft_exact(draft, target, L, k, *, max_denominator: int = 10**6) -> MultiDraftExact:
    r"""OPT, :math:`B` and their gap in exact rationals, with a dual certificate.

    .. math::

        \mathrm{OPT} = \max_{\pi \in \Pi(P_L^{\otimes k}, Q_L)} \mathbb E_\pi[c(X, Y)]
        \;\le\; \sum_A w(A) u(A) + \sum_y Q_L(y) v(y)
        \quad\text{for every } v,\ u(A) = \max_y [c(A, y) - v(y)].

    The model's float conditionals are read as exact rationals
    (``Fraction(float)``; dyadic values such as 1/4 are exact). :math:`B` is
    the closed form of each level in rationals. OPT is solved in rationals by
    sympy's exact simplex when the LP has at most ``MAX_EXACT_VARIABLES``
    variables. Independently, the target-side duals of the float LP
    (:func:`multidraft_ot`) rounded to rationals of denominator at most
    ``max_denominator`` give ``upper``, an exact upper bound on OPT whatever
    the rounding (weak duality); ``gap_proved`` is ``upper < bound``.

    Parameters
    ----------
    draft, target : Model
    L, k : int
    max_denominator : int, keyword-only
        Largest denominator of the rounded duals.

    Returns
    -------
    MultiDraftExact

    Raises
    ------
    ValueError
        As :func:`multidraft_ot`.
    SolverError
        The float LP behind the certificate failed.
    ImportError
        sympy (>= 1.13, in the ``test`` extra; its ``linprog``) missing when the exact simplex runs.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", arXiv:2403.10444 v1, Theorem 1.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import multidraft_exact
    >>> ex = multidraft_exact(MemorylessModel([3/4, 1/4]), MemorylessModel([1/2, 1/2]), 2, 2)
    >>> ex.opt, ex.bound, ex.gap, ex.gap_proved
    (Fraction(231, 128), Fraction(463, 256), Fraction(1, 256), True)
    """
    V, L, k = _check_args(draft, target, L, k)
    max_denominator = validate_positive_int(max_denominator, "max_denominator")
    res = multidraft_ot(draft, target, L, k, raise_on_failure=True)
    cs, cb = _fraction_tables(draft, L, "draft"), _fraction_tables(target, L, "target")
    Js, Jb, alphas = np.array(Fraction(1), dtype=object), np.array(Fraction(1), dtype=object), []
    for ell in range(L):
        Js = Js[..., None] * cs[ell]
        Jb = Jb[..., None] * cb[ell]
        alphas.append(_exact_alpha(Js.ravel().tolist(), Jb.ravel().tolist(), k))
    PL, QL = Js.ravel().tolist(), Jb.ravel().tolist()
    keys, w = _exact_set_weights(PL, k)
    if tuple(keys) != res.keys:
        raise SolverError("the exact and float enumerations of draft-block sets disagree")  # pragma: no cover
    reward = res.reward.astype(np.int64).tolist()
    bound = sum(alphas, Fraction(0))
    nk, N = len(keys), len(QL)
    # the certificate: HiGHS's duals on the target rows, either sign convention, rounded
    sol_dual = res.target_dual
    best = None
    for sign in (1, -1):
        v = [Fraction(sign * float(d)).limit_denominator(max_denominator) for d in sol_dual]
        upper = sum((wa * max(reward[a][y] - v[y] for y in range(N)) for a, wa in enumerate(w)), Fraction(0))
        upper += sum((QL[y] * v[y] for y in range(N)), Fraction(0))
        if best is None or upper < best[0]:
            best = (upper, tuple(v))
    opt = None
    if nk * N <= MAX_EXACT_VARIABLES:
        opt = _exact_lp(reward, w, QL)
    return MultiDraftExact(opt, bound, tuple(alphas), best[0], best[1], bool(best[0] < bound))


def _exact_lp(reward, w, QL) -> Fraction:
    """The transport LP ``max sum pi c`` with marginals ``w``, ``QL`` in rationals (sympy's simplex).

    Solved in its partial form, ``sum_y pi(a, y) <= w(a)`` and ``sum_a pi(a, y) <= QL(y)``: the rewards are
    ``>= 0``, so a partial plan completed by the product of its leftover masses rewards no less, and the optimum is
    the transport optimum whenever the two marginals have one total (and is defined when rounding makes them differ,
    the equality system then having no solution). ``pi = 0`` is a feasible start: no first phase. On the equality
    form sympy's simplex raised InfeasibleLPError on degenerate inputs ("Oscillating system led to invalid
    solution", e.g. one draft block of V = 3, L = 2 with zero-mass target blocks).
    """
    try:
        import sympy
        from sympy.solvers.simplex import linprog
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("multidraft_exact solves the LP in rationals with sympy >= 1.13 (its linprog): "
                          "pip install 'sympy>=1.13'") from exc

    nk, N = len(w), len(QL)
    nv = nk * N
    A = sympy.zeros(nk + N, nv)
    for a in range(nk):
        for y in range(N):
            A[a, a * N + y] = 1
            A[nk + y, a * N + y] = 1
    b = sympy.Matrix([sympy.Rational(x.numerator, x.denominator) for x in list(w) + list(QL)])
    c = sympy.Matrix([-reward[a][y] for a in range(nk) for y in range(N)])
    val, _ = linprog(c, A=A, b=b)
    val = -sympy.Rational(val)
    return Fraction(int(val.p), int(val.q))
