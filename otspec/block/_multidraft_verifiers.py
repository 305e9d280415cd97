r"""Verifiers of ``k`` draft blocks and every scheme a practitioner compares, exactly.

* :class:`MultiDraftPlanVerifier` -- the optimal coupling of
  :func:`multidraft_ot` run as a sampler: given the drafts it draws the whole
  target block :math:`Y \sim \pi(\cdot \mid A)` and emits it (the accepted
  prefix :math:`\max_i \operatorname{lcp}(X^i, Y)`, then the rest of
  :math:`Y` as a multi-token residual, then a bonus token). Lossless, and
  :math:`\mathbb E[\tau] = \mathrm{OPT}` exactly: no lossless verifier of
  ``k`` i.i.d. draft blocks accepts more. Like Sun et al.'s v1 block
  verification (arXiv:2403.10444 v1, Algorithm 3), whose residual it
  generalises, it needs the target's law off the drafted tree.
* :func:`one_token_optimum` -- the best expected accepted length of a
  lossless verifier that emits an accepted draft prefix and *one* token
  (then the target continues): the class of SpecTr over sequences, block
  verification with one correction token and the multi-path verifiers that
  decoders run, as an LP over all such verifiers (any information allowed).
* :func:`compare_schemes` -- every scheme on the same models: the bounds,
  SpecTr over sequences (Sun et al., arXiv:2310.15141, Algorithm 3) with
  each token-level rule per depth, the best per-depth plan (dynamic
  programme), block verification and token verification on one draft, with
  exact expected accepted length and losslessness checked by enumeration.

Lengths count accepted draft tokens :math:`\tau \in \{0, \dots, L\}`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .._registry import VerifierSpec, register_verifier, unknown_name_message
from .._validation import as_rng, validate_bool
from .._verifier import sample_from, sample_from_cdf
from ..models import conditional_tables, joint_from_tables, next_law, validate_sequence
from ..otm._highs import solve_lp
from ..spectr import block_efficiency, optimal_block_efficiency
from ..spectr import check_lossless as spectr_check
from ._analysis import check_lossless, expected_length
from ._multidraft import (
    MAX_MULTIDRAFT_VARIABLES,
    MultiDraftOTResult,
    _block_sets,
    _check_args,
    _prefix_laws,
    check_multidraft_size,
    multidraft_ot,
)

__all__ = [
    "MultiDraftPlanVerifier",
    "MultiDraftSample",
    "OneTokenResult",
    "OneTokenVerifier",
    "SchemeComparison",
    "SchemeRow",
    "SCHEMES",
    "compare_schemes",
    "one_token_optimum",
]


@dataclass(frozen=True)
class MultiDraftSample:
    """``k`` draft blocks and their verification (:meth:`MultiDraftPlanVerifier.sample`).

    Attributes
    ----------
    drafts : tuple of tuple of int
        The ``k`` draft blocks (empty when given to :meth:`~MultiDraftPlanVerifier.verify`).
    tau : int
        Accepted draft tokens: the longest common prefix of the output with any draft.
    output : tuple of int
        ``L + 1`` tokens: the target block drawn from the plan and a bonus token from the target.
    """

    drafts: tuple
    tau: int
    output: tuple


class MultiDraftPlanVerifier:
    r"""The optimal multi-draft block coupling as a lossless sampler with exact laws.

    .. math::

        P(Y = y \mid X^1, \dots, X^k) = \pi(A, y) / w(A), \qquad
        A = \{X^1, \dots, X^k\},\quad
        \tau = \max_i \operatorname{lcp}(X^i, Y),

    with :math:`\pi` the repaired optimal plan of :func:`multidraft_ot`. The
    output :math:`(Y, Z)`, :math:`Z \sim M_b(\cdot \mid Y)`, follows the
    target's joint law of ``L + 1`` tokens (to float rounding: the plan's
    marginals are exact to about 1e-16), and
    :math:`\mathbb E[\tau] = \mathrm{OPT}`.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).
    L, k : int
        Block length and number of draft blocks.
    result : MultiDraftOTResult or None, keyword-only
        A solved LP for these models (solved here when None).

    Raises
    ------
    ValueError
        As :func:`multidraft_ot`, or a ``result`` for other ``L``, ``k`` or vocabulary, or a failed one.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", arXiv:2403.10444 v1, Algorithm 3 and Theorem 1 (the ``k = 1`` case).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import MultiDraftPlanVerifier
    >>> v = MultiDraftPlanVerifier(MemorylessModel([3/4, 1/4]), MemorylessModel([1/2, 1/2]), 2, 2)
    >>> round(128 * v.expected_length(), 9)
    231.0
    >>> s = v.sample(rng=0)
    >>> len(s.drafts), len(s.output)
    (2, 3)
    """

    name = "multidraft-plan"

    def __init__(self, draft, target, L, k, *, result: MultiDraftOTResult | None = None):
        V, L, k = _check_args(draft, target, L, k)
        if result is None:
            result = multidraft_ot(draft, target, L, k, raise_on_failure=True)
        if not isinstance(result, MultiDraftOTResult):
            raise TypeError(f"`result` must be a MultiDraftOTResult, got {type(result).__name__}")
        if not result.success:
            raise ValueError(f"`result` is a failed solve ({result.status})")
        if (result.V, result.L, result.k) != (V, L, k):
            raise ValueError(
                f"`result` was solved for V={result.V}, L={result.L}, k={result.k}, not V={V}, L={L}, k={k}"
            )
        self.draft, self.target, self.V, self.L, self.k = draft, target, V, L, k
        self.result = result
        self._index = {key: i for i, key in enumerate(result.keys)}
        self._laws: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}
        rows = result.plan.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            self._cond = np.where(rows > 0, result.plan / np.where(rows > 0, rows, 1.0), result.target_law)

    def _draw(self, role: str, prefix: tuple[int, ...], gen) -> int:
        """One token from the model's conditional after ``prefix`` (validated once, then cached)."""
        entry = self._laws.get((role, prefix))
        if entry is None:
            law = next_law(self.draft if role == "draft" else self.target, prefix, self.V, role)
            entry = self._laws[(role, prefix)] = (np.cumsum(law), law)
        return sample_from_cdf(entry[0], entry[1], gen)

    def _key(self, drafts) -> tuple[int, ...]:
        blocks = [validate_sequence(b, self.V, "drafts") for b in drafts]
        if len(blocks) != self.k or any(len(b) != self.L for b in blocks):
            raise ValueError(f"`drafts` must be {self.k} blocks of length {self.L}, got {drafts!r}")
        return tuple(sorted({int(np.ravel_multi_index(b, (self.V,) * self.L)) for b in blocks}))

    def conditional(self, drafts) -> np.ndarray:
        """Exact law of the target block given the drafts, shape ``(V**L,)`` (lexicographic blocks)."""
        i = self._index.get(self._key(drafts))
        return np.array(self.result.target_law if i is None else self._cond[i])

    def verify(self, drafts, *, rng=None) -> MultiDraftSample:
        """Verify given draft blocks: draw the target block from the plan, then the bonus token."""
        gen = as_rng(rng)
        key = self._key(drafts)
        i = self._index.get(key)
        law = self.result.target_law if i is None else self._cond[i]
        y = sample_from(law, gen)
        block = tuple(int(v) for v in np.unravel_index(y, (self.V,) * self.L))
        tau = int(self.result.reward[i, y]) if i is not None else 0
        bonus = self._draw("target", block, gen)
        return MultiDraftSample((), tau, block + (int(bonus),))

    def sample_drafts(self, *, rng=None) -> tuple:
        """``k`` i.i.d. draft blocks from the draft model."""
        gen = as_rng(rng)
        out = []
        for _ in range(self.k):
            b: tuple[int, ...] = ()
            for _ in range(self.L):
                b += (self._draw("draft", b, gen),)
            out.append(b)
        return tuple(out)

    def sample(self, *, rng=None) -> MultiDraftSample:
        """Draw ``k`` draft blocks and verify them."""
        gen = as_rng(rng)
        drafts = self.sample_drafts(rng=gen)
        s = self.verify(drafts, rng=gen)
        return MultiDraftSample(drafts, s.tau, s.output)

    def tau_law(self) -> np.ndarray:
        r"""Exact :math:`P(\tau = t)`, ``t = 0..L``."""
        plan = self.result.plan
        law = np.bincount(self.result.reward.astype(np.int64).ravel(), weights=plan.ravel(), minlength=self.L + 1)
        return law / law.sum()

    def expected_length(self, *, include_bonus: bool = False) -> float:
        r"""Exact :math:`\mathbb E[\tau]` (``+ 1`` with ``include_bonus``): OPT."""
        include_bonus = validate_bool(include_bonus, "include_bonus")
        law = self.tau_law()
        return math.fsum((law * np.arange(self.L + 1)).tolist()) + (1.0 if include_bonus else 0.0)

    def output_law(self, *, bonus: bool = True) -> np.ndarray:
        """Exact law of the output, shape ``(V,) * (L + 1)`` (``(V,) * L`` without the bonus)."""
        bonus = validate_bool(bonus, "bonus")
        w = self.result.weights[:, None] * self._cond
        law = w.sum(axis=0).reshape((self.V,) * self.L)
        if not bonus:
            return law
        cb = conditional_tables(self.target, self.L + 1, name="target")[self.L]
        return law[..., None] * cb

    def max_error(self) -> float:
        """Largest error of :meth:`output_law` against the target's joint law of ``L + 1`` tokens."""
        ref = joint_from_tables(conditional_tables(self.target, self.L + 1, name="target"))
        return float(np.max(np.abs(self.output_law() - ref)))


# ---------------------------------------------------------------------------
# the best verifier that emits one token after the accepted prefix
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class OneTokenResult:
    r"""Result of :func:`one_token_optimum`.

    Attributes
    ----------
    value : float
        The optimum :math:`\mathbb E[\tau]` (``nan`` on failure).
    status : str
    success : bool
    n_variables : int
    max_violation : float
    message : str
    """

    value: float
    status: str
    success: bool
    n_variables: int
    max_violation: float
    message: str


def one_token_optimum(draft, target, L, k) -> OneTokenResult:
    r"""The best lossless verifier of ``k`` draft blocks that emits an accepted prefix and one token.

    .. math::

        \max_{f \ge 0} \sum_{A} \sum_{w} f(A, w)\,(|w| - 1)
        \quad\text{s.t.}\quad
        \sum_w f(A, w) \le w(A), \qquad
        \sum_{t=0}^{L} \frac{\sum_A f(A, y^{t+1})}{M_b(y^{t+1})} = 1
        \ \ \forall y \in \Omega^{L+1},

    where the verifier, given the set :math:`A` of drafted blocks, emits
    :math:`w = (x^t, z)` with :math:`x^t` a depth-:math:`t` prefix of a block
    of :math:`A` and any token :math:`z`, and the target continues from
    :math:`w`. The equality says that the emitted string completed by the
    target has the target's law of ``L + 1`` tokens (lossless); it allows
    any information (off-path target probabilities included), so it bounds
    SpecTr over sequences, block verification with one correction token and
    every multi-path verifier that a decoder can run. For ``k = 1`` it equals
    the one-step block verification of Sun et al. (published version of
    arXiv:2403.10444) — the optimality that Thomas and Pal
    (arXiv:2602.16961, abstract) state over verifiers using off-path
    probabilities.

    Parameters
    ----------
    draft, target : Model
    L, k : int

    Returns
    -------
    OneTokenResult

    Raises
    ------
    ValueError
        As :func:`multidraft_ot`.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Block Verification Accelerates Speculative Decoding" (published
       version of arXiv:2403.10444), one-correction-token block verification.
    .. [2] Thomas, Pal, "Greedy Multi-Path Block Verification for Faster Decoding in Speculative
       Sampling", arXiv:2602.16961 (abstract: an information-agnostic LP).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import one_token_optimum
    >>> s, b = MemorylessModel([2/3, 1/3]), MemorylessModel([1/3, 2/3])
    >>> round(9 * one_token_optimum(s, b, 2, 1).value, 7)  # one-step block verification: 11/9
    11.0
    """
    lp = _one_token_lp(draft, target, L, k)
    sol = lp.sol
    if not sol.success:
        return OneTokenResult(math.nan, sol.status, False, lp.n_var, sol.max_violation, sol.message)
    return OneTokenResult(sol.objective, "optimal", True, lp.n_var, sol.max_violation, sol.message)


@dataclass(frozen=True, eq=False)
class _OneTokenLP:
    """The solved one-token LP: ``f`` per column ``(f_key, level f_t, prefix index f_u)`` and the problem."""

    sol: object
    n_var: int
    V: int
    L: int
    keys: list
    weights: np.ndarray
    f: np.ndarray
    f_key: np.ndarray
    f_t: np.ndarray
    f_u: np.ndarray
    cb: list


def _one_token_lp(draft, target, L, k) -> _OneTokenLP:
    V, L, k = _check_args(draft, target, L, k)
    check_multidraft_size(V, L, k, MAX_MULTIDRAFT_VARIABLES, "MAX_MULTIDRAFT_VARIABLES")
    Ps, _ = _prefix_laws(draft, target, L)
    cb = conditional_tables(target, L + 1, name="target")
    keys, wA, _ = _block_sets(Ps[-1] / math.fsum(Ps[-1]), k)
    allowed = []
    for key in keys:
        blocks = [np.unravel_index(b, (V,) * L) for b in key]
        allowed.append([
            (t, int(np.ravel_multi_index(pre, (V,) * t)) if t else 0)
            for t in range(L + 1)
            for pre in {tuple(int(x[j]) for j in range(t)) for x in blocks}
        ])
    return solve_one_token_lp(allowed, wA, cb, V, L, keys)


def solve_one_token_lp(allowed, weights, cb, V: int, L: int, keys) -> _OneTokenLP:
    r"""The one-token LP of :func:`one_token_optimum` for any keyed draft law.

    .. math::

        \max_{f, h \ge 0} \sum_{a, w} f(a, w)\,(|w| - 1)
        \quad\text{s.t.}\quad \sum_w f(a, w) \le \mathrm{weights}[a],\quad
        \sum_a f(a, w) = M_b(w)\, h(w),\quad
        \sum_{t=0}^{L} h(y^{t+1}) = 1\ \ \forall y: M_b(y) > 0,

    over emitted strings :math:`w = (u, z)` with :math:`u` an accepted prefix
    of key :math:`a` (``allowed[a]``: pairs ``(t, index)`` of a depth-``t``
    prefix, lexicographic index in :math:`V^t`; ``(0, 0)`` is the empty
    prefix) and any token :math:`z`. ``cb[t]``: the target's conditional
    tables, shape ``(V,) * (t + 1)``, ``t = 0..L``. Solved by the package's
    HiGHS helper (presolve off on a failed first try).
    """
    # emitted strings w of length 1..L+1, indexed per length; Mb(w)
    Jb, offs = [np.ones(())], []
    for ell in range(L + 1):
        Jb.append(Jb[-1][..., None] * cb[ell])
    off = 0
    for t in range(L + 1):
        offs.append(off)
        off += V ** (t + 1)
    n_w = off
    mb_w = np.concatenate([Jb[t + 1].ravel() for t in range(L + 1)])
    # f columns: (key, w) with w = (u, z), u an allowed prefix of the key
    f_key, f_w, f_cost = [], [], []
    for a, prefixes in enumerate(allowed):
        for t, u in prefixes:
            for z in range(V):
                f_key.append(a)
                f_w.append(offs[t] + u * V + z)
                f_cost.append(float(t))
    nf, nk = len(f_key), len(weights)
    # h columns: h(w) = G(w) / Mb(w), one per w with Mb(w) > 0 (others fixed at 0)
    # rows: keys (<= w(A)), w-balance (sum_A f - Mb(w) h = 0), y (sum_t h(y^{t+1}) = 1)
    idx, val, starts = [], [], [0]
    for a, wi in zip(f_key, f_w):
        idx += [a, nk + wi]
        val += [1.0, 1.0]
        starts.append(len(idx))
    ys = np.indices((V,) * (L + 1)).reshape(L + 1, -1).T
    y_rows_of_w: list[list[int]] = [[] for _ in range(n_w)]
    for yi, y in enumerate(ys):
        for t in range(L + 1):
            wi = offs[t] + int(np.ravel_multi_index(tuple(y[: t + 1]), (V,) * (t + 1)))
            y_rows_of_w[wi].append(yi)
    for wi in range(n_w):
        idx.append(nk + wi)
        val.append(-mb_w[wi])
        for yi in y_rows_of_w[wi]:
            idx.append(nk + n_w + yi)
            val.append(1.0)
        starts.append(len(idx))
    cost = np.concatenate([np.array(f_cost), np.zeros(n_w)])
    upper = np.concatenate([np.full(nf, np.inf), np.where(mb_w > 0, np.inf, 0.0)])
    mb_y = Jb[L + 1].ravel()
    lo = np.concatenate([np.full(nk, -np.inf), np.zeros(n_w), np.where(mb_y > 0, 1.0, -np.inf)])
    hi = np.concatenate([weights, np.zeros(n_w), np.where(mb_y > 0, 1.0, np.inf)])
    args = (cost, np.array(starts), np.array(idx), np.array(val), lo, hi)
    sol = solve_lp(*args, col_upper=upper)
    if not sol.success:  # HiGHS's presolve has declared badly scaled feasible LPs infeasible: retry without it
        sol = solve_lp(*args, col_upper=upper, presolve=False)
    f_key_, f_w_ = np.array(f_key, dtype=np.int64), np.array(f_w, dtype=np.int64)
    f_t = np.searchsorted(np.array(offs), f_w_, side="right") - 1
    f_u = (f_w_ - np.array(offs)[f_t]) // V
    f = np.maximum(sol.x[:nf], 0.0) if sol.success else np.empty(0)
    return _OneTokenLP(sol, nf + n_w, V, L, list(keys), np.asarray(weights, dtype=np.float64), f, f_key_, f_t,
                       f_u, cb)


def _through(a: np.ndarray, V: int, L: int, offs: np.ndarray) -> list[np.ndarray]:
    """``through[t][u]``: accepted mass of prefixes extending the level-``t`` prefix ``u`` (itself included)."""
    out = []
    for t in range(L + 1):
        acc = np.zeros(V**t)
        for s in range(t, L + 1):
            acc += a[int(offs[s]):int(offs[s + 1])].reshape(V**t, V ** (s - t)).sum(axis=1)
        out.append(acc)
    return out


def _repair(e: np.ndarray, cb, V: int, L: int, offs: np.ndarray) -> np.ndarray:
    """Enforce ``through(u z) <= M_b(z | u) through(u)`` top-down by scaling subtrees into their parent."""
    def level(s):
        return slice(int(offs[s]), int(offs[s + 1]))

    for t in range(L):
        th = _through(e.sum(axis=0), V, L, offs)
        cap = cb[t].reshape(V**t, V) * th[t][:, None]
        child = th[t + 1].reshape(V**t, V)
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.where(child > cap, cap / np.where(child > 0, child, 1.0), 1.0).ravel()  # per level-t+1 prefix
        if np.all(c == 1.0):
            continue
        for s in range(t + 1, L + 1):
            cs = np.repeat(c, V ** (s - t - 1))
            blk = e[:, level(s)]
            moved = blk * (1.0 - cs)
            e[:, level(s)] = blk * cs
            e[:, level(t)] += moved.reshape(e.shape[0], V**t, V ** (s - t)).sum(axis=2)
    return e


def one_token_rule(lp: _OneTokenLP) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    r"""The lossless one-token verifier of a solved :func:`solve_one_token_lp`: ``(e, r, offs)``.

    ``e[a, offs[t] + u]``: the probability of key ``a`` and accepting its
    depth-``t`` prefix ``u`` (rows sum to the key weights, repaired so that
    :math:`\bar a(u z) \le M_b(z \mid u)\, \bar a(u)` holds exactly);
    ``r[t][u]``: the law of the one token emitted after accepting ``u``,
    :math:`\propto (M_b(z \mid u)\, \bar a(u) - \bar a(u z))_+` (see
    :class:`OneTokenVerifier`).
    """
    V, L = lp.V, lp.L
    weights = lp.weights
    offs = np.concatenate([[0], np.cumsum([V**t for t in range(L + 1)])])
    e = np.zeros((len(lp.keys), int(offs[-1])))
    np.add.at(e, (lp.f_key, offs[lp.f_t] + lp.f_u), lp.f)
    rs = e.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        e *= np.where(rs > weights, weights / np.where(rs > 0, rs, 1.0), 1.0)[:, None]
    e[:, 0] += np.maximum(weights - e.sum(axis=1), 0.0)  # accepting nothing is always allowed
    e = _repair(e, lp.cb, V, L, offs)
    through = _through(e.sum(axis=0), V, L, offs)
    r = []
    for t in range(L + 1):
        cond = lp.cb[t].reshape(V**t, V)
        if t < L:
            raw = np.maximum(cond * through[t][:, None] - through[t + 1].reshape(V**t, V), 0.0)
            tot = raw.sum(axis=1, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                r.append(np.where(tot > 0, raw / np.where(tot > 0, tot, 1.0), cond))
        else:
            r.append(cond)
    return e, r, offs


class OneTokenVerifier(MultiDraftPlanVerifier):
    r"""The best verifier of ``k`` draft blocks that emits an accepted prefix and one token, as a sampler.

    .. math::

        P(\text{accept } u \mid A) = e(A, u) / w(A), \qquad
        r(z \mid u) \propto \big(M_b(z \mid u)\, \bar a(u) - \bar a(u z)\big)_+ ,

    where :math:`e(A, u)` is the mass the solved :func:`one_token_optimum`
    LP puts on accepting the drafted prefix :math:`u` of the set :math:`A`,
    :math:`\bar a(v) = \sum_A \sum_{u \supseteq v} e(A, u)` the mass of
    accepted prefixes through :math:`v`, and :math:`z` the one token emitted
    after :math:`u` (the bonus :math:`M_b(\cdot \mid u)` when
    :math:`|u| = L`); the target continues. An acceptance pattern admits a
    lossless correction law iff :math:`\bar a(u z) \le M_b(z \mid u)\,
    \bar a(u)` for all :math:`u, z`, and then this :math:`r` is that law (it
    sums to :math:`a(u)` before normalising). The LP solution satisfies these
    inequalities within its tolerance; a top-down pass enforces them exactly
    (a violating subtree is scaled down and its mass moved to accepting its
    parent prefix, which keeps every inequality above it), so the output law
    is the target's to float rounding and :math:`\mathbb E[\tau]` is within
    the solver's tolerance (about 1e-9) of the one-token optimum.

    Like :class:`MultiDraftPlanVerifier` it is an exact reference built from
    the whole draft and target laws (exponential in ``L``), not a decoder.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).
    L, k : int
        Block length and number of draft blocks.

    Raises
    ------
    ValueError
        As :func:`one_token_optimum`, or a failed solve.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Block Verification Accelerates Speculative Decoding" (published
       version of arXiv:2403.10444): one correction token after the accepted prefix.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import OneTokenVerifier
    >>> v = OneTokenVerifier(MemorylessModel([3/4, 1/4]), MemorylessModel([1/2, 1/2]), 2, 2)
    >>> round(128 * v.expected_length(), 6), v.max_error() < 1e-12
    (227.0, True)
    """

    name = "multidraft-one-token"

    def __init__(self, draft, target, L, k):
        V, L, k = _check_args(draft, target, L, k)
        lp = _one_token_lp(draft, target, L, k)
        if not lp.sol.success:
            lp.sol.raise_for_status("one-token multi-draft LP")
        self.draft, self.target, self.V, self.L, self.k = draft, target, V, L, k
        self.value = float(lp.sol.objective)
        self._laws = {}
        self.keys = tuple(lp.keys)
        self._index = {key: i for i, key in enumerate(self.keys)}
        self.weights = lp.weights
        self._cb = lp.cb
        self._e, self._r, self._offs = one_token_rule(lp)

    def _level(self, t: int) -> slice:
        return slice(int(self._offs[t]), int(self._offs[t + 1]))

    def conditional(self, drafts) -> np.ndarray:
        """Exact law of the accepted prefix given the drafts, over all prefixes (level by level, lexicographic)."""
        i = self._index.get(self._key(drafts))
        if i is None:
            out = np.zeros(self._e.shape[1])
            out[0] = 1.0
            return out
        return self._e[i] / self._e[i].sum()

    def verify(self, drafts, *, rng=None) -> MultiDraftSample:
        """Accept a drafted prefix, emit one token, and let the target continue to ``L + 1`` tokens."""
        gen = as_rng(rng)
        j = sample_from(self.conditional(drafts), gen)
        t = int(np.searchsorted(self._offs, j, side="right") - 1)
        ui = j - int(self._offs[t])
        u = tuple(int(x) for x in np.unravel_index(ui, (self.V,) * t)) if t else ()
        out = u + (int(sample_from(self._r[t][ui], gen)),)
        while len(out) < self.L + 1:
            out += (self._draw("target", out, gen),)
        return MultiDraftSample((), t, out)

    def tau_law(self) -> np.ndarray:
        a = self._e.sum(axis=0)
        law = np.array([a[self._level(t)].sum() for t in range(self.L + 1)])
        return law / law.sum()

    def output_law(self, *, bonus: bool = True) -> np.ndarray:
        """Exact law of the output completed by the target to ``L + 1`` tokens (``L`` without the bonus)."""
        bonus = validate_bool(bonus, "bonus")
        V, L = self.V, self.L
        a = self._e.sum(axis=0)
        law = np.zeros((V,) * (L + 1))
        for t in range(L + 1):
            term = (a[self._level(t)][:, None] * self._r[t]).reshape((V,) * (t + 1))
            for j in range(t + 1, L + 1):
                term = term[..., None] * self._cb[j]
            law += term
        return law if bonus else law.sum(axis=-1)


# ---------------------------------------------------------------------------
# every scheme on the same models
# ---------------------------------------------------------------------------

#: Schemes of :func:`compare_schemes`: name -> (kind, description).
SCHEMES = {
    "bound": ("bound", "level-wise bound B = sum_l alpha_k(P_l, Q_l)"),
    "optimum": ("bound", "multi-draft block OT optimum (LP); attained by multidraft-plan"),
    "multidraft-plan": ("verifier", "optimal plan as a sampler (multi-token residual)"),
    "one-token-optimum": ("bound", "best verifier emitting one token after the accepted prefix (LP)"),
    "one-token-verifier": ("verifier", "that optimum as a sampler (OneTokenVerifier)"),
    "spectr-dp": ("bound", "best per-depth plan of SpecTr's DraftSelection (dynamic programme)"),
    "spectr-lp": ("verifier", "SpecTr over sequences, OTM-k LP plan per depth"),
    "spectr-optimal": ("verifier", "SpecTr over sequences, optimal verifier per depth"),
    "spectr-kseq": ("verifier", "SpecTr over sequences, k-Seq per depth"),
    "spectr-multiround": ("verifier", "SpecTr over sequences, recursive rejection per depth"),
    "block": ("verifier", "block verification v1 on one draft (multi-token residual)"),
    "block-onestep": ("verifier", "block verification on one draft, one correction token"),
    "token": ("verifier", "token verification on one draft"),
}


@dataclass(frozen=True)
class SchemeRow:
    """One scheme of :func:`compare_schemes`.

    Attributes
    ----------
    name : str
    kind : str
        ``"bound"`` (an optimum over a class) or ``"verifier"`` (a sampler).
    length : float
        Exact :math:`\\mathbb E[\\tau]` (accepted draft tokens).
    max_error : float
        Largest error of the output law against the target's (enumeration); ``nan`` for bounds.
    gap : float
        ``optimum - length``.
    """

    name: str
    kind: str
    length: float
    max_error: float
    gap: float


@dataclass(frozen=True)
class SchemeComparison:
    """Result of :func:`compare_schemes`: one :class:`SchemeRow` per scheme, and the problem."""

    V: int
    L: int
    k: int
    optimum: float
    bound: float
    rows: tuple

    def length(self, name: str) -> float:
        """The expected accepted length of scheme ``name``."""
        for r in self.rows:
            if r.name == name:
                return r.length
        raise KeyError(name)


def _spectr(draft, target, L, k, rule, check: bool):
    length = block_efficiency(draft, target, k, L, verifier=rule) - 1.0
    err = spectr_check(draft, target, k, L, verifier=rule).max_error if check else math.nan
    return length, err


def compare_schemes(draft, target, L, k, *, schemes=None, check: bool = True) -> SchemeComparison:
    r"""Exact expected accepted length of every scheme on the same models, with losslessness by enumeration.

    .. math::

        \text{token} \le \text{SpecTr rules} \le \text{spectr-dp} \le \text{one-token-optimum}
        = \text{one-token-verifier}
        \le \mathrm{OPT} = \text{multidraft-plan} \le B,

    (single-draft schemes use the first of the ``k`` drafts). SpecTr over
    sequences is :func:`otspec.spectr.block_efficiency` minus the bonus token
    with the named token-level rule per depth; its losslessness is
    :func:`otspec.spectr.check_lossless`; the one-draft block verifiers use
    :func:`expected_length` and :func:`check_lossless` of this subpackage.

    Parameters
    ----------
    draft, target : Model
    L, k : int
    schemes : sequence of str or None, keyword-only
        Names from :data:`SCHEMES` (all when None; ``"optimum"`` is always computed).
    check : bool, keyword-only
        Check each verifier's losslessness by enumeration (``max_error``); else ``nan``.

    Returns
    -------
    SchemeComparison

    Raises
    ------
    ValueError
        An unknown scheme; sizes as :func:`multidraft_ot`.
    TypeError
        ``check`` not a bool.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal Transport",
       arXiv:2310.15141, Algorithm 3.
    .. [2] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", arXiv:2403.10444 v1, Algorithms 2-3, Theorems 1-2.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import compare_schemes
    >>> c = compare_schemes(MemorylessModel([3/4, 1/4]), MemorylessModel([1/2, 1/2]), 2, 2,
    ...                     schemes=["bound", "spectr-optimal", "token"], check=False)
    >>> [(r.name, round(r.length, 6)) for r in c.rows]
    [('bound', 1.808594), ('spectr-optimal', 1.746094), ('token', 1.3125)]
    """
    V, L, k = _check_args(draft, target, L, k)
    check = validate_bool(check, "check")
    if schemes is not None and (isinstance(schemes, (str, bytes)) or not isinstance(schemes, Iterable)):
        raise TypeError(f"`schemes` must be a sequence of scheme names or None, got {type(schemes).__name__} "
                        f"{schemes!r}" + (f" (write [{schemes!r}] for one scheme)" if isinstance(schemes, str) else ""))
    names = list(SCHEMES) if schemes is None else list(schemes)
    for s in names:
        if not isinstance(s, str):
            raise TypeError(f"`schemes` entries must be scheme names (str), got {type(s).__name__} {s!r}")
        if s not in SCHEMES:
            raise ValueError(unknown_name_message("schemes", s, sorted(SCHEMES), entries=True))
    res = multidraft_ot(draft, target, L, k, raise_on_failure=True)
    opt = res.value
    rows = []
    for s in names:
        kind = SCHEMES[s][0]
        err = math.nan
        if s == "bound":
            length = res.bound
        elif s == "optimum":
            length = opt
        elif s == "multidraft-plan":
            v = MultiDraftPlanVerifier(draft, target, L, k, result=res)
            length = v.expected_length()
            err = v.max_error() if check else math.nan
        elif s == "one-token-verifier":
            v = OneTokenVerifier(draft, target, L, k)
            length = v.expected_length()
            err = v.max_error() if check else math.nan
        elif s == "one-token-optimum":
            length = one_token_optimum(draft, target, L, k).value
        elif s == "spectr-dp":
            length = optimal_block_efficiency(draft, target, k, L) - 1.0
        elif s.startswith("spectr-"):
            length, err = _spectr(draft, target, L, k, s[len("spectr-"):], check)
        else:
            length = expected_length(draft, target, L, s)
            err = check_lossless(draft, target, L, s).max_error if check else math.nan
        rows.append(SchemeRow(s, kind, float(length), float(err), float(opt - length)))
    return SchemeComparison(V, L, k, float(opt), float(res.bound), tuple(rows))


_MULTI_PAPER = "Sun et al., Block verification, arXiv:2403.10444 v1, Algorithm 3, over k draft blocks"
register_verifier(VerifierSpec(
    "multidraft-plan", "block", None, build_multi=MultiDraftPlanVerifier, symmetric=True,
    summary="optimal coupling of k draft blocks (multi-draft block optimum; enumerates V**L blocks)",
    reference=_MULTI_PAPER,
))
register_verifier(VerifierSpec(
    "multidraft-one-token", "block", None, build_multi=OneTokenVerifier, symmetric=True,
    summary="best verifier emitting an accepted prefix of k draft blocks and one token (enumerates V**L blocks)",
    reference=f"{_MULTI_PAPER}; Sun et al., SpecTr, arXiv:2310.15141, Algorithm 3",
))
