r"""The one verifier interface shared by every token-level multi-draft scheme.

A *verifier* for ``k`` drafts is a Markov kernel from draft tuples
:math:`x \in \Omega^k` to an output token :math:`y \in \Omega`. Together
with the draft law :math:`p^{\otimes k}` it defines a joint law
:math:`\pi(x, y) = p^{\otimes k}(x)\, K(y \mid x)`; the verifier is *lossless*
when the output marginal :math:`\sum_x \pi(x, y)` equals the target ``q``,
and its acceptance is :math:`\alpha(\pi) = P(Y \in S(X))` with :math:`S(x)`
the set of distinct draft tokens.

Notation: ``p`` is the draft distribution, ``q`` the target, everywhere.
"""

from __future__ import annotations

import abc
import itertools
import math
import numbers
from dataclasses import dataclass

import numpy as np

from ._validation import as_rng, validate_drafts, validate_positive_int

__all__ = ["LOSSLESS_TOL", "MAX_SAMPLE_DRAFTS", "LosslessCheck", "Verifier", "VerifierCheck", "check_draw_count",
           "check_lossless", "coin_accept", "complement", "sample_from", "sample_from_cdf", "validate_tol"]


#: Largest number of drafts drawn at once by ``sample_drafts`` (the tuple of ``k`` ints).
MAX_SAMPLE_DRAFTS = 10_000_000


def check_draw_count(k: int) -> None:
    """Refuse (ValueError) to draw more than :data:`MAX_SAMPLE_DRAFTS` drafts at once, before any draw."""
    if k > MAX_SAMPLE_DRAFTS:
        raise ValueError(f"drawing `k`={k} drafts at once exceeds the limit MAX_SAMPLE_DRAFTS={MAX_SAMPLE_DRAFTS}")


def coin_accept(t, d):
    r"""Probability that the strict, division-free acceptance coin ``u * d < t`` accepts (``u`` uniform on [0, 1)).

    .. math::

        P(u\, d < t) = \begin{cases} 0 & t = 0, \\ 1 & 0 \le d \le t,\ t > 0, \\ t / d & d > t, \end{cases}

    elementwise: :math:`\min(1, t/d)` where ``d > 0``, and at ``d = 0`` (a token the draft, or the selection,
    never proposes) 1 when ``t > 0`` and 0 when ``t = 0``: the coin never accepts a token of target mass 0. The
    samplers run the coin; a verifier's exact ``conditional`` takes its acceptance from here, so the two agree on
    every draft, those of draft probability 0 included. Divides only where ``d > t`` (no overflow at a subnormal
    ``d``).

    Parameters
    ----------
    t : float or ndarray of float
        The target-side mass, ``>= 0``.
    d : float or ndarray of float
        The draft-side (scaled) mass, ``>= 0``.

    Returns
    -------
    float or ndarray of float64
        A float for scalar inputs, else an array of their broadcast shape.

    Examples
    --------
    >>> from otspec._verifier import coin_accept
    >>> coin_accept(0.25, 0.5), coin_accept(0.5, 0.25), coin_accept(0.0, 0.0), coin_accept(0.1, 0.0)
    (0.5, 1.0, 0.0, 1.0)
    """
    if np.ndim(t) == 0 and np.ndim(d) == 0:
        t, d = float(t), float(d)
        return 0.0 if not t > 0 else (1.0 if d <= t else t / d)
    t, d = np.broadcast_arrays(np.asarray(t, dtype=np.float64), np.asarray(d, dtype=np.float64))
    return np.divide(t, d, out=(t > 0).astype(np.float64), where=d > t)


def complement(lost: float, kept) -> float:
    r"""A probability :math:`P = 1 - \text{lost}` whose complement ``lost`` is a sum of non-negative terms: ``1 - lost``
    where :math:`P > 1/2`, else ``kept()``, the probability summed directly.

    ``1 - lost`` is never above 1 and keeps its relative accuracy near 1, where ``lost`` is small; near 0 it
    cancels (an acceptance of 1e-300 came out 0: ``1 - (1 - 1e-300)``), and the direct sum has no cancellation.
    ``kept`` is called only there, so the usual case costs no second pass.

    Parameters
    ----------
    lost : float
        The complement, :math:`\ge 0`.
    kept : callable
        ``kept() -> float``: :math:`P` as a sum of non-negative terms.

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np
    >>> from otspec._verifier import complement
    >>> p, q = np.array([1e-300, 1.0]), np.array([1.0, 0.0])
    >>> lost = float(np.maximum(p - q, 0.0).sum())   # sum min(p, q) = 1e-300
    >>> 1.0 - lost, complement(lost, lambda: np.minimum(p, q).sum())
    (0.0, 1e-300)
    """
    lost = float(lost)
    return 1.0 - lost if lost < 0.5 else float(kept())


def sample_from_cdf(c: np.ndarray, law: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw of one index given ``c = np.cumsum(law)`` (zero-mass entries never drawn)."""
    u = rng.random() * c[-1]
    i = min(int(c.searchsorted(u, side="right")), law.shape[0] - 1)  # the method: no dispatch through np
    while law[i] <= 0 and i > 0:
        i -= 1
    return i


def sample_from(law: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw of one index from a (possibly unnormalised) non-negative vector."""
    c = law.cumsum() if type(law) is np.ndarray else np.cumsum(law)
    if not c[-1] > 0:
        raise ValueError("cannot sample from a vector with zero total mass")
    return sample_from_cdf(c, law, rng)


class Verifier(abc.ABC):
    r"""Abstract base class of a ``k``-draft token verifier.

    A verifier maps ``k`` draft tokens drawn i.i.d. from the draft ``p`` to
    one output token; it is lossless when the output follows the target
    ``q`` exactly.

    **The contract every verifier meets** (those of the package and a user's
    subclass alike), which property-based tests can rely on:

    * :meth:`sample_drafts` ``(*, rng)`` draws ``k`` drafts from the draft law
      the verifier assumes (:meth:`draft_law_of`: i.i.d. from ``p`` unless the
      verifier says otherwise, e.g. multi-round without replacement);
    * :meth:`sample` ``(drafts, *, rng)`` draws the output token given the drafts;
    * :meth:`conditional` ``(drafts)`` is its exact law;
    * :meth:`acceptance` ``()`` is the exact :math:`P(Y \in S(X))` under that draft law;
    * :meth:`output_law` ``()`` is the exact law of the output (``q`` when
      :attr:`lossless`), so ``sample(sample_drafts())`` follows ``output_law()``.

    Subclasses implement :meth:`conditional` and :meth:`acceptance`; they may
    override :meth:`sample` with a faster rule and :meth:`output_law` when the
    verifier is not lossless. A subclass that overrides :meth:`draft_law_of`
    must override :meth:`sample_drafts` too (the base class refuses to draw
    i.i.d. drafts for it). Result objects that carry a verifier (e.g.
    :class:`otspec.OTMResult`, :class:`otspec.MentoredResult`) expose it as
    the attribute ``.verifier``.

    Attributes
    ----------
    k : int
        Number of drafts.
    p : (n,) ndarray of float64, read-only
        Draft distribution.
    q : (n,) ndarray of float64, read-only
        Target distribution.
    """

    k: int
    p: np.ndarray
    q: np.ndarray

    @property
    def n(self) -> int:
        """Vocabulary size."""
        return int(self.p.shape[0])

    @property
    def lossless(self) -> bool:
        """Whether the output law is exactly ``q`` (True unless a subclass says otherwise)."""
        return True

    @abc.abstractmethod
    def conditional(self, drafts) -> np.ndarray:
        r"""Exact law of the output token given the drafts.

        Parameters
        ----------
        drafts : sequence of k int
            Draft token ids :math:`x_1, \dots, x_k` in ``[0, n)``.

        Returns
        -------
        (n,) ndarray of float64
            :math:`K(\cdot \mid x)`, non-negative and summing to 1.
        """

    @abc.abstractmethod
    def acceptance(self) -> float:
        r"""Exact acceptance :math:`P(Y \in S(X))` under :math:`X \sim p^{\otimes k}`."""

    def draft_law_of(self, drafts) -> float:
        r"""Probability of the draft tuple under the verifier's draft law.

        The i.i.d. product :math:`\prod_i p(x_i)` by default; a verifier whose
        drafts are not i.i.d. from ``p`` (e.g. drawn without replacement)
        overrides it, and :func:`check_lossless` enumerates with it. ``drafts`` is checked as
        :meth:`conditional` checks it (``k`` token ids in ``[0, n)``).
        """
        return math.prod(float(self.p[i]) for i in self._drafts(drafts))

    def output_law(self) -> np.ndarray:
        """Exact law of the output token (``q`` for a lossless verifier)."""
        return self.q

    def sample_drafts(self, *, rng=None) -> tuple[int, ...]:
        r"""Draw ``k`` drafts from the draft law this verifier assumes.

        .. math::

            X = (X_1, \dots, X_k) \sim p^{\otimes k}

        by default (the law of :meth:`draft_law_of`); a verifier with another
        draft law overrides both methods.

        Parameters
        ----------
        rng : numpy.random.Generator, int or None, keyword-only
            Source of randomness (through ``np.random.default_rng``).

        Returns
        -------
        tuple of k int
            Draft token ids in ``[0, n)``.

        Raises
        ------
        NotImplementedError
            If the subclass overrides :meth:`draft_law_of` but not this method.
        ValueError
            ``k`` above :data:`MAX_SAMPLE_DRAFTS` (10,000,000), before any draw.

        Examples
        --------
        >>> import otspec
        >>> v = otspec.optimal_verifier([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2)
        >>> x = v.sample_drafts(rng=0)
        >>> len(x), 0 <= v.sample(x, rng=1) < 3
        (2, True)
        """
        if type(self).draft_law_of is not Verifier.draft_law_of:
            raise NotImplementedError(
                f"{type(self).__name__} overrides draft_law_of, so it must override sample_drafts too"
            )
        check_draw_count(self.k)
        gen = as_rng(rng)
        c = np.cumsum(self.p)
        return tuple(sample_from_cdf(c, self.p, gen) for _ in range(self.k))

    def sample(self, drafts, *, rng=None) -> int:
        """Draw the output token given the drafts.

        Parameters
        ----------
        drafts : sequence of k int
            Draft token ids.
        rng : numpy.random.Generator, int or None, keyword-only
            Source of randomness (through ``np.random.default_rng``).

        Returns
        -------
        int
            The output token id.
        """
        gen = as_rng(rng)
        return sample_from(self.conditional(drafts), gen)

    def _drafts(self, drafts) -> tuple[int, ...]:
        return validate_drafts(drafts, self.k, self.n)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, k={self.k})"


#: Default tolerance of the exact (enumeration) lossless checks at every level.
LOSSLESS_TOL = 1e-9


@dataclass(frozen=True, eq=False)
class LosslessCheck:
    r"""The result of every ``check_lossless`` in otspec: one vocabulary at every level.

    Token level (:func:`otspec.check_lossless`), block level
    (:func:`otspec.block.check_lossless`), SpecTr over sequences
    (:func:`otspec.spectr.check_lossless`) and decoding with real models
    (:func:`otspec.decoding.check_lossless`) all return a subclass of this
    frozen dataclass, with these core fields first.

    Attributes
    ----------
    passed : bool
        Exact checks: ``max_error <= tol``. Sampling checks: the χ² test
        passed at its stated false-failure rate and no draw fell outside the
        target's support.
    max_error : float
        :math:`\max_o |\hat P(o) - P_{\rm target}(o)|` over the outcomes
        compared (tokens, blocks or sequences).
    law : ndarray
        The law produced by the verifier: exact (enumerated) or empirical
        (sampled) frequencies, on the same cells as ``target_law``.
    target_law : ndarray
        The target's law on those cells, computed independently of the verifier.
    method : {"enumeration", "sampling"}
        How ``law`` was obtained.
    n_cases : int
        What was enumerated (draft tuples, draft blocks, decoded sequences)
        or sampled (decoding runs).
    """

    passed: bool
    max_error: float
    law: np.ndarray
    target_law: np.ndarray
    method: str
    n_cases: int


@dataclass(frozen=True, eq=False)
class VerifierCheck(LosslessCheck):
    r"""Result of :func:`check_lossless` for a token-level verifier (exact enumeration over draft tuples).

    The core fields are those of :class:`LosslessCheck`: ``max_error`` is
    :math:`\max_y |\sum_x p^{\otimes k}(x) K(y|x) - q(y)|`, ``law`` the
    enumerated output law, ``target_law`` is ``q`` and ``n_cases`` the number
    of draft tuples enumerated (``|supp p|**k``; tuples of probability zero
    contribute nothing and are skipped).

    Attributes
    ----------
    max_law_error : float
        The same against ``verifier.output_law()`` (equals ``max_error`` for a
        lossless verifier; for a lossy one this is the check of its stated law).
    acceptance : float
        Enumerated :math:`P(Y \in S(X))`.
    acceptance_error : float
        ``|acceptance - verifier.acceptance()|``.
    max_row_error : float
        Largest ``|sum_y K(y|x) - 1|`` or negative entry over the tuples.
    """

    max_law_error: float
    acceptance: float
    acceptance_error: float
    max_row_error: float

    @property
    def max_marginal_error(self) -> float:
        """Alias of ``max_error`` (the output marginal against ``q``)."""
        return self.max_error

    @property
    def output_law(self) -> np.ndarray:
        """Alias of ``law`` (the enumerated output law)."""
        return self.law

    @property
    def n_tuples(self) -> int:
        """Alias of ``n_cases`` (draft tuples enumerated)."""
        return self.n_cases


def check_lossless(verifier: Verifier, *, max_tuples: int = 2_000_000, tol: float = LOSSLESS_TOL) -> VerifierCheck:
    r"""Check a verifier exactly by enumerating every draft tuple in :math:`\Omega^k`.

    .. math::

        \hat q(y) = \sum_{x \in \Omega^k} \prod_{i=1}^k p(x_i)\, K(y \mid x),
        \qquad
        \hat\alpha = \sum_{x \in \Omega^k} \prod_{i=1}^k p(x_i) \sum_{y \in S(x)} K(y \mid x).

    A verifier whose drafts are not i.i.d. overrides :meth:`Verifier.draft_law_of`,
    which then replaces :math:`\prod_i p(x_i)` (tuples of probability zero are skipped).

    Parameters
    ----------
    verifier : Verifier
        Any verifier of the package (or a user subclass of :class:`Verifier`).
    max_tuples : int, keyword-only
        Refuse to enumerate more than this many tuples (``n**k``), or tuples
        of more than this many drafts (``k``).
    tol : float, keyword-only
        ``passed`` is ``max_error <= tol`` (default :data:`LOSSLESS_TOL` = 1e-9).

    Returns
    -------
    VerifierCheck
        Largest marginal error against ``q`` (``max_error``), the enumerated
        law, the enumerated acceptance and its difference from
        ``verifier.acceptance()``.

    Raises
    ------
    TypeError
        If ``verifier`` is not a :class:`Verifier`.
    ValueError
        If ``n**k`` or ``k`` exceeds ``max_tuples``.

    Examples
    --------
    >>> import otspec
    >>> v = otspec.maximal_coupling([0.5, 0.5], [0.25, 0.75])
    >>> res = otspec.check_lossless(v)
    >>> res.passed, bool(res.max_error < 1e-12), round(res.acceptance, 12)
    (True, True, 0.75)
    """
    if not isinstance(verifier, Verifier):
        raise TypeError(f"`verifier` must be an otspec Verifier, got {type(verifier).__name__}")
    max_tuples = validate_positive_int(max_tuples, "max_tuples")
    tol = validate_tol(tol)
    n, k = verifier.n, verifier.k
    p = verifier.p
    support = np.flatnonzero(p > 0)
    s = len(support)
    if s > 1 and k * math.log(s) > math.log(max_tuples) + 30.0:  # never build s**k for a huge k
        raise ValueError(f"enumerating |supp p|**k = {s}**{k} draft tuples exceeds `max_tuples`={max_tuples}")
    if k > max_tuples:  # one support token: a single tuple, but of k entries (a huge k overflowed or hung)
        raise ValueError(f"enumerating draft tuples of `k`={k} tokens each exceeds `max_tuples`={max_tuples} "
                         f"(a tuple's entries count against it)")
    n_tuples = s**k
    if n_tuples > max_tuples:
        raise ValueError(
            f"enumerating |supp p|**k = {len(support)}**{k} = {n_tuples} draft tuples "
            f"exceeds `max_tuples`={max_tuples}"
        )
    law = np.zeros(n)
    acc_terms = []
    row_err = 0.0
    for x in itertools.product(support.tolist(), repeat=k):
        w = float(verifier.draft_law_of(x))
        if w == 0.0:
            continue  # a tuple the draft law never produces (e.g. a repeat without replacement)
        c = np.asarray(verifier.conditional(x), dtype=np.float64)
        row_err = max(row_err, abs(float(c.sum()) - 1.0), float(-min(c.min(), 0.0)))
        law += w * c
        acc_terms.append(w * float(c[list(set(x))].sum()))
    acceptance = math.fsum(acc_terms)
    max_error = float(np.max(np.abs(law - verifier.q)))
    return VerifierCheck(
        passed=bool(max_error <= tol),
        max_error=max_error,
        law=law,
        target_law=np.array(verifier.q),
        method="enumeration",
        n_cases=n_tuples,
        max_law_error=float(np.max(np.abs(law - verifier.output_law()))),
        acceptance=acceptance,
        acceptance_error=abs(acceptance - float(verifier.acceptance())),
        max_row_error=row_err,
    )


def validate_tol(tol, name: str = "tol", *, positive: bool = False, allow_none: bool = False) -> float | None:
    """A finite tolerance as a float: ``>= 0``, or ``> 0`` with ``positive=True``; None passes with ``allow_none``.

    The one check of every ``tol`` argument of the package: booleans (also ``np.bool_``), text and None (unless
    allowed) raise :class:`TypeError`; NaN, infinities and values below the bound raise :class:`ValueError`, both
    naming the parameter and saying what came.
    """
    if tol is None and allow_none:
        return None
    if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, numbers.Real):
        raise TypeError(f"`{name}` must be a real number{' or None' if allow_none else ''}, got {type(tol).__name__}")
    tol = float(tol)
    if not (math.isfinite(tol) and (tol > 0.0 if positive else tol >= 0.0)):
        raise ValueError(f"`{name}` must be finite and {'>' if positive else '>='} 0, got {tol!r}")
    return tol
