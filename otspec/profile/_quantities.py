r"""Exact per-position quantities of a profile, from the laws of one drawn draft tree.

At a context ``c`` the profile holds ``k_max`` i.i.d. draft blocks ``X``
(``(k_max, L_max)`` token ids), the draft laws along them ``P`` (``(k_max,
L_max, V)``, ``P[r, j] = p(. | c, X[r, :j])``) and the target laws ``Q``
(``(k_max, L_max + 1, V)``). From these alone, exactly (float64):

* per depth ``j`` along the first block and every ``k``: each token-level
  verifier's acceptance :math:`P(Y \in S(X))` at ``(P[0, j], Q[0, j], k)``
  (batched closed forms where they exist; the lossy rules also with the
  total variation and :math:`\mathrm{KL}(q \| \text{output})` of their output law);
* for every scheme, ``k`` and ``L``: :math:`E[\tau_L \mid X]`, the expected
  number of accepted draft tokens given the drawn drafts.

Notation: ``p`` is the draft's law, ``q`` the target's.
"""

from __future__ import annotations

import numpy as np

from .._registry import get_verifier
from ..block import tau_law_on_path
from ..lossy._mentored import kl_divergence
from ..multidraft._batched import batched_kseq_acceptance, batched_maximal_coupling_acceptance
from ..otm._alpha import alpha_k
from ..otm._without_replacement import alpha_k_without_replacement

__all__ = ["Builds", "drop_null_columns", "depth_quantities", "expected_accepted", "tree_reach", "block_tau"]


def _compress(p: np.ndarray, q: np.ndarray):
    """The union support of ``p`` and ``q`` and both restricted to it, renormalised (as the decoding loop does)."""
    keep = (p > 0) | (q > 0)
    if keep.all():
        return None, p / p.sum(), q / q.sum()
    idx = np.flatnonzero(keep)
    pc, qc = p[idx], q[idx]
    return idx, pc / pc.sum(), qc / qc.sum()


def drop_null_columns(P: np.ndarray, Q: np.ndarray, X: np.ndarray | None = None):
    r"""The laws restricted to the tokens that carry mass somewhere, and the token ids mapped there.

    .. math::

        S = \{x : \exists\, i,\ P_i(x) > 0 \text{ or } Q_i(x) > 0\}, \qquad
        (P, Q, X) \mapsto (P_{\cdot, S},\ Q_{\cdot, S},\ \text{rank of } X \text{ in } S).

    Every quantity of a profile is a sum over tokens of terms that vanish
    where both laws vanish, and ties are broken by token order, which the
    restriction keeps; so the restricted laws give the same values (to float64
    summation order) at the cost of ``|S|`` instead of ``V`` columns: with
    top-k sampling ``|S|`` is at most ``top_k`` times the number of rows.

    Parameters
    ----------
    P, Q : ndarray
        Laws ``(..., V)`` (any leading shapes, the same ``V``).
    X : ndarray of int, optional
        Token ids, all in ``S`` (tokens drawn from ``P`` or ``Q``).

    Returns
    -------
    tuple
        ``(P_S, Q_S)`` or ``(P_S, Q_S, X_S)``; the inputs themselves (no copy) when ``S`` is every token.
    """
    keep = (P > 0).reshape(-1, P.shape[-1]).any(axis=0) | (Q > 0).reshape(-1, Q.shape[-1]).any(axis=0)
    if keep.all():
        return (P, Q) if X is None else (P, Q, X)
    cols = np.flatnonzero(keep)
    out = (np.ascontiguousarray(P[..., cols]), np.ascontiguousarray(Q[..., cols]))
    return out if X is None else out + (np.searchsorted(cols, X),)


class Builds:
    """Verifiers built at the nodes of one draft tree, each at most once per (name, prefix, number of drafts).

    The nodes of a tree share their laws with every row whose draft agrees on
    the prefix, so the per-depth acceptance along the first block and the
    expected accepted tokens of every ``k`` read the same builds. The laws are
    kept on the tokens with mass somewhere in the tree (:func:`drop_null_columns`).
    """

    def __init__(self, X: np.ndarray, P: np.ndarray, Q: np.ndarray, options: dict):
        self.P, self.Q, self.X = drop_null_columns(P, Q, X)
        self.options = options
        self._cache: dict = {}
        self._supp: dict = {}

    def support(self, r: int, j: int):
        key = (tuple(self.X[r, :j].tolist()), j)
        out = self._supp.get(key)
        if out is None:
            out = self._supp[key] = _compress(self.P[r, j], self.Q[r, j])
        return out

    def get(self, name: str, r: int, j: int, n: int):
        """The verifier ``name`` for ``n`` drafts at the node ``X[r, :j]`` (on the union support)."""
        key = (name, tuple(self.X[r, :j].tolist()), j, n)
        v = self._cache.get(key)
        if v is None:
            _, pc, qc = self.support(r, j)
            v = self._cache[key] = get_verifier(name).build(pc, qc, n, **self.options.get(name, {}))
        return v

    def local(self, r: int, j: int, tokens) -> list[int]:
        """Token ids mapped to the node's union support."""
        idx, _, _ = self.support(r, j)
        t = np.asarray(tokens, dtype=np.int64)
        return (t if idx is None else np.searchsorted(idx, t)).tolist()


def _lossy_gaps(v, q: np.ndarray) -> tuple[float, float]:
    out = np.asarray(v.output_law(), dtype=np.float64)
    return 0.5 * float(np.abs(out - q).sum()), float(kl_divergence(q, out))


def depth_quantities(name: str, ks, builds: Builds, L: int, *, lossless: bool = True) -> dict:
    r"""Exact acceptance of verifier ``name`` at every depth along the first draft block, for each ``k``.

    .. math::

        a_j(k) = P\big(Y \in S(X_{1..k})\big), \quad X_i \overset{\text{i.i.d.}}{\sim} p_j,\
        Y \sim K(\cdot \mid X), \qquad p_j = p(\cdot \mid c, X^{(1)}_{<j}),\ q_j = q(\cdot \mid c, X^{(1)}_{<j}).

    Batched closed forms over the ``L`` depths: :func:`otspec.alpha_k` for
    ``"optimal"`` and ``"lp"`` (both reach the optimum), the maximal coupling
    for ``"token"``, :func:`otspec.multidraft.batched_kseq_acceptance` for
    ``"kseq"``; every other verifier is built per depth and asked for its
    exact ``acceptance()`` (and, when lossy, the total variation and
    :math:`\mathrm{KL}(q \| \pi)` of its output law :math:`\pi`).

    Parameters
    ----------
    name : str
        A registered token-level verifier.
    ks : sequence of int
        Numbers of drafts.
    builds : Builds
        The tree's laws and its cache of built verifiers.
    L : int
        Depths ``1..L``.
    lossless : bool, keyword-only
        False for a lossy rule (then ``"tv"`` and ``"kl"`` are returned too).

    Returns
    -------
    dict
        ``{("acc" | "tv" | "kl", k): (L,) ndarray}``; exact to about 1e-12 (float64 sums over the
        vocabulary); NaN where the scheme is undefined (``k`` distinct drafts on a support of fewer
        than ``k`` tokens), and such values are not recorded.
    """
    # the laws come from Sampling.probs: float64 rows summing to 1 (checked there), so no re-validation
    P0, Q0 = builds.P[0, :L], builds.Q[0, :L]
    out: dict = {}
    if name in ("optimal", "lp"):
        vals = np.asarray(alpha_k(P0, Q0, list(ks), validate=False, workers=1), dtype=np.float64).reshape(L, len(ks))
        for i, k in enumerate(ks):
            out[("acc", k)] = vals[:, i]
        return out
    if name == "without-replacement":  # the closed form of the optimum, not the LP plan over draft sets

        vals = np.array([alpha_k_without_replacement(*builds.support(0, j)[1:], list(ks)) for j in range(L)])
        for i, k in enumerate(ks):
            out[("acc", k)] = vals[:, i]
        return out
    if name == "token":
        out[("acc", 1)] = np.asarray(batched_maximal_coupling_acceptance(P0, Q0, validate=False), dtype=np.float64)
        return out
    if name == "kseq" and not builds.options.get("kseq"):
        for k in ks:
            out[("acc", k)] = np.asarray(batched_kseq_acceptance(P0, Q0, k, validate=False), dtype=np.float64)
        return out

    distinct = get_verifier(name).draft_process != "iid"  # k distinct drafts: undefined on a smaller support
    for k in ks:
        acc = np.full(L, np.nan)
        tv = np.full(L, np.nan)
        kl = np.full(L, np.nan)
        for j in range(L):
            if distinct and np.count_nonzero(builds.support(0, j)[1] > 0) < k:
                continue  # e.g. greedy decoding (one-hot draft law) with k >= 2 distinct drafts: NaN, not recorded
            v = builds.get(name, 0, j, k)
            acc[j] = float(v.acceptance())
            if not lossless:
                tv[j], kl[j] = _lossy_gaps(v, builds.support(0, j)[2])
        out[("acc", k)] = acc
        if not lossless:
            out[("tv", k)], out[("kl", k)] = tv, kl
    return out


def tree_reach(name: str, rows, builds: Builds, L: int) -> np.ndarray:
    r"""Exact :math:`P(\tau \ge j \mid X)`, ``j = 1..L``, of token-level DraftSelection on the drafts ``rows``.

    .. math::

        P(\tau \ge j \mid X) = \sum_{y_{1..j}} \prod_{i \le j}
        K_i\big(y_i \mid X_{A_i, i}\big), \qquad A_{i+1} = \{r \in A_i : X_{r, i} = y_i\} \ne \emptyset,

    summed over the at most ``|rows|`` branches per depth where the output
    agrees with some surviving draft (SpecTr, Sun et al., arXiv:2310.15141,
    Algorithm 3): the verifier at each node is built for the number of
    drafts alive there and asked for its exact conditional law
    (``Verifier.conditional``).

    Returns
    -------
    (L,) ndarray of float64
    """
    reach = np.zeros(L)
    X = builds.X
    stack = [(list(rows), 0, 1.0)]
    while stack:
        alive, j, prob = stack.pop()
        if j == L or prob == 0.0:
            continue
        r0 = alive[0]
        v = builds.get(name, r0, j, len(alive))
        toks = X[alive, j]
        cond = v.conditional(builds.local(r0, j, toks))
        for y in np.unique(toks):
            py = float(cond[builds.local(r0, j, [y])[0]])
            if py <= 0.0:
                continue
            reach[j] += prob * py
            stack.append(([r for r in alive if X[r, j] == y], j + 1, prob * py))
    return reach


def _token_reach(builds: Builds, r: int, L: int) -> np.ndarray:
    """:func:`tree_reach` of one draft under the maximal coupling: products of ``min(1, q/p)`` (no builds)."""
    x = builds.X[r, :L]
    j = np.arange(L)
    p = builds.P[r, j, x] / builds.P[r, :L].sum(axis=-1)
    q = builds.Q[r, j, x] / builds.Q[r, :L].sum(axis=-1)
    return np.cumprod(np.minimum(1.0, q / p))


def block_tau(name: str, builds: Builds, r: int, L: int) -> tuple[float, float]:
    r"""Block verification of the block ``X[r, :L]``: :math:`E[\tau \mid X^L]` and the expected target calls.

    The law of :math:`\tau` comes from :func:`otspec.block.tau_law_on_path`
    (as the decoding loop's prediction). Sun et al.'s (arXiv:2403.10444)
    Algorithm 3 (``"block"``) draws its multi-token residual with one extra
    target call per missing token, so it emits ``L + 1`` tokens in
    :math:`1 + E[(L - \tau)\,\mathbb 1\{\tau < L\}]` calls; ``"block-onestep"``
    emits :math:`\tau + 1` in one call.
    """
    x = builds.X[r, :L].tolist()
    law = tau_law_on_path(name, x, list(builds.P[r, :L]), list(builds.Q[r, :L]))
    t = np.arange(L + 1)
    tau = float(law @ t)
    calls = 1.0 + float(law[:L] @ (L - t[:L])) if name == "block" else 1.0
    return tau, calls


def expected_accepted(name: str, k: int, builds: Builds, L_max: int) -> dict:
    r"""Exact :math:`E[\tau_L \mid X]` for ``L = 1..L_max`` (and the expected target calls of ``"block"``).

    .. math::

        \bar\tau_L = \frac{1}{G} \sum_{g=1}^{G} E\big[\tau_L \mid X^{(g)}\big],
        \qquad G = \lfloor k_{\max} / k \rfloor,

    averaged over the ``G`` disjoint groups of ``k`` drawn blocks (each group
    an independent draw of ``k`` i.i.d. blocks, so the average is unbiased for
    :math:`E[\tau_L]` and exact given the drafts). Token-level schemes use
    :func:`tree_reach` (``E[\tau_L] = \sum_{j \le L} P(\tau \ge j)``: a
    shorter draft is the same selection stopped earlier); block schemes
    :func:`block_tau` per ``L``.

    Returns
    -------
    dict
        ``{"tau": (L_max,) ndarray}``, plus ``"calls"`` for ``"block"``.
    """
    k_max = builds.X.shape[0]
    G = k_max // k
    spec = get_verifier(name)
    if spec.kind == "block":
        tau = np.zeros(L_max)
        calls = np.zeros(L_max)
        for g in range(G):
            for L in range(1, L_max + 1):
                t, c = block_tau(name, builds, g, L)
                tau[L - 1] += t / G
                calls[L - 1] += c / G
        out = {"tau": tau}
        if name == "block":
            out["calls"] = calls
        return out
    reach = np.zeros(L_max)
    for g in range(G):
        rows = list(range(g * k, (g + 1) * k))
        if name == "token":
            reach += _token_reach(builds, rows[0], L_max) / G
        else:
            reach += tree_reach(name, rows, builds, L_max) / G
    return {"tau": np.cumsum(reach)}
