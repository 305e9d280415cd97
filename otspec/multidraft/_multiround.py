r"""Multi-round (recursive) rejection sampling: SpecInfer / EAGLE multi-draft verification.

Notation: ``p`` is the draft distribution, ``q`` the target.

With replacement (SpecInfer, Miao et al., Algorithm 1; compared in SpecTr
App. B.3): drafts :math:`X_1, \dots, X_k` i.i.d. from ``p``; with
:math:`q_1 = q`, round :math:`i` accepts :math:`X_i` with probability
:math:`\min(1, q_i(X_i)/p(X_i))`, otherwise moves on with the residual
:math:`q_{i+1} = (q_i - p)_+ / \sum (q_i - p)_+`; if every round rejects,
the output is drawn from :math:`q_{k+1}`. Each round is the maximal coupling
of ``p`` and :math:`q_i`, so the output is exactly ``q``.

Without replacement (recursive speculative decoding, Jeon et al. 2024):
the :math:`i`-th draft is drawn from ``p`` renormalised on the tokens not
drawn before, :math:`p_i = p\,\mathbb 1\{\cdot \notin \{X_1..X_{i-1}\}\} /
(1 - p(\{X_1..X_{i-1}\}))`, and round :math:`i` runs the maximal coupling of
:math:`p_i` and :math:`q_i` (:math:`q_{i+1} = (q_i - p_i)_+` normalised).
The output is again exactly ``q`` (induction on the rounds: given the
history, round :math:`i` outputs :math:`q_i`), but the drafts are then *not*
i.i.d. from ``p``: their law is the sequential without-replacement law
(:meth:`MultiRound.draft_law_of`), and :meth:`MultiRound.acceptance`,
:func:`otspec.check_lossless` and :meth:`MultiRound.sample_drafts` all use
that law. It is compared with :math:`\alpha_k` only as a number: the
optimal-transport bound for *its* draft law is a different one.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import as_rng, validate_k, validate_pair
from .._verifier import Verifier, coin_accept, complement
from ._kseq import _draw, _sample_iid
from ._maximal_coupling import residual

__all__ = ["MultiRound", "multiround", "MAX_HISTORIES", "MAX_TARGET_ENTRIES"]

#: Largest round-target table ``(k + 1) * n`` built with replacement (40 MB of float64;
#: building it costs O(k n) time, about 10 s at the limit with n = 2).
MAX_TARGET_ENTRIES = 5_000_000

#: Largest number of rejection histories enumerated by the exact acceptance
#: of multi-round sampling *without* replacement.
MAX_HISTORIES = 2_000_000


class MultiRound(Verifier):
    r"""Multi-round (recursive) rejection sampling over ``k`` drafts.

    .. math::

        K(y \mid x) = \sum_{i=1}^k \Big[\prod_{j<i} (1 - a_j)\Big] a_i\,
            \mathbb 1\{y = x_i\} + \prod_{j=1}^k (1 - a_j)\, q_{k+1}(y),
        \qquad a_i = \min\Big(1, \frac{q_i(x_i)}{p_i(x_i)}\Big),

    with :math:`p_i = p` (with replacement) or ``p`` renormalised without
    :math:`x_1..x_{i-1}` (without replacement). Exact acceptance:

    .. math::

        P(Y \in S(X)) = 1 - \prod_{i=1}^k (1 - \beta_i), \qquad
        \beta_i = \sum_x \min(p(x), q_i(x))

    with replacement (the final residual :math:`q_{k+1}` is zero on every
    rejected draft, since a rejected :math:`x_i` has :math:`q_i(x_i) < p(x_i)`
    and so :math:`q_{i+1}(x_i) = 0`); without replacement,
    :math:`1 - \sum_{h} \prod_i (p_i - q_i)_+(x_i)` over the ordered
    histories :math:`h = (x_1..x_k)` of rejected drafts, where :math:`p_i, q_i`
    depend on the history (enumerated exactly; at most
    :data:`MAX_HISTORIES` histories).

    Build it with :func:`multiround`.

    Attributes
    ----------
    k : int
        Number of drafts.
    p, q : (n,) ndarray of float64, read-only
        Draft and target distributions.
    replacement : bool
        Whether drafts are i.i.d. (True) or drawn without replacement.
    targets : (k + 1, n) ndarray of float64, read-only, or None
        With replacement, the round targets :math:`q_1 = q, q_2, \dots, q_{k+1}`
        (they do not depend on the drafts); None without replacement.
    betas : (k,) ndarray of float64, read-only, or None
        With replacement, :math:`\beta_i = \sum_x \min(p(x), q_i(x))`.
    """

    def __init__(self, p: np.ndarray, q: np.ndarray, k: int, replacement: bool):
        self.k = k
        self.p = p
        self.q = q
        self.replacement = bool(replacement)
        self._p_cdf = np.cumsum(p)
        self._acceptance = None
        if self.replacement:
            if (k + 1) * p.shape[0] > MAX_TARGET_ENTRIES:
                raise ValueError(
                    f"`k`={k} rounds over n={p.shape[0]} tokens need a ({k + 1}, {p.shape[0]}) table of round "
                    f"targets, above the limit MAX_TARGET_ENTRIES={MAX_TARGET_ENTRIES} entries"
                )
            targets = np.empty((k + 1, p.shape[0]))
            targets[0] = q
            for i in range(k):
                targets[i + 1] = residual(p, targets[i])
            betas = np.minimum(p[None, :], targets[:k]).sum(axis=1)
            targets.setflags(write=False)
            betas.setflags(write=False)
            self.targets = targets
            self.betas = betas
            self._last_cdf = np.cumsum(targets[k])
        else:
            self.targets = None
            self.betas = None

    # ----------------------------------------------------------------- draft law
    def draft_law_of(self, drafts) -> float:
        r"""Probability of the draft tuple under this verifier's draft law.

        .. math::

            P(X = x) = \prod_{i=1}^k p(x_i)
            \quad\text{or}\quad
            \prod_{i=1}^k \frac{p(x_i)}{1 - \sum_{j<i} p(x_j)}\ \ (x \text{ distinct}).
        """
        xs = self._drafts(drafts)
        if self.replacement:
            return float(np.prod(self.p[list(xs)]))
        if len(set(xs)) < len(xs):
            return 0.0
        mask = np.ones(self.n, dtype=bool)
        w = 1.0
        for x in xs:
            rest = float(self.p[mask].sum())  # the mass still available, summed directly
            if not rest > 0 or self.p[x] == 0:
                return 0.0
            w *= float(self.p[x]) / rest
            mask[x] = False
        return w

    def sample_drafts(self, *, rng=None) -> tuple[int, ...]:
        """Draw ``k`` drafts from this verifier's draft law (i.i.d. ``p`` or without replacement)."""
        gen = as_rng(rng)
        if self.replacement:
            return _sample_iid(self._p_cdf, self.p, self.k, gen)
        law = np.array(self.p, dtype=np.float64)
        out = []
        for _ in range(self.k):
            x = _draw(np.cumsum(law), law, gen)
            out.append(x)
            law[x] = 0.0
        return tuple(out)

    # ----------------------------------------------------------------- rounds
    def _rounds(self, xs):
        """Yield (x_i, a_i) along the tuple and return the final residual."""
        if self.replacement:
            T = self.targets
            return [(x, coin_accept(T[i, x], self.p[x])) for i, x in enumerate(xs)], T[self.k]
        steps = []
        mask = np.ones(self.n, dtype=bool)
        t = np.array(self.q, dtype=np.float64)
        for x in xs:
            pi = np.where(mask, self.p, 0.0)
            s = pi.sum()
            pi = pi / s if s > 0 else pi
            steps.append((x, coin_accept(t[x], pi[x])))
            t = residual(pi, t)
            mask[x] = False
        return steps, t

    def _check_distinct(self, xs):
        if not self.replacement and len(set(xs)) < len(xs):
            raise ValueError(
                f"`drafts` must be distinct for multi-round sampling without replacement, got {list(xs)}"
            )

    def conditional(self, drafts) -> np.ndarray:
        r"""Exact law of the output given the drafts, :math:`O(kn)` (distinct drafts without replacement)."""
        xs = self._drafts(drafts)
        self._check_distinct(xs)
        steps, last = self._rounds(xs)
        out = np.zeros(self.n)
        rem = 1.0
        for x, a in steps:
            out[x] += rem * a
            rem *= 1.0 - a
            if rem == 0.0:
                return out
        out += rem * last
        return out

    def sample(self, drafts, *, rng=None) -> int:
        """Run the rounds on the drafts: :math:`O(k + \\log n)` with replacement, :math:`O(kn)` without."""
        xs = self._drafts(drafts)
        self._check_distinct(xs)
        gen = as_rng(rng)
        if self.replacement:
            T, p = self.targets, self.p
            for i, x in enumerate(xs):
                # strict division-free test u * p(x) < q_i(x), u in [0, 1)
                if gen.random() * p[x] < T[i, x]:
                    return x
            return _draw(self._last_cdf, T[self.k], gen)
        steps, last = self._rounds(xs)
        for x, a in steps:
            if gen.random() < a or a >= 1.0:
                return x
        return _draw(np.cumsum(last), last, gen)

    # ----------------------------------------------------------------- acceptance
    def acceptance(self) -> float:
        r"""Exact :math:`P(Y \in S(X))` under this verifier's draft law (see the class docstring).

        Raises
        ------
        ValueError
            Without replacement, when more than :data:`MAX_HISTORIES` rejection
            histories would have to be enumerated.
        """
        if self._acceptance is None:
            if self.replacement:
                # 1 - prod(1 - beta_i), via log1p for accuracy when the betas are small
                with np.errstate(divide="ignore"):
                    self._acceptance = float(-np.expm1(np.sum(np.log1p(-np.minimum(self.betas, 1.0)))))
            else:
                rejected, accepted = self._all_rejected_wor()
                self._acceptance = complement(rejected, lambda: math.fsum(accepted))  # 1 - (1 - 3e-300) gave 0
        return self._acceptance

    def _all_rejected_wor(self) -> tuple[float, list[float]]:
        """P(every round rejects) without replacement, by exact enumeration of histories, and the terms of
        P(some round accepts): each history's weight times its round's acceptance ``sum min(p_i, q_i)``."""
        p, n, k = self.p, self.n, self.k
        count = 0
        # stack of (weight, mask of drawn tokens, current target, round index)
        total = 0.0
        accepted = []
        stack = [(1.0, np.ones(n, dtype=bool), np.array(self.q, dtype=np.float64), 0)]
        while stack:
            w, mask, t, i = stack.pop()
            if i == k:
                total += w
                continue
            pi = np.where(mask, p, 0.0)
            s = pi.sum()
            if not s > 0:
                continue  # no draft can be drawn: a probability-zero history
            pi = pi / s
            accepted.append(w * float(np.minimum(pi, t).sum()))
            rej = np.maximum(pi - t, 0.0)  # P(draw x and reject it) = p_i(x) - min(p_i, q_i)(x)
            nxt = residual(pi, t)
            for x in np.flatnonzero(rej > 0).tolist():
                count += 1
                if count > MAX_HISTORIES:
                    raise ValueError(
                        f"exact acceptance of multi-round sampling without replacement enumerates the "
                        f"ordered histories of rejected drafts; this input needs more than "
                        f"MAX_HISTORIES={MAX_HISTORIES} (n={n}, k={k})"
                    )
                m2 = mask.copy()
                m2[x] = False
                stack.append((w * rej[x], m2, nxt, i + 1))
        return total, accepted

    def __repr__(self) -> str:
        return f"MultiRound(n={self.n}, k={self.k}, replacement={self.replacement})"


def multiround(p, q, k: int, *, replacement: bool = True, normalize: bool = False) -> MultiRound:
    r"""Multi-round (recursive) rejection sampling as a lossless verifier.

    .. math::

        \alpha = 1 - \prod_{i=1}^k (1 - \beta_i), \qquad
        \beta_i = \sum_x \min(p(x), q_i(x)), \qquad
        q_1 = q,\ \ q_{i+1} = \frac{(q_i - p)_+}{\sum_x (q_i(x) - p(x))_+}

    (with replacement; see :class:`MultiRound` for the without-replacement law).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution (small model).
    q : (n,) array_like of float
        Target distribution (large model).
    k : int
        Number of drafts.
    replacement : bool, keyword-only
        ``True`` (default): i.i.d. drafts from ``p`` (SpecInfer). ``False``:
        drafts drawn without replacement, each round coupling the
        renormalised draft law with the current residual target (recursive
        speculative decoding); then ``k`` may not exceed the number of tokens
        with ``p > 0``, and the verifier's draft law is not
        :math:`p^{\otimes k}` (see :meth:`MultiRound.draft_law_of`).
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1.

    Returns
    -------
    MultiRound
        The verifier; ``acceptance()`` is the exact :math:`P(Y \in S(X))`
        under its own draft law.

    Raises
    ------
    ValueError
        Invalid distributions or ``k``; ``k`` larger than the support of
        ``p`` without replacement.
    TypeError
        Inputs of the wrong type (``replacement`` must be a bool).

    References
    ----------
    .. [1] Miao et al., "SpecInfer: Accelerating Generative LLM Serving with
       Tree-based Speculative Inference and Verification", ASPLOS 2024,
       Algorithm 1 (multi-step speculative sampling); also EAGLE (Li et al.,
       ICML 2024).
    .. [2] Sun et al., "SpecTr", NeurIPS 2023, App. B.3 and Figure 6
       ("multi-round").
    .. [3] Jeon et al., "Recursive Speculative Decoding: Accelerating LLM
       Inference via Sampling Without Replacement", 2024.

    Examples
    --------
    >>> import otspec
    >>> v = otspec.multiround([0.75, 0.25], [0.25, 0.75], 2)
    >>> v.betas.tolist(), v.acceptance()
    ([0.5, 0.25], 0.625)
    >>> v.conditional([0, 1]).round(12).tolist()
    [0.333333333333, 0.666666666667]
    >>> w = otspec.multiround([0.9, 0.1], [0.1, 0.9], 2, replacement=False)
    >>> round(w.acceptance(), 12), round(float(otspec.alpha_k([0.9, 0.1], [0.1, 0.9], 2)), 12)
    (1.0, 0.29)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    if not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"`replacement` must be a bool, got {type(replacement).__name__}")
    if not replacement:
        m = int(np.count_nonzero(p_ > 0))
        if k > m:
            raise ValueError(
                f"`k` must be at most the number of tokens with p > 0 ({m}) for drafts drawn "
                f"without replacement, got {k}"
            )
    return MultiRound(p_, q_, k, bool(replacement))
