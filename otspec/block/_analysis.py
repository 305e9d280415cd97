r"""Exact expected lengths, Sun et al.'s (arXiv:2403.10444) closed forms, losslessness checks and the block-OT LP.

Counting convention: lengths are numbers of *accepted draft tokens*
:math:`\tau \in \{0, \dots, L\}`. Each iteration emits :math:`\tau + 1` tokens
(the accepted prefix plus one correction or bonus token); Sun et al.'s (arXiv:2403.10444) Bernoulli
formulas sum from :math:`i = 0` and so count :math:`\tau + 1`. Every function
here takes ``include_bonus`` to switch to that count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validation import NEGLIGIBLE, validate_bool, validate_positive_int, validate_probability
from .._verifier import LOSSLESS_TOL, LosslessCheck, validate_tol
from ..models import (
    MAX_AXES,
    MAX_ENUMERATION,
    check_enumeration,
    conditional_tables,
    joint_from_tables,
    size_exceeds,
    size_text,
    validate_model_pair,
)
from ..otm._highs import solve_lp
from ._verifiers import make_verifier

__all__ = [
    "expected_length",
    "theorem1_length",
    "theorem2_length",
    "check_lossless",
    "BlockCheck",
    "bernoulli_token_length",
    "bernoulli_block_length",
    "ot_optimum",
    "BlockOTResult",
    "MAX_LP_VARIABLES",
    "MAX_BERNOULLI_TERMS",
]

#: Largest block-OT LP built by :func:`ot_optimum` (``V**(2L)`` variables).
MAX_LP_VARIABLES = 300_000

def expected_length(draft, target, L, verifier="block", *, include_bonus: bool = False,
                    max_entries: int = MAX_ENUMERATION) -> float:
    r"""Exact expected accepted length of a block verifier, by enumeration of the draft block.

    .. math::

        E[\tau] = \sum_{x^L \in \Omega^L} M_s(x^L) \sum_{t=0}^{L} t\, P(\tau = t \mid X^L = x^L).

    Parameters
    ----------
    draft : Model
        Draft model :math:`M_s` (the package's ``p``).
    target : Model
        Target model :math:`M_b` (the package's ``q``).
    L : int
        Block length (>= 1).
    verifier : {"block", "block-onestep", "token"} or BlockVerifier
        ``"token"``: TokenVerify (arXiv:2403.10444, Algorithm 2); ``"block"``: Sun et al.'s (arXiv:2403.10444)
        Algorithm 3 (block-OT optimal); ``"block-onestep"``: the published
        one-correction-token variant.
    include_bonus : bool, keyword-only
        Count :math:`\tau + 1` (tokens emitted per iteration, Sun et al.'s (arXiv:2403.10444)
        sums from :math:`i = 0`) instead of :math:`\tau`.
    max_entries : int, keyword-only
        Refuse to enumerate more than this many blocks (``V**L``).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Mismatched vocabularies, ``L < 1``, an unknown ``verifier``, rows that
        are not distributions, or ``V**L > max_entries``.

    References
    ----------
    .. [1] Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro, Suresh,
       "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", Theorems 1 and 2, eqs. (6)-(7).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import expected_length
    >>> s, b = MemorylessModel([2/3, 1/3]), MemorylessModel([1/3, 2/3])
    >>> [round(9 * expected_length(s, b, 2, v), 10) for v in ("token", "block-onestep", "block")]
    [10.0, 11.0, 12.0]
    """
    include_bonus = validate_bool(include_bonus, "include_bonus")
    v = make_verifier(draft, target, L, verifier, max_entries=max_entries)
    return v.expected_length(include_bonus=include_bonus)


def _tables_pair(draft, target, L, max_entries):
    validate_model_pair(draft, target)
    L = validate_positive_int(L, "L")
    max_entries = validate_positive_int(max_entries, "max_entries")
    V = draft.vocab_size
    check_enumeration(V, L, max_entries, what="blocks")
    cs = conditional_tables(draft, L, name="draft", max_entries=max_entries)
    cb = conditional_tables(target, L, name="target", max_entries=max_entries)
    return L, cs, cb


def theorem1_length(draft, target, L, *, include_bonus: bool = False,
                    max_entries: int = MAX_ENUMERATION) -> float:
    r"""The block-OT optimum (arXiv:2403.10444, Theorem 1, eq. 6), from its closed form.

    .. math::

        \max_{\pi \in \Pi(M_s^L, M_b^L)} E_\pi[\beta(X^L, Y^L)]
        = \sum_{\ell=1}^{L} \sum_{x^\ell \in \Omega^\ell} \min\{M_s(x^\ell), M_b(x^\ell)\},

    with :math:`\beta` the length of the common prefix of :math:`X^L` and
    :math:`Y^L` and :math:`M(x^\ell)` joint probabilities.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).
    L : int
    include_bonus : bool, keyword-only
        Add 1 (count the emitted extra token, as Sun et al.'s (arXiv:2403.10444) sums from i = 0).
    max_entries : int, keyword-only

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``L < 1``, different vocabularies, or more than ``max_entries`` table entries.
    TypeError
        ``draft`` or ``target`` not a model, ``include_bonus`` not a bool.

    References
    ----------
    .. [1] Sun et al., "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", Theorem 1, eq. (6).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import theorem1_length
    >>> round(9 * theorem1_length(MemorylessModel([2/3, 1/3]), MemorylessModel([1/3, 2/3]), 2), 10)
    12.0
    """
    include_bonus = validate_bool(include_bonus, "include_bonus")
    L, cs, cb = _tables_pair(draft, target, L, max_entries)
    terms = []
    Js, Jb = np.ones(()), np.ones(())
    for ell in range(L):
        Js = Js[..., None] * cs[ell]
        Jb = Jb[..., None] * cb[ell]
        terms.append(math.fsum(np.minimum(Js, Jb).ravel()))
    return math.fsum(terms) + (1.0 if include_bonus else 0.0)


def theorem2_length(draft, target, L, *, include_bonus: bool = False,
                    max_entries: int = MAX_ENUMERATION) -> float:
    r"""TokenVerify's expected accepted length (arXiv:2403.10444, Theorem 2, eq. 7), from its closed form.

    .. math::

        E[\tau_{\rm token}] = \sum_{\ell=1}^{L} \sum_{x^\ell \in \Omega^\ell}
        \prod_{i=1}^{\ell} \min\{M_s(x_i \mid x^{i-1}), M_b(x_i \mid x^{i-1})\}.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).
    L : int
    include_bonus : bool, keyword-only
        Add 1 (count the emitted extra token).
    max_entries : int, keyword-only

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``L < 1``, different vocabularies, or more than ``max_entries`` table entries.
    TypeError
        ``draft`` or ``target`` not a model, ``include_bonus`` not a bool.

    References
    ----------
    .. [1] Sun et al., "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", Theorem 2, eq. (7).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import theorem2_length
    >>> round(9 * theorem2_length(MemorylessModel([2/3, 1/3]), MemorylessModel([1/3, 2/3]), 2), 10)
    10.0
    """
    include_bonus = validate_bool(include_bonus, "include_bonus")
    L, cs, cb = _tables_pair(draft, target, L, max_entries)
    terms = []
    P = np.ones(())
    for ell in range(L):
        P = P[..., None] * np.minimum(cs[ell], cb[ell])
        terms.append(math.fsum(P.ravel()))
    return math.fsum(terms) + (1.0 if include_bonus else 0.0)


@dataclass(frozen=True, eq=False)
class BlockCheck(LosslessCheck):
    """Result of :func:`check_lossless` for a block verifier (exact enumeration over draft blocks).

    The core fields are those of :class:`otspec.LosslessCheck`: ``law`` is
    the verifier's exact output law over sequences of length ``L + 1``
    (``bonus=True``) or ``L``, of shape ``(V,) * length``; ``target_law`` the
    target model's joint law on the same sequences; ``n_cases`` the number of
    draft blocks ``V**L`` enumerated.

    Attributes
    ----------
    verifier : str
        The block verifier's name.
    bonus : bool
        Whether the sequences include the bonus / completion token.
    """

    verifier: str
    bonus: bool


def check_lossless(draft, target, L, verifier="block", *, bonus: bool = True,
                   max_entries: int = MAX_ENUMERATION, tol: float = LOSSLESS_TOL) -> BlockCheck:
    r"""Largest error between a block verifier's exact output law and the target model's joint law.

    .. math::

        \max_{y} \Big| \sum_{x^L} M_s(x^L) \sum_{t=0}^{L} P(\tau = t \mid x^L)\,
        \mathbb 1\{y^t = x^t\}\, C_t(y_{t+1:} \mid y^t) - M_b(y) \Big|,

    over output sequences :math:`y` of length ``L + 1`` (``bonus=True``: the
    accepted prefix, the verifier's correction, the target model's
    continuation, and the bonus token after a fully accepted block) or
    ``L`` (``bonus=False``). :math:`C_t` is the verifier's continuation after
    :math:`\tau = t` completed by :math:`M_b`. The target joint law is built
    independently from the target's conditionals.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``); with
        ``bonus=True`` the target must generate ``L + 1`` tokens.
    L : int
    verifier : {"block", "block-onestep", "token"} or BlockVerifier
    bonus : bool, keyword-only
    max_entries : int, keyword-only
        Refuse when ``V**(L+1)`` (or ``V**L``) exceeds it.
    tol : float, keyword-only
        ``passed`` is ``max_error <= tol`` (default 1e-9).

    Returns
    -------
    BlockCheck
        ``max_error`` is the largest absolute error (0 up to rounding for the
        three verifiers); ``law`` and ``target_law`` the laws compared.

    Raises
    ------
    ValueError
        ``L < 1``, an unknown verifier name, a verifier built for other models,
        different vocabularies, a table larger than ``max_entries``, or a target
        that cannot generate ``L + 1`` tokens with ``bonus=True``.
    TypeError
        ``draft`` or ``target`` not a model, ``bonus`` not a bool.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", arXiv:2403.10444 v1, Lemma 2 (correctness of Algorithm 3).

    Examples
    --------
    >>> from otspec.models import random_table_model
    >>> from otspec.block import check_lossless
    >>> s = random_table_model(3, 4, concentration=0.5, rng=1)
    >>> b = random_table_model(3, 4, concentration=0.5, rng=2)
    >>> all(check_lossless(s, b, 3, v).max_error < 1e-14 for v in ("token", "block", "block-onestep"))
    True
    """
    bonus = validate_bool(bonus, "bonus")
    tol = validate_tol(tol)
    v = make_verifier(draft, target, L, verifier, max_entries=max_entries)
    law = v.output_law(bonus=bonus)
    length = v.L + 1 if bonus else v.L
    ref = joint_from_tables(conditional_tables(target, length, name="target", max_entries=max_entries))
    max_error = float(np.max(np.abs(law - ref)))
    return BlockCheck(
        passed=bool(max_error <= tol), max_error=max_error, law=law, target_law=ref,
        method="enumeration", n_cases=int(law.shape[0]) ** v.L, verifier=v.name, bonus=bonus,
    )


# ---------------------------------------------------------------------------
# memoryless Bernoulli sources (arXiv:2403.10444, Section 3.1, Figure 2)
# ---------------------------------------------------------------------------


def _bernoulli_args(p, q, L):
    # subnormal probabilities are exactly 0 (as in every law, see otspec._validation.NEGLIGIBLE):
    # the binomial CDFs overflow on them and they carry no mass
    p = validate_probability(p, "p")
    q = validate_probability(q, "q")
    p, q = (0.0 if v < NEGLIGIBLE else v for v in (p, q))
    L = validate_positive_int(L, "L")
    return p, q, L


def bernoulli_token_length(p, q, L, *, include_bonus: bool = False) -> float:
    r"""TokenVerify's expected accepted length for memoryless Bernoulli sources.

    .. math::

        E[\tau_{\rm token}] = \sum_{i=1}^{L} \big(1 - d_{TV}(\mathrm{Ber}(p), \mathrm{Ber}(q))\big)^i,
        \qquad d_{TV} = |p - q|,

    for a draft :math:`M_s = \mathrm{Ber}(p)` and a target
    :math:`M_b = \mathrm{Ber}(q)` at every step. The paper prints the sum from
    :math:`i = 0`, which adds 1 (the emitted correction or bonus token):
    ``include_bonus=True`` gives that.

    Parameters
    ----------
    p : float
        Draft's probability of token 1, in [0, 1].
    q : float
        Target's probability of token 1, in [0, 1].
    L : int
    include_bonus : bool, keyword-only

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``p`` or ``q`` outside [0, 1], or ``L < 1``.
    TypeError
        ``include_bonus`` not a bool, or a non-numeric argument.

    References
    ----------
    .. [1] Sun et al., "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", Section 3.1 and Figure 2.

    Examples
    --------
    >>> from otspec.block import bernoulli_token_length
    >>> bernoulli_token_length(0.5, 0.75, 2)
    1.3125
    """
    p, q, L = _bernoulli_args(p, q, L)
    include_bonus = validate_bool(include_bonus, "include_bonus")
    d = abs(p - q)  # a = 1 - d; sum_{i=1}^{L} a^i = a (1 - a^L) / d, closed form in L
    a = min(p, q) + (1.0 - max(p, q))  # the overlap itself: 1 - max is exact (max >= 1/2 whenever a < 1/2)
    if d == 0.0:
        total = float(L)
    elif d <= 0.5 or a == 1.0 - d:  # 1 - d as exact as the overlap (the earlier bits)
        total = (1.0 - d) * -math.expm1(L * math.log1p(-d)) / d if d < 1.0 else 0.0
    else:
        # p - q rounded (p, q not within a factor 2) and 1 - d lost the low bits of a small overlap:
        # p = 1, q = 1e-16 gave 1.11e-16 for a = 1e-16, above block verification's optimum
        total = a * -math.expm1(L * math.log(a)) / d if a > 0.0 else 0.0
    return total + (1.0 if include_bonus else 0.0)


#: Largest number of terms :func:`bernoulli_block_length` sums before its tail bound
#: (below) is under rounding; reached only for near-equal ``p``, ``q`` and huge ``L``.
MAX_BERNOULLI_TERMS = 1_000_000


def _overlap_terms(p: float, q: float, i: np.ndarray) -> np.ndarray:
    r""":math:`1 - d_{TV}(\mathrm{Bin}(i, p), \mathrm{Bin}(i, q))` for each ``i``, in O(1) each (``p < q``).

    The likelihood ratio of the two binomials is monotone in the number of ones
    ``j``: :math:`\mathrm{Bin}(i,p)_j \ge \mathrm{Bin}(i,q)_j` iff :math:`j \le t_i`,
    :math:`t_i = i \ln\frac{1-p}{1-q} / \ln\frac{q(1-p)}{p(1-q)}`, so
    :math:`\sum_j \min = F_q(\lfloor t_i \rfloor) + 1 - F_p(\lfloor t_i \rfloor)`
    with binomial CDFs (regularised incomplete beta functions).
    """
    from scipy import stats

    if p == 0.0:
        return np.exp(i * math.log1p(-q)) if q < 1.0 else np.zeros(i.shape)  # (1 - q)^i
    if q == 1.0:
        return np.exp(i * math.log(p))  # p^i
    slope = math.log1p(-p) - math.log1p(-q)
    slope /= math.log(q) - math.log(p) + slope
    m = np.floor(i * slope)
    return stats.binom.cdf(m, i, q) + stats.binom.sf(m, i, p)


def bernoulli_block_length(p, q, L, *, include_bonus: bool = False) -> float:
    r"""The block-OT optimum for memoryless Bernoulli sources (arXiv:2403.10444, Theorem 1).

    .. math::

        E[\tau_{\rm block}] = \sum_{i=1}^{L} \big(1 - d_{TV}(\mathrm{Bin}(i, p), \mathrm{Bin}(i, q))\big),

    since :math:`\sum_{x^i} \min(M_s(x^i), M_b(x^i))` only depends on the
    number of ones in :math:`x^i`. ``include_bonus=True`` adds the
    :math:`i = 0` term (1), as printed in the paper.

    Each term costs O(1) (two binomial CDFs at the crossing of the two laws),
    and the sum stops once the rest is below rounding: the terms are at most
    :math:`\rho^i` with the Bhattacharyya coefficient
    :math:`\rho = \sqrt{pq} + \sqrt{(1-p)(1-q)} < 1` for :math:`p \ne q`
    (:math:`\min(a, b) \le \sqrt{ab}`), so the tail after ``I`` terms is at
    most :math:`\rho^{I+1}/(1-\rho)`. ``L = 10**15`` answers at once unless
    ``p`` and ``q`` are so close that more than ``MAX_BERNOULLI_TERMS`` terms
    are needed, which is refused.

    Parameters
    ----------
    p : float
        Draft's probability of token 1, in [0, 1].
    q : float
        Target's probability of token 1, in [0, 1].
    L : int
    include_bonus : bool, keyword-only

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``p``, ``q`` outside [0, 1], ``L < 1``, or more than
        ``MAX_BERNOULLI_TERMS`` terms needed (``p`` and ``q`` within about
        ``sqrt(300 / MAX_BERNOULLI_TERMS)`` of each other and ``L`` beyond it).
    TypeError
        ``include_bonus`` not a bool, or a non-numeric argument.

    References
    ----------
    .. [1] Sun et al., "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", Section 3.1 and Figure 2.

    Examples
    --------
    >>> from otspec.block import bernoulli_block_length
    >>> round(bernoulli_block_length(0.5, 0.75, 2), 12)
    1.4375
    >>> round(bernoulli_block_length(0.5, 0.75, 10**15), 6)
    13.784401
    """
    p, q, L = _bernoulli_args(p, q, L)
    include_bonus = validate_bool(include_bonus, "include_bonus")
    bonus = 1.0 if include_bonus else 0.0
    if p == q:
        return float(L) + bonus
    p, q = min(p, q), max(p, q)  # the overlap is symmetric in (p, q)
    if p == 0.0 and q == 1.0:  # disjoint point masses: every term is 0 (the loop below took log(rho = 0))
        return 0.0 + bonus
    rho = math.sqrt(p * q) + math.sqrt((1.0 - p) * (1.0 - q))
    # terms needed a priori: the tail bound rho^I / (1 - rho) falls below 1e-17 times the first
    # term 1 - |p - q| (a lower bound of the sum) after `needed` terms; refuse before any work
    first = 1.0 - (q - p)
    if rho < 1.0 and first > 0.0:
        needed = math.log(1e-17 * (1.0 - rho) * first) / math.log(rho)
    else:
        needed = math.inf
    if min(L, needed) > MAX_BERNOULLI_TERMS:
        raise ValueError(
            f"`L`={L} needs about {min(L, needed):.3g} terms for p={p!r}, q={q!r} (the terms decay like "
            f"{rho!r}**i), above the limit MAX_BERNOULLI_TERMS={MAX_BERNOULLI_TERMS}"
        )
    terms: list[float] = []
    start, chunk = 1, 4096
    while start <= L:
        if rho < 1.0 and terms:
            # tail sum_{i >= start} rho^i <= rho^start / (1 - rho): stop below rounding
            tail = math.exp(start * math.log(rho)) / (1.0 - rho)
            if tail <= 1e-17 * math.fsum(terms):
                break
        if start - 1 >= MAX_BERNOULLI_TERMS:
            raise ValueError(
                f"`L`={L} needs more than MAX_BERNOULLI_TERMS={MAX_BERNOULLI_TERMS} terms for p={p!r}, "
                f"q={q!r} (the terms decay like {rho!r}**i)"
            )
        stop = min(L, start + chunk - 1, MAX_BERNOULLI_TERMS + 1)
        terms.extend(_overlap_terms(p, q, np.arange(start, stop + 1, dtype=np.float64)).tolist())
        start, chunk = stop + 1, min(4 * chunk, 1_000_000)
    return math.fsum(terms) + bonus


# ---------------------------------------------------------------------------
# the block OT linear program (arXiv:2403.10444, eq. 3)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class BlockOTResult:
    """Result of :func:`ot_optimum`.

    Attributes
    ----------
    value : float
        Optimal :math:`E_\\pi[\\beta(X^L, Y^L)]` (``nan`` on failure).
    status : str
        ``"optimal"``, a HiGHS model status name, or ``"check_failed"``.
    success : bool
    plan : ndarray or None
        Optimal coupling, shape ``(V**L, V**L)``: rows index draft blocks,
        columns output blocks, both in lexicographic order.
    max_violation : float
        Largest marginal / sign violation of the solver's solution.
    n_variables : int
        ``V**(2L)``.
    message : str
    """

    value: float
    status: str
    success: bool
    plan: np.ndarray | None
    max_violation: float
    n_variables: int
    message: str


def _common_prefix(V: int, L: int) -> np.ndarray:
    """``beta[a, b]``: length of the common prefix of blocks number ``a`` and ``b``."""
    idx = np.indices((V,) * L).reshape(L, -1).T  # (V**L, L) lexicographic
    eq = idx[:, None, :] == idx[None, :, :]
    return np.cumprod(eq, axis=2).sum(axis=2).astype(np.float64)


def ot_optimum(draft, target, L, *, max_variables: int = MAX_LP_VARIABLES,
               raise_on_failure: bool = False) -> BlockOTResult:
    r"""Solve the block-level optimal-transport LP (arXiv:2403.10444, eq. 3) with HiGHS.

    .. math::

        \max_{\pi \ge 0} \sum_{x^L, y^L} \pi(x^L, y^L)\, \beta(x^L, y^L)
        \quad\text{s.t.}\quad
        \sum_{y^L} \pi(x^L, y^L) = M_s(x^L), \qquad
        \sum_{x^L} \pi(x^L, y^L) = M_b(y^L),

    with :math:`\beta(x^L, y^L) = \max\{\ell : x^\ell = y^\ell\}` the common
    prefix length. This has :math:`V^{2L}` variables, so it is only for tiny
    ``V`` and ``L``; its value must equal :func:`theorem1_length`. After the
    solve the plan is re-checked (signs, both marginals and the objective
    within 1e-9); a violation is reported as ``status="check_failed"``.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).
    L : int
    max_variables : int, keyword-only
        Refuse (ValueError, before building anything) above this many variables.
    raise_on_failure : bool, keyword-only
        Raise :class:`otspec.SolverError` instead of returning a failed result.

    Returns
    -------
    BlockOTResult

    Raises
    ------
    ValueError
        Invalid models or ``L``, or ``V**(2L) > max_variables``.

    References
    ----------
    .. [1] Sun et al., "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", eq. (3) and Theorem 1.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import ot_optimum
    >>> res = ot_optimum(MemorylessModel([2/3, 1/3]), MemorylessModel([1/3, 2/3]), 2)
    >>> res.status, round(9 * res.value, 8)
    ('optimal', 12.0)
    """
    V = validate_model_pair(draft, target)
    L = validate_positive_int(L, "L")
    max_variables = validate_positive_int(max_variables, "max_variables")
    raise_on_failure = validate_bool(raise_on_failure, "raise_on_failure")
    if 2 * L > MAX_AXES or size_exceeds(V, 2 * L, max_variables):
        raise ValueError(
            f"the block OT LP has V**(2L) = {V}**{2 * L} = {size_text(V, 2 * L)} variables, above the "
            f"stated limit `max_variables`={max_variables}"
        )
    n = V**L
    n_var = n * n
    ps = joint_from_tables(conditional_tables(draft, L, name="draft")).ravel()
    pb = joint_from_tables(conditional_tables(target, L, name="target")).ravel()
    beta = _common_prefix(V, L).ravel()  # column j = a * n + b
    cols = np.arange(n_var)
    a_idx, b_idx = np.divmod(cols, n)
    index = np.empty(2 * n_var, dtype=np.int32)
    index[0::2] = a_idx
    index[1::2] = n + b_idx
    starts = np.arange(0, 2 * n_var + 1, 2, dtype=np.int32)
    rhs = np.concatenate([ps, pb])

    sol = solve_lp(beta, starts, index, np.ones(2 * n_var), rhs, rhs)
    if not sol.success:
        if raise_on_failure:
            sol.raise_for_status("block OT LP")
        return BlockOTResult(float("nan"), sol.status, False, None, sol.max_violation, n_var, sol.message)
    plan, value, violation = sol.x.reshape(n, n), sol.objective, sol.max_violation
    return BlockOTResult(
        value=value,
        status="optimal",
        success=True,
        plan=plan,
        max_violation=violation,
        n_variables=n_var,
        message=sol.message,
    )

