r"""The membership-cost optimal-transport LP of OTM-k (SpecTr eq. 4) and its optimal plan.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._deps import install_hint
from .._validation import as_float_array, validate_bool, validate_distribution, validate_k, validate_pair
from .._verifier import Verifier, complement
from ._highs import LP_CHECK_TOL, SolverError, _quiet_class, solve_lp
from ._multisets import multiset_law, n_multisets

__all__ = [
    "OTMResult",
    "OTMPlanVerifier",
    "SolverError",
    "otm_lp",
    "otm_lp_tuples",
    "set_weights",
    "LP_CHECK_TOL",
    "MAX_LP_BYTES",
    "lp_size",
    "membership_plan",
    "MAX_MEMBERSHIP_COLUMNS",
]

#: Largest reduced LP built (number of multisets enumerated or variables).
MAX_REDUCED_SIZE = 5_000_000
#: Largest tuple LP built (``n**(k+1)`` variables).
MAX_TUPLE_VARIABLES = 250_000
#: Largest memory the reduced LP may need, in bytes (estimated before anything is
#: built, see :func:`lp_bytes`).
MAX_LP_BYTES = 2 * 2**30
#: Peak memory per LP variable of the reduced LP: the enumerated sets, the
#: column-wise matrix, HiGHS's own copies and the solution (measured: 397 MB at
#: 360,000 variables, n = 600, k = 2, HiGHS 1.16, with the plan kept factored).
BYTES_PER_VARIABLE = 1200


def lp_size(s: int, k: int) -> tuple[int, int]:
    """Exact ``(sets, variables)`` of the reduced LP for a draft support of ``s`` tokens and ``k`` drafts.

    Every non-empty subset of the support with at most ``k`` tokens is a
    distinct-token set of positive probability; a set of ``j`` tokens has ``j``
    variables. Computed without enumerating anything.
    """
    sets = cols = 0
    for j in range(1, min(k, s) + 1):
        c = math.comb(s, j)
        sets += c
        cols += j * c
        if cols > MAX_REDUCED_SIZE:
            break  # already above every limit
    return sets, cols


def check_lp_size(s: int, k: int) -> None:
    """Refuse (ValueError) a reduced LP above ``MAX_REDUCED_SIZE`` variables or ``MAX_LP_BYTES`` of memory."""
    if _n_multisets_capped(s, k) > MAX_REDUCED_SIZE:
        raise ValueError(
            f"the reduced OTM LP would enumerate more than {MAX_REDUCED_SIZE} multisets for |supp p|={s}, "
            f"`k`={k}, above the limit MAX_REDUCED_SIZE={MAX_REDUCED_SIZE}"
        )
    _, cols = lp_size(s, k)
    if cols > MAX_REDUCED_SIZE:
        raise ValueError(
            f"the reduced OTM LP would have more than {MAX_REDUCED_SIZE} variables for |supp p|={s}, `k`={k}"
        )
    need = cols * BYTES_PER_VARIABLE
    if need > MAX_LP_BYTES:
        raise ValueError(
            f"the reduced OTM LP for |supp p|={s}, `k`={k} has {cols} variables and needs about "
            f"{need / 2**30:.1f} GiB, above the limit MAX_LP_BYTES={MAX_LP_BYTES / 2**30:.0f} GiB; "
            "use alpha_k (closed form / min-cut) or optimal_verifier for large vocabularies"
        )


def _n_multisets_capped(m: int, k: int) -> int:
    """``C(m + k - 1, k)`` or ``MAX_REDUCED_SIZE + 1`` when above it (decided by logarithms first)."""
    if m <= 1:
        return 1
    if math.lgamma(m + k) - math.lgamma(k + 1) - math.lgamma(m) > math.log(MAX_REDUCED_SIZE) + 1.0:
        return MAX_REDUCED_SIZE + 1
    return n_multisets(m, k)


class OTMPlanVerifier(Verifier):
    r"""A verifier given by an explicit transport plan, keyed by draft set or tuple.

    For drafts :math:`x` with key :math:`a(x)` (the sorted distinct-token set
    for the reduced LP, the tuple itself for the tuple LP) the output law is
    :math:`K(\cdot \mid x) = \pi(a(x), \cdot) / w(a(x))`. For a draft tuple of
    probability zero under :math:`p^{\otimes k}` the conditional is ``q``
    (any choice leaves the joint law unchanged).
    """

    def __init__(self, p, q, k, keys, rows, weights, acceptance, keyed_by_set):
        self.k = k
        self.p = p
        self.q = q
        self._index = {key: i for i, key in enumerate(keys)}
        self._rows = rows
        self._weights = weights
        self._acceptance = float(acceptance)
        self._by_set = keyed_by_set

    @property
    def n_keys(self) -> int:
        """Number of draft sets (or tuples) carried by the plan."""
        return len(self._index)

    def conditional(self, drafts) -> np.ndarray:
        x = self._drafts(drafts)
        key = tuple(sorted(set(x))) if self._by_set else x
        i = self._index.get(key)
        if i is None or not self._weights[i] > 0:
            return np.array(self.q)
        row = self._rows[i]
        total = row.sum()
        if not total > 0:  # a draft set of rounding-level weight whose row underflowed
            return np.array(self.q)
        return row / total

    def acceptance(self) -> float:
        return self._acceptance


@dataclass(frozen=True, eq=False)
class OTMResult:
    """Result of :func:`otm_lp` / :func:`otm_lp_tuples`.

    Attributes
    ----------
    alpha : float
        Optimal acceptance (``nan`` when ``success`` is False).
    status : str
        ``"optimal"`` or the failure: the HiGHS model status name, or
        ``"check_failed"`` when the claimed optimum failed the re-check.
    message : str
        Human-readable detail (solver status, largest violation found).
    n_variables : int
        Number of LP variables.
    verifier : OTMPlanVerifier or None
        The optimal plan as a verifier (None on failure). Its
        ``acceptance()`` is the exact acceptance of the plan as a kernel,
        which may exceed ``alpha`` (the LP value) by rounding-level
        leftover mass that the pairing puts back on a draft token.
    success : bool
        ``status == "optimal"``.
    k : int
        Number of drafts.
    max_violation : float
        Largest marginal / sign violation of the solver's raw solution.
    """

    alpha: float
    status: str
    message: str
    n_variables: int
    verifier: OTMPlanVerifier | None
    success: bool
    k: int
    max_violation: float


class _FactoredRows:
    """Rows ``f(A, .) + r(A) c`` of the reduced plan without the dense ``(n_sets, n)`` array.

    ``rows[i]`` builds one dense row (O(n)); memory is that of the LP solution.
    """

    def __init__(self, f, set_of_col, token_of_col, r, c):
        self._f, self._tok, self._r, self._c = f, token_of_col, r, c
        self._start = np.searchsorted(set_of_col, np.arange(r.shape[0] + 1))  # columns are grouped by set

    def __getitem__(self, i: int) -> np.ndarray:
        row = self._r[i] * self._c
        a, b = self._start[i], self._start[i + 1]
        np.add.at(row, self._tok[a:b], self._f[a:b])
        return row

    def sums(self) -> np.ndarray:
        on = np.add.reduceat(self._f, self._start[:-1]) if self._f.shape[0] else np.zeros(self._r.shape[0])
        return on + self._r * float(self._c.sum())


#: Largest membership LP built by :func:`membership_plan` (columns = key-token memberships).
MAX_MEMBERSHIP_COLUMNS = 1_000_000
#: Largest dense plan :func:`membership_plan` returns: keys x tokens entries (2**24 float64: 128 MiB per array).
MAX_PLAN_ENTRIES = 1 << 24


def check_plan_entries(n_keys: int, n: int, what: str) -> None:
    """Refuse, before any allocation, a dense ``(n_keys, n)`` plan above :data:`MAX_PLAN_ENTRIES` entries."""
    if n_keys * n > MAX_PLAN_ENTRIES:
        raise ValueError(
            f"{what} is a dense ({n_keys}, {n}) float64 array: {n_keys * n} entries "
            f"({8 * n_keys * n / 2**30:.1f} GiB), above the limit {MAX_PLAN_ENTRIES} entries "
            f"({8 * MAX_PLAN_ENTRIES / 2**20:.0f} MiB): use fewer keys or a smaller support"
        )


@dataclass(frozen=True, eq=False)
class _Membership:
    """A solved membership LP repaired to exact feasibility: matched ``f`` per column, leftovers ``r``, ``c_law``."""

    f: np.ndarray
    key_of: np.ndarray
    tok_of: np.ndarray
    r: np.ndarray
    c_law: np.ndarray


def _membership_lp(members, w: np.ndarray, q: np.ndarray, *, limit: int, what: str):
    r"""Solve :math:`\max \sum_{a, y \in a} f(a, y)` with row sums :math:`\le w(a)`, column sums :math:`\le q(y)`.

    ``members[i]`` are the distinct tokens of key ``i`` (sorted). Returns
    ``(sol, plan)``: the :class:`LPSolution` and, on success, the matched mass
    clipped and scaled down so that every row and column bound holds exactly,
    with the unmatched row mass ``r`` and the law ``c_law`` it is paired with
    independently (the leftover target mass, or ``q`` itself when that is
    empty: then ``r`` is rounding-level). ``plan`` is None on a solver
    failure. Raises ValueError above ``limit`` columns, before building.
    """
    n, n_keys = q.shape[0], len(members)
    sizes = np.array([len(a) for a in members], dtype=np.int64)
    n_cols = int(sizes.sum()) if n_keys else 0
    if n_cols > limit:
        raise ValueError(f"the {what} would have {n_cols} variables, above the limit {limit}")
    key_of = np.repeat(np.arange(n_keys), sizes)
    tok_of = np.fromiter(itertools.chain.from_iterable(members), dtype=np.int64, count=n_cols)
    index = np.empty(2 * n_cols, dtype=np.int32)
    index[0::2], index[1::2] = key_of, n_keys + tok_of
    sol = solve_lp(np.ones(n_cols), np.arange(0, 2 * n_cols + 1, 2, dtype=np.int32), index, np.ones(2 * n_cols),
                   np.full(n_keys + n, -np.inf), np.concatenate([w, q]))
    if not sol.success:
        return sol, None
    # repair to exact feasibility: clip, then scale down over-full rows and columns
    f = np.maximum(sol.x, 0.0)
    for owner, cap, size in ((key_of, w, n_keys), (tok_of, q, n)):
        used = np.bincount(owner, weights=f, minlength=size)
        with np.errstate(divide="ignore", invalid="ignore"):
            f *= np.minimum(1.0, np.where(used > 0, cap / used, 1.0))[owner]
    r = np.maximum(w - np.bincount(key_of, weights=f, minlength=n_keys), 0.0)
    c = np.maximum(q - np.bincount(tok_of, weights=f, minlength=n), 0.0)
    csum = c.sum()
    # when every column is full (alpha = 1 up to rounding) the leftover row mass
    # r is rounding-level; spreading it as q keeps every row a proper law
    c_law = c / csum if csum > 0 else np.array(q)
    return sol, _Membership(f, key_of, tok_of, r, c_law)


def _membership_plan(keys, w: np.ndarray, q: np.ndarray):
    """``(alpha, rows, matched)`` of the membership LP over ``keys`` as dense ``(n_keys, n)`` arrays."""
    check_plan_entries(len(keys), q.shape[0], "the membership plan")
    sol, m = _membership_lp([sorted(set(a)) for a in keys], w, q, limit=MAX_MEMBERSHIP_COLUMNS,
                            what="membership LP")
    if m is None:
        sol.raise_for_status("the membership LP")
    matched = np.zeros((len(keys), q.shape[0]))
    np.add.at(matched, (m.key_of, m.tok_of), m.f)
    return math.fsum(m.f.tolist()), matched + np.outer(m.r, m.c_law), matched


def _token_keys(keys) -> list[tuple[int, ...]]:
    """``keys`` as a list of tuples of Python ints; a key that is not a sequence of integer ids (``0.7`` was read as
    token 0, text letter by letter) raises a TypeError naming ``keys``."""
    if (isinstance(keys, (str, bytes, numbers.Number)) or keys is None or not hasattr(keys, "__iter__")
            or getattr(keys, "ndim", None) == 0):  # a 0-d array: iteration raised numpy's TypeError
        raise TypeError(f"`keys` must be a sequence of keys (sequences of token ids), got {type(keys).__name__}")
    out = []
    for i, a in enumerate(keys):
        if isinstance(a, (str, bytes, numbers.Number)) or a is None or not hasattr(a, "__iter__"):
            raise TypeError(f"`keys[{i}]` must be a sequence of token ids, got {type(a).__name__}")
        key = tuple(a.tolist() if isinstance(a, np.ndarray) else a)
        for x in key:
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
                raise TypeError(f"`keys[{i}]` must hold integer token ids, got {type(x).__name__} {x!r}")
        out.append(tuple(int(x) for x in key))
    return out


def membership_plan(keys, w, q):
    r"""The membership LP of any finite draft process: drafted keys ``keys`` with probabilities ``w``.

    .. math::

        \max_{f \ge 0} \sum_{a} \sum_{y \in a} f(a, y) \quad\text{s.t.}\quad
        \sum_y f(a, y) \le w(a),\ \ \sum_a f(a, y) \le q(y).

    Parameters
    ----------
    keys : sequence of sequence of int
        The drafted outcomes (tuples or sets of token ids).
    w : (len(keys),) array_like of float
        Their probabilities (non-negative, summing to 1).
    q : (n,) array_like of float
        Target distribution.

    Returns
    -------
    alpha : float
        The optimum (the optimal acceptance of the draft process).
    rows : (len(keys), n) ndarray
        A full coupling of ``w`` and ``q`` (matched plus independently paired leftover mass).
    matched : (len(keys), n) ndarray
        The matched part.

    Raises
    ------
    ValueError
        ``w`` not one non-negative weight per key summing to 1, an empty key or
        an id outside ``[0, n)``, ``q`` not a distribution; a plan of more than
        :data:`MAX_PLAN_ENTRIES` entries (``len(keys) * n``, refused before it is built); a solver failure.

    References
    ----------
    .. [1] Hu, Zheng, Viswanathan, Chen, Rossi, Wu, Manocha, Huang, "Towards Optimal Multi-draft
       Speculative Decoding", ICLR 2025, arXiv:2502.18779.

    Examples
    --------
    >>> import otspec
    >>> round(otspec.otm.membership_plan([(0,), (1,)], [0.5, 0.5], [0.25, 0.75])[0], 9)
    0.75
    """
    q_ = validate_distribution(q, "q", normalizable=False)
    w_ = as_float_array(w, "w", "an array_like of weights")  # no text parsed as numbers
    keys = _token_keys(keys)
    if w_.ndim != 1 or w_.shape[0] != len(keys) or np.any(~np.isfinite(w_)) or np.any(w_ < 0):
        raise ValueError(f"`w` must be {len(keys)} finite non-negative weights, one per key")
    if abs(math.fsum(w_.tolist()) - 1.0) > 1e-9:
        raise ValueError(f"`w` must sum to 1 within 1e-9, got {math.fsum(w_.tolist())!r}")
    if any(not a or min(a) < 0 or max(a) >= q_.shape[0] for a in keys):
        raise ValueError(f"every key must be a non-empty tuple of token ids in [0, {q_.shape[0]})")
    return _membership_plan(keys, w_, q_)


def set_weights(p, k: int) -> tuple[list[tuple[int, ...]], np.ndarray]:
    r"""Law of the distinct-token set :math:`S(X)` of ``k`` i.i.d. draws from ``p``.

    .. math::

        w(A) = P(S(X) = A) = \sum_{\text{multisets } m,\ \mathrm{supp}(m) = A}
            \binom{k}{m} \prod_{x} p(x)^{m_x},

    summed over multisets (all terms non-negative, no cancellation).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    k : int
        Number of draws.

    Returns
    -------
    sets : list of tuple of int
        The sets with positive probability, as sorted tuples.
    weights : (len(sets),) ndarray of float64
        Their probabilities (summing to 1 up to rounding).

    Raises
    ------
    ValueError
        ``p`` not a distribution, ``k < 1``, or more multisets than the LP's size limit.

    Examples
    --------
    >>> from otspec.otm import set_weights
    >>> sets, w = set_weights([0.5, 0.5], 2)
    >>> sorted(zip(sets, w.tolist()))
    [((0,), 0.25), ((0, 1), 0.5), ((1,), 0.25)]
    """
    p_ = validate_distribution(p, "p", normalizable=False)
    k = validate_k(k)
    law = multiset_law(p_, k, max_size=MAX_REDUCED_SIZE, what="reduced OTM LP")
    acc: dict[tuple[int, ...], float] = {}
    for key, w in zip(law.sets(), law.weights.tolist()):
        acc[key] = acc.get(key, 0.0) + w
    sets = list(acc)
    return sets, np.array([acc[s] for s in sets])


def _failure(status, message, n_variables, k, violation, raise_on_failure):
    if raise_on_failure:
        raise SolverError(f"OTM LP failed ({status}): {message}")
    return OTMResult(
        alpha=float("nan"),
        status=status,
        message=message,
        n_variables=n_variables,
        verifier=None,
        success=False,
        k=k,
        max_violation=violation,
    )


def otm_lp(p, q, k, *, normalize: bool = False, raise_on_failure: bool = False) -> OTMResult:
    r"""Solve the OTM-k membership-cost LP, reduced by symmetry, with HiGHS.

    .. math::

        \max_{f \ge 0} \sum_{A} \sum_{y \in A} f(A, y)
        \quad\text{s.t.}\quad
        \sum_{y \in A} f(A, y) \le P(S(X) = A), \qquad
        \sum_{A \ni y} f(A, y) \le q(y),

    over the distinct-token sets :math:`A` of ``k`` i.i.d. drafts from ``p``.
    This partial matching has the same optimum as SpecTr's LP (eq. 4): the
    cost depends on a draft tuple only through its set and
    :math:`p^{\otimes k}` is exchangeable. The unmatched mass is paired
    independently, :math:`\pi(A, y) = f(A, y) + r(A)\, c(y) / \sum_z c(z)`,
    which gives a full coupling of the set law and ``q``; a tuple gets its
    set's conditional.

    The solution is re-checked after solving (non-negativity and both
    marginals within :data:`LP_CHECK_TOL` = 1e-9); any violation is reported
    as a failure, never returned silently. The returned plan is then
    repaired to be exactly feasible, so the verifier is lossless to
    rounding whatever the solver's tolerance.

    Optimal plans are not unique. The LP is solved on the tokens in a
    label-free order (ascending ``p``, then ``q``) and the plan mapped back,
    so relabelling the vocabulary relabels the plan: every value built on
    the plan's conditionals (SpecTr's draft selection over blocks and trees,
    :mod:`otspec.spectr`, ``"spectr-tree"``) is the same for any token ids.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of drafts.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.
    raise_on_failure : bool, keyword-only
        Raise :class:`SolverError` instead of returning a failed result.

    Returns
    -------
    OTMResult
        ``alpha``, ``status``, ``message``, ``n_variables`` and the optimal
        plan as a ``verifier``.

    Raises
    ------
    ValueError
        Invalid ``p``, ``q``, ``k``; more than 5,000,000 multisets or
        variables; or an estimated peak memory (``BYTES_PER_VARIABLE`` = 1200
        bytes per variable, measured) above ``MAX_LP_BYTES`` = 2 GiB. The
        sizes are exact counts made before anything is enumerated:
        :math:`\sum_{j \le k} j \binom{s}{j}` variables for a draft support
        of ``s`` tokens (``n = 1,300`` at ``k = 2`` is about the largest).
    SolverError
        Only with ``raise_on_failure=True``.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, eq. (4).

    Examples
    --------
    >>> import otspec
    >>> res = otspec.otm_lp([0.75, 0.25], [0.25, 0.75], 2)
    >>> res.status, round(res.alpha, 9)
    ('optimal', 0.6875)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    raise_on_failure = validate_bool(raise_on_failure, "raise_on_failure")
    k = validate_k(k)
    check_lp_size(int(np.count_nonzero(p_)), k)  # before anything is enumerated or allocated
    # The LP is solved on the tokens in a label-free order (ascending p, then q; equal pairs keep their order),
    # and the plan mapped back: optimal plans are not unique, and the vertex the solver returns depended on the
    # token ids, so a relabelled vocabulary got another plan (same acceptance, but another value wherever the
    # plan is used again downstream: SpecTr's draft selection over blocks and trees).
    canon = np.lexsort((q_, p_))
    sets, w = set_weights(p_[canon], k)
    n_sets = len(sets)
    n_cols = sum(len(a) for a in sets)
    sol, m = _membership_lp(sets, w, q_[canon], limit=MAX_REDUCED_SIZE, what="reduced OTM LP")
    if m is None:
        return _failure(sol.status, sol.message, n_cols, k, sol.max_violation, raise_on_failure)
    f, set_of_col, r = m.f, m.key_of, m.r
    token_of_col = canon[m.tok_of]  # back to the caller's token ids
    c_law = np.empty_like(m.c_law)
    c_law[canon] = m.c_law
    sets = [tuple(sorted(canon[list(a)].tolist())) for a in sets]
    violation = sol.max_violation
    alpha = float(math.fsum(f))
    # the plan row of set A is f(A, .) + r(A) c_law: kept factored (sparse f, rank-one
    # rest) instead of a dense (n_sets, n) array, so memory is O(n_cols + n_sets + n)
    rows = _FactoredRows(f, set_of_col, token_of_col, r, c_law)
    # the exact acceptance of the plan as a kernel (rows normalised as in
    # `conditional`): it can exceed sum(f) by rounding-level leftover mass that
    # the independent pairing puts back on a draft token
    tot = rows.sums()
    on_set = np.bincount(set_of_col, weights=f + r[set_of_col] * c_law[token_of_col], minlength=n_sets)
    q_on_set = np.bincount(set_of_col, weights=q_[token_of_col], minlength=n_sets)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(tot > 0, on_set / np.where(tot > 0, tot, 1.0), q_on_set)
    # 1 minus the (non-negative) off-set mass: a probability never above 1 in float64
    plan_acceptance = complement(math.fsum(w * np.maximum(1.0 - frac, 0.0)), lambda: math.fsum(w * np.minimum(frac, 1.0)))
    verifier = OTMPlanVerifier(p_, q_, k, sets, rows, w, plan_acceptance, keyed_by_set=True)
    return OTMResult(
        alpha=alpha,
        status="optimal",
        message=sol.message,
        n_variables=n_cols,
        verifier=verifier,
        success=True,
        k=k,
        max_violation=violation,
    )


def otm_lp_tuples(p, q, k, *, normalize: bool = False, raise_on_failure: bool = False) -> OTMResult:
    r"""SpecTr's OTM-k LP exactly as written: :math:`n^k \times n` variables, via cvxpy + HiGHS.

    .. math::

        \max_{\pi \ge 0} \sum_{x \in \Omega^k} \sum_{y \in S(x)} \pi(x, y)
        \quad\text{s.t.}\quad
        \sum_y \pi(x, y) = \prod_{i=1}^k p(x_i), \qquad
        \sum_x \pi(x, y) = q(y).

    For cross-checks on tiny inputs; use :func:`otm_lp` or
    :func:`alpha_k` otherwise.

    Parameters
    ----------
    p, q : (n,) array_like of float
        Draft and target distributions.
    k : int
        Number of drafts.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.
    raise_on_failure : bool, keyword-only
        Raise :class:`SolverError` instead of returning a failed result.

    Returns
    -------
    OTMResult
        As :func:`otm_lp`, with the verifier keyed by draft tuple.

    Raises
    ------
    ValueError
        If ``n**(k+1)`` exceeds 250,000 variables (the size is in the message).
    ImportError
        If cvxpy is not installed (``pip install 'otspec-verifiers[lp]'``).

    References
    ----------
    .. [1] Sun et al., "SpecTr", NeurIPS 2023, eq. (4).

    Examples
    --------
    >>> import otspec
    >>> res = otspec.otm_lp_tuples([0.75, 0.25], [0.25, 0.75], 2)
    >>> res.status, round(res.alpha, 9)
    ('optimal', 0.6875)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    raise_on_failure = validate_bool(raise_on_failure, "raise_on_failure")
    k = validate_k(k)
    n = p_.shape[0]
    if n > 1 and (k + 1) * math.log(n) > math.log(MAX_TUPLE_VARIABLES) + 30.0:  # no huge n**(k+1)
        raise ValueError(
            f"the tuple OTM LP would have n**(k+1) = {n}**{k + 1} variables (`k`={k}), "
            f"above the limit MAX_TUPLE_VARIABLES={MAX_TUPLE_VARIABLES}; use otm_lp or alpha_k"
        )
    n_vars = n ** (k + 1)
    if n_vars > MAX_TUPLE_VARIABLES:
        raise ValueError(
            f"the tuple OTM LP would have n**(k+1) = {n}**{k + 1} = {n_vars} variables (`k`={k}), "
            f"above the limit MAX_TUPLE_VARIABLES={MAX_TUPLE_VARIABLES}; use otm_lp or alpha_k"
        )
    try:
        import cvxpy as cp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"otm_lp_tuples needs cvxpy: {install_hint('lp')}") from exc
    tuples = list(itertools.product(range(n), repeat=k))
    # the equality-constrained LP needs marginals of exactly equal mass: inputs
    # accepted within the simplex tolerance are rescaled to sum to 1 here
    pn, qn = p_ / math.fsum(p_), q_ / math.fsum(q_)
    px = np.array([math.prod(pn[i] for i in t) for t in tuples])
    member = np.zeros((len(tuples), n))
    for i, t in enumerate(tuples):
        member[i, list(set(t))] = 1.0
    pi = cp.Variable((len(tuples), n), nonneg=True)
    prob = cp.Problem(
        cp.Maximize(cp.sum(cp.multiply(member, pi))),
        [cp.sum(pi, axis=1) == px, cp.sum(pi, axis=0) == qn],
    )
    try:
        # HiGHS presolve wrongly declares some feasible instances with 1e-10
        # entries infeasible at these tolerances (found by hypothesis); these
        # LPs are tiny, so presolve is simply off
        import highspy

        plain, highspy.Highs = highspy.Highs, _quiet_class()  # cvxpy's own instance, silent: no banner at the first
        try:                                                   # LP of a process (as every otspec instance)
            prob.solve(
                solver=cp.HIGHS,
                presolve="off",
                primal_feasibility_tolerance=1e-10,
                dual_feasibility_tolerance=1e-10,
            )
        finally:
            highspy.Highs = plain
    except cp.error.SolverError as exc:
        return _failure("solver_error", str(exc), n_vars, k, float("nan"), raise_on_failure)
    if prob.status != cp.OPTIMAL or pi.value is None:
        return _failure(str(prob.status), f"cvxpy status: {prob.status}", n_vars, k, float("nan"), raise_on_failure)
    plan = np.asarray(pi.value, dtype=np.float64)
    violation = max(
        float(-min(plan.min(), 0.0)),
        float(np.max(np.abs(plan.sum(axis=1) - px))),
        float(np.max(np.abs(plan.sum(axis=0) - qn))),
    )
    if not violation <= LP_CHECK_TOL:
        return _failure(
            "check_failed",
            f"solver reported optimal but the plan violates its marginals by {violation:.3e} "
            f"(tolerance {LP_CHECK_TOL:g})",
            n_vars,
            k,
            violation,
            raise_on_failure,
        )
    plan = np.maximum(plan, 0.0)
    alpha = float(math.fsum((plan * member).ravel()))
    verifier = OTMPlanVerifier(p_, q_, k, tuples, plan, px, alpha, keyed_by_set=False)
    return OTMResult(
        alpha=alpha,
        status="optimal",
        message=f"cvxpy/HiGHS: {prob.status}; re-check passed (max violation {violation:.1e})",
        n_variables=n_vars,
        verifier=verifier,
        success=True,
        k=k,
        max_violation=violation,
    )
