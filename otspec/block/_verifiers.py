r"""Block verifiers: TokenVerify, BlockVerify (v1, arXiv:2403.10444 Algorithm 3) and the one-step BlockVerify.

A draft block :math:`X^L = (X_1, \dots, X_L)` is drawn from the draft model
:math:`M_s` (the package's ``p``); the target model :math:`M_b` (``q``) scores
every prefix; a verifier accepts the first :math:`\tau` draft tokens and
continues the output so that, completed by the target model, it follows
:math:`M_b` exactly. Joint probabilities of prefixes are
:math:`M(x^i) = \prod_{j \le i} M(x_j \mid x^{j-1})`.

Every verifier here can

* run its algorithm on a draft block with explicit uniforms (:meth:`BlockVerifier.verify`,
  :meth:`BlockVerifier.sample`), querying the models only along the paths it
  visits, and
* give its exact laws by enumeration of :math:`\Omega^L`
  (:meth:`BlockVerifier.tau_law`, :meth:`BlockVerifier.output_law`,
  :meth:`BlockVerifier.expected_length`).

Counting convention: :math:`\tau` is the number of *accepted draft tokens*
(0..L). Each iteration emits :math:`\tau + 1` tokens: the accepted prefix and
one more (a correction when :math:`\tau < L`, the bonus token from
:math:`M_b(\cdot \mid X^L)` when :math:`\tau = L`). Sun et al.'s (arXiv:2403.10444) Bernoulli sums
start at :math:`i = 0`, i.e. they count :math:`\tau + 1`; pass
``include_bonus=True`` for that count.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import types
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._registry import VerifierSpec, get_verifier, lookup_verifier, register_verifier, unknown_name_message, verifier_names
from .._validation import as_rng, law_in_place, sequence_like, validate_distribution, validate_positive_int
from .._verifier import coin_accept, sample_from, sample_from_cdf
from ..models import (
    MAX_ENUMERATION,
    check_enumeration,
    check_length,
    conditional_tables,
    next_law,
    validate_model_pair,
    validate_sequence,
)
from ._weights import BIG_WEIGHT, path_weights

__all__ = [
    "BlockVerifier",
    "TokenVerify",
    "BlockVerify",
    "BlockVerifyOneStep",
    "BlockStep",
    "BlockSample",
    "VERIFIERS",
    "make_verifier",
    "tau_law_on_path",
]


# ---------------------------------------------------------------------------
# small numerical helpers
# ---------------------------------------------------------------------------


def _ratio_min1(num, den):
    """``min(1, num / den)`` elementwise, 1 where ``den == 0`` (mass-zero cases)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    # divided only where num < den (a quotient below 1): a subnormal den no longer overflows num / den to inf
    # (a RuntimeWarning) on the way to min(1, inf) = 1; the same values everywhere (num >= den gives 1 either way)
    small = num < den
    return np.where(small, num / np.where(small, den, 1.0), 1.0)


def _normalise_rows(w, fallback):
    """Rows of ``w`` normalised on the last axis; ``fallback`` rows where a row has no mass.

    The fallback is only reached on events of probability zero (a residual is
    empty exactly when the step that would use it is never taken), so any law
    keeps the output exact; the target conditional is the natural choice.
    """
    s = w.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(s > 0, w / np.where(s > 0, s, 1.0), fallback)
    return out


def _residual(w: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    s = float(w.sum())
    if not s > 0:
        return np.array(fallback, dtype=np.float64)
    return w / s


#: Most draws of one :meth:`BlockVerifier.sample_tau` call: each is a Python loop step of ``L`` model calls (tens of
#: microseconds), so ``n = 2**63`` ran without end while its list grew; refused before any draw.
MAX_SAMPLE_TAU = 10**7


#: Stand-in for a path weight above it (:func:`otspec.block._weights.path_weights`).
_BIG_WEIGHT = BIG_WEIGHT


def _path_weights(block, cs, cb):
    """Along the block: ``w[i] = M_b(X^i) / M_s(X^i)`` and the one-step ``p_i = min(p_{i-1} r_i, 1)``, exact past
    the float range (:func:`otspec.block._weights.path_weights` of the drafted tokens' probabilities)."""
    return path_weights([cs[i][x] for i, x in enumerate(block)], [cb[i][x] for i, x in enumerate(block)])


def _model_max_len(model):
    return getattr(model, "max_len", None)


def remain_rej(w: float, cb: np.ndarray, cs: np.ndarray, work=None) -> tuple[float, float]:
    r"""Block verification's backward test at the prefix :math:`X^k`, scaled by :math:`M_s(X^k)`.

    .. math::

        \Big(\sum_x (w_k\, M_b(x \mid X^k) - M_s(x \mid X^k))_+,\;
        \sum_x (M_s(x \mid X^k) - w_k\, M_b(x \mid X^k))_+\Big)
        = \frac{(p_{\rm remain}(X^k),\, p_{\rm rej}(X^k))}{M_s(X^k)},
        \qquad w_k = \frac{M_b(X^k)}{M_s(X^k)}

    (Sun et al., arXiv:2403.10444, Algorithm 3, eqs. 8-9): their ratio is the
    probability of accepting :math:`X^k` in the backward walk, and the one
    helper of the walk (:meth:`BlockVerify._run`), of its exact law
    (:func:`tau_law_on_path`) and of the decoder's route, so all three read
    the same bits.

    Parameters
    ----------
    w : float
        :math:`w_k` (the path weight of :func:`_path_weights`).
    cb, cs : (V,) ndarray of float64
        Target and draft conditionals after :math:`X^k`.
    work : tuple of two (V,) float64 arrays, optional
        Buffers written instead of fresh arrays (the same operations, the same values).

    Returns
    -------
    (float, float)
    """
    if work is None:
        d = w * cb - cs
        return float(np.maximum(d, 0.0).sum()), float(np.maximum(-d, 0.0).sum())
    a, b = work
    d = np.subtract(np.multiply(cb, w, out=a), cs, out=a)
    remain = float(np.maximum(d, 0.0, out=b).sum())
    return remain, float(np.maximum(np.negative(d, out=a), 0.0, out=a).sum())


def backward_law(w_L: float, sums) -> np.ndarray:
    r""":math:`P(\tau = t \mid X^L)`, ``t = 0..L``, of block verification from :math:`w_L` and the backward
    walk's ``sums[k - 1]`` :math:`= (p_{\rm remain}, p_{\rm rej})` of :math:`X^k` (:func:`remain_rej`),
    ``k = 1..L-1``: :math:`P(\tau = L) = \min(1, w_L)`, then ``k = L-1`` down to ``0``, :math:`X^k` accepted
    with probability :math:`\min(1, p_{\rm remain} / p_{\rm rej})` (1 at the empty prefix)."""
    L = len(sums) + 1
    out = np.zeros(L + 1)
    out[L] = min(1.0, w_L)
    left = 1.0 - out[L]
    for k in range(L - 1, -1, -1):
        r = 1.0 if k == 0 else float(_ratio_min1(*sums[k - 1]))
        out[k] = left * r
        left *= 1.0 - r
    return out


def draw_residual(jb: float, cb: np.ndarray, js: float, cs: np.ndarray, gen, work=None) -> int:
    r"""One token of block verification's continuation: :math:`x \sim (M_b(y^j, x) - M_s(y^j, x))_+` along the
    output prefix :math:`y^j` (Sun et al., arXiv:2403.10444, eq. 10), with :math:`M_b(y^j) =` ``jb``,
    :math:`M_s(y^j) =` ``js`` and the conditionals ``cb``, ``cs`` after it; from ``cb`` when the residual has no
    mass (an event of probability zero). One uniform of ``gen``, the inverse of the running sums of the weights
    (unnormalised, :func:`otspec._verifier.sample_from_cdf`); ``work`` as in :func:`remain_rej`."""
    a, b = (None, None) if work is None else work
    res = np.maximum(np.subtract(np.multiply(cb, jb, out=a), np.multiply(cs, js, out=b), out=a), 0.0, out=a)
    c = np.cumsum(res, out=b)
    if not c[-1] > 0:
        return sample_from(cb, gen)
    return sample_from_cdf(c, res, gen)


# ---------------------------------------------------------------------------
# exact tables shared by every verifier
# ---------------------------------------------------------------------------


class _Tables:
    """Every conditional and joint probability the exact laws need.

    ``cs[i]``, ``cb[i]``: shape ``(V,) * (i + 1)``, the conditionals after a
    prefix of length ``i`` (``i < L`` for the draft, ``i <= L`` for the target
    when the bonus is needed). ``Js[i]``, ``Jb[i]``: shape ``(V,) * i``, the
    joint probabilities of prefixes of length ``i = 0..L``.
    """

    def __init__(self, draft, target, L: int, target_len: int, max_entries: int):
        self.L = L
        self.cs = conditional_tables(draft, L, name="draft", max_entries=max_entries)
        self.cb = conditional_tables(target, target_len, name="target", max_entries=max_entries)
        self.V = self.cs[0].shape[0]
        self.Js = [np.ones(())]
        self.Jb = [np.ones(())]
        for i in range(L):
            self.Js.append(self.Js[i][..., None] * self.cs[i])
            self.Jb.append(self.Jb[i][..., None] * self.cb[i])

    def expand(self, a: np.ndarray) -> np.ndarray:
        """Broadcast an array over prefixes ``(V,) * i`` to blocks ``(V,) * L``."""
        return a.reshape(a.shape + (1,) * (self.L - a.ndim))


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockStep:
    """One verification of a given draft block (:meth:`BlockVerifier.verify`).

    Attributes
    ----------
    tau : int
        Accepted draft tokens, ``0 .. L``.
    emitted : tuple of int
        Tokens the verifier itself emits after the accepted prefix: one
        correction token (``tau < L``) or the bonus token (``tau == L``) for
        TokenVerify and the one-step BlockVerify; for v1 BlockVerify (arXiv:2403.10444, Algorithm 3)
        with ``tau < L`` the ``L - tau`` residual tokens followed by one token
        from the target model (so always ``L + 1 - tau`` tokens there).
    output : tuple of int
        ``block[:tau] + emitted``.
    """

    tau: int
    emitted: tuple[int, ...]
    output: tuple[int, ...]


@dataclass(frozen=True)
class BlockSample:
    """A draft block drawn from the draft model and its verification (:meth:`BlockVerifier.sample`).

    Attributes
    ----------
    block : tuple of int
        The draft block :math:`X^L`.
    tau : int
        Accepted draft tokens.
    output : tuple of int
        ``L + 1`` tokens: the accepted prefix, the verifier's tokens, then
        tokens from the target model up to length ``L + 1``. Its law is the
        target model's joint law of ``L + 1`` tokens (lossless).
    """

    block: tuple[int, ...]
    tau: int
    output: tuple[int, ...]


# ---------------------------------------------------------------------------
# the base class
# ---------------------------------------------------------------------------


class BlockVerifier(abc.ABC):
    r"""Abstract verifier of a draft block of length ``L`` (draft ``M_s``, target ``M_b``).

    Parameters
    ----------
    draft : Model
        Draft model :math:`M_s` (the package's ``p``).
    target : Model
        Target model :math:`M_b` (the package's ``q``), same vocabulary.
    L : int
        Block length (>= 1).
    max_entries : int, keyword-only
        Exact laws enumerate :math:`V^{L+1}` sequences; they refuse with a
        ValueError (before any model call) above this size.

    Attributes
    ----------
    draft, target : Model
    L : int
    vocab_size : int
    name : str
        ``"token"``, ``"block"`` or ``"block-onestep"``.
    """

    name: ClassVar[str] = ""

    def __init__(self, draft, target, L, *, max_entries: int = MAX_ENUMERATION):
        V = validate_model_pair(draft, target)
        L = check_length(validate_positive_int(L, "L"))
        self.max_entries = validate_positive_int(max_entries, "max_entries")
        for model, nm in ((draft, "draft"), (target, "target")):
            ml = _model_max_len(model)
            if ml is not None and ml < L:
                raise ValueError(
                    f"`{nm}` generates at most max_len={ml} tokens, but a block of `L`={L} needs {L}"
                )
        self.draft = draft
        self.target = target
        self.L = L
        self.vocab_size = V
        self._tables_cache: dict[int, _Tables] = {}
        self._law_cache: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}

    #: Largest number of validated conditionals kept per verifier (cleared when full).
    LAW_CACHE_SIZE = 100_000

    def _law(self, role: str, prefix: tuple[int, ...]) -> np.ndarray:
        """The ``role`` model's conditional after ``prefix``, validated once per prefix and then reused.

        Models are deterministic in their prefix (the :class:`otspec.Model`
        protocol), so the O(V) check of :func:`otspec.models.next_law` runs
        once per distinct prefix rather than once per sampled block.
        """
        key = (role, prefix)
        law = self._law_cache.get(key)
        if law is None:
            model = self.draft if role == "draft" else self.target
            law = next_law(model, prefix, self.vocab_size, role)
            if len(self._law_cache) >= self.LAW_CACHE_SIZE:
                self._law_cache.clear()
            self._law_cache[key] = law
        return law

    # -- exact route -------------------------------------------------------

    def _check_size(self, length: int) -> None:
        check_enumeration(self.vocab_size, length, self.max_entries,
                          length_name="L" if length == self.L else "(`L`+1)")

    def _tables(self, bonus: bool) -> _Tables:
        target_len = self.L + 1 if bonus else self.L
        self._check_size(target_len)
        if bonus:
            ml = _model_max_len(self.target)
            if ml is not None and ml < self.L + 1:
                raise ValueError(
                    f"`target` generates at most max_len={ml} tokens, but the output with the bonus "
                    f"token has `L`+1={self.L + 1}; pass bonus=False or a longer target"
                )
        if target_len not in self._tables_cache:
            self._tables_cache[target_len] = _Tables(
                self.draft, self.target, self.L, target_len, self.max_entries
            )
        return self._tables_cache[target_len]

    @abc.abstractmethod
    def _tau_given_block(self, T: _Tables) -> np.ndarray:
        """``(L + 1,) + (V,) * L`` array of :math:`P(\\tau = t \\mid X^L = x)`."""

    @abc.abstractmethod
    def _continuation(self, T: _Tables, t: int) -> list[np.ndarray]:
        """Conditional tables of output positions ``t+1 .. L`` given ``tau = t < L``.

        Element ``j - t`` has shape ``(V,) * (j + 1)``: the law of output token
        ``j + 1`` given the output prefix ``y^j`` (``j = t .. L - 1``).
        """

    def tau_given_block(self, block) -> np.ndarray:
        r"""Exact :math:`P(\tau = t \mid X^L = \text{block})` for ``t = 0..L`` (by enumeration tables).

        Parameters
        ----------
        block : sequence of L int

        Returns
        -------
        (L + 1,) ndarray of float64
        """
        block = self._block(block)
        T = self._tables(False)
        return np.array(self._tau_given_block(T)[(slice(None),) + block])

    def tau_law(self) -> np.ndarray:
        r"""Exact law of the accepted length :math:`\tau` under :math:`X^L \sim M_s`.

        Returns
        -------
        (L + 1,) ndarray of float64
            ``out[t] = P(tau = t)``, by enumeration of :math:`\Omega^L`.
        """
        T = self._tables(False)
        cond = self._tau_given_block(T)
        joint = cond * T.Js[self.L][None]
        return joint.reshape(self.L + 1, -1).sum(axis=1)

    def expected_length(self, *, include_bonus: bool = False) -> float:
        r"""Exact :math:`E[\tau]` (accepted draft tokens), or :math:`E[\tau] + 1` with ``include_bonus``."""
        law = self.tau_law()
        return float(math.fsum(law * np.arange(self.L + 1))) + (1.0 if include_bonus else 0.0)

    def output_law(self, *, bonus: bool = True) -> np.ndarray:
        r"""Exact law of the output sequence, by enumeration.

        The output is the accepted prefix, the verifier's continuation and
        the target model up to length ``L`` (``bonus=False``) or ``L + 1``
        (``bonus=True``: the bonus token after a fully accepted block, or one
        target token after the continuation otherwise).

        Returns
        -------
        ndarray of float64, shape ``(V,) * L`` or ``(V,) * (L + 1)``
            Equal to the target model's joint law for a lossless verifier.
        """
        L = self.L
        T = self._tables(bonus)
        cond = self._tau_given_block(T)
        joint = cond * T.Js[L][None]  # P(X^L = x, tau = t)
        out = np.zeros((self.vocab_size,) * L)
        for t in range(L + 1):
            m = joint[t].reshape(joint[t].shape[:t] + (-1,)).sum(axis=-1) if t < L else joint[t]
            law = m
            if t < L:
                for c in self._continuation(T, t):
                    law = law[..., None] * c
            out = out + law
        if bonus:
            out = out[..., None] * T.cb[L]
        return out

    # -- sampling route ------------------------------------------------------

    def _block(self, block) -> tuple[int, ...]:
        b = validate_sequence(block, self.vocab_size, "block")
        if len(b) != self.L:
            raise ValueError(f"`block` must hold L={self.L} token ids, got {len(b)}")
        return b

    def _path(self, block: tuple[int, ...]):
        """Draft and target conditionals along the block: ``cs[i]`` (i < L), ``cb[i]`` (i <= L)."""
        cs = [self._law("draft", block[:i]) for i in range(self.L)]
        cb = [self._law("target", block[:i]) for i in range(self.L + 1)]
        return cs, cb

    @abc.abstractmethod
    def _run(self, block, cs, cb, gen) -> tuple[int, tuple[int, ...]]:
        """The algorithm on one block: ``(tau, emitted tokens)``."""

    @staticmethod
    @abc.abstractmethod
    def _path_tau_law(block, cs, cb) -> np.ndarray:
        """:math:`P(\\tau = t \\mid X^L)` from the conditionals along the block (see :func:`tau_law_on_path`)."""

    def tau_law_on_path(self, block) -> np.ndarray:
        r"""Exact :math:`P(\tau = t \mid X^L = \text{block})` from the conditionals along the block only.

        Needs ``L`` draft and target calls, not the enumeration tables of
        :meth:`tau_given_block` (which it equals); see :func:`tau_law_on_path`.

        Parameters
        ----------
        block : sequence of L int

        Returns
        -------
        (L + 1,) ndarray of float64
        """
        block = self._block(block)
        cs, cb = self._path(block)
        return self._path_tau_law(block, cs, cb)

    def verify(self, block, *, rng=None) -> BlockStep:
        """Run the verifier's algorithm on a given draft block.

        Parameters
        ----------
        block : sequence of L int
            Draft tokens (normally drawn from the draft model).
        rng : numpy.random.Generator, int or None, keyword-only

        Returns
        -------
        BlockStep
        """
        block = self._block(block)
        gen = as_rng(rng)
        cs, cb = self._path(block)
        tau, emitted = self._run(block, cs, cb, gen)
        return BlockStep(tau=tau, emitted=emitted, output=block[:tau] + emitted)

    def sample(self, *, rng=None) -> BlockSample:
        """Draw a draft block from the draft model, verify it and complete the output to ``L + 1`` tokens.

        Parameters
        ----------
        rng : numpy.random.Generator, int or None, keyword-only

        Returns
        -------
        BlockSample
        """
        gen = as_rng(rng)
        block: tuple[int, ...] = ()
        for _ in range(self.L):
            block += (sample_from(self._law("draft", block), gen),)
        cs, cb = self._path(block)
        tau, emitted = self._run(block, cs, cb, gen)
        out = block[:tau] + emitted
        while len(out) < self.L + 1:
            out += (sample_from(self._law("target", out), gen),)
        return BlockSample(block=block, tau=tau, output=out)

    def sample_tau(self, n: int, *, rng=None) -> np.ndarray:
        """``n`` independent accepted lengths (draft block drawn each time).

        Returns
        -------
        (n,) ndarray of int64

        Raises
        ------
        ValueError
            ``n`` below 1 or above ``MAX_SAMPLE_TAU`` (10**7: one Python loop step of ``L`` model calls each).
        """
        n = validate_positive_int(n, "n")
        if n > MAX_SAMPLE_TAU:
            raise ValueError(f"`n` must be at most MAX_SAMPLE_TAU = {MAX_SAMPLE_TAU:,} (one Python loop step of L "
                             f"model calls each), got {n}")
        gen = as_rng(rng)
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            out[i] = self.sample(rng=gen).tau
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, L={self.L})"


# ---------------------------------------------------------------------------
# TokenVerify (arXiv:2403.10444, Algorithm 2; Leviathan et al. Algorithm 1 per position)
# ---------------------------------------------------------------------------


class TokenVerify(BlockVerifier):
    r"""Token-level verification (arXiv:2403.10444, Algorithm 2; Leviathan et al., Algorithm 1).

    .. math::

        P(\tau \ge \ell \mid X^L) = \prod_{i=1}^{\ell}
        \min\Big(1, \frac{M_b(X_i \mid X^{i-1})}{M_s(X_i \mid X^{i-1})}\Big),

    then one correction token from
    :math:`(M_b(\cdot \mid X^\tau) - M_s(\cdot \mid X^\tau))_+` normalised
    (:math:`\tau < L`) or the bonus token from :math:`M_b(\cdot \mid X^L)`.
    Expected accepted length (arXiv:2403.10444, Theorem 2, eq. 7):
    :math:`\sum_{\ell=1}^{L} \sum_{x^\ell} \prod_{i \le \ell} \min(M_s(x_i \mid x^{i-1}), M_b(x_i \mid x^{i-1}))`.

    Leviathan et al. write ``p`` for the target and ``q`` for the draft; here
    :math:`M_s` is the draft (``p``) and :math:`M_b` the target (``q``).

    See :class:`BlockVerifier` for the parameters.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import TokenVerify
    >>> v = TokenVerify(MemorylessModel([2/3, 1/3]), MemorylessModel([1/3, 2/3]), 2)
    >>> round(v.expected_length() * 9, 10)
    10.0
    """

    name = "token"

    def _tau_given_block(self, T):
        L = self.L
        # a[i] over prefixes x^{i+1}: acceptance of token i+1
        A = np.ones((self.vocab_size,) * L)
        out = np.empty((L + 1,) + A.shape)
        for i in range(L):
            # the strict coin of _run (eta * M_s < M_b): 0 where M_b = M_s = 0 (_ratio_min1 gave 1 there)
            a = T.expand(coin_accept(T.cb[i], T.cs[i]))
            nxt = A * a
            out[i] = A - nxt  # accepted i tokens, rejected token i+1
            A = nxt
        out[L] = A
        return out

    def _continuation(self, T, t):
        corr = _normalise_rows(np.maximum(T.cb[t] - T.cs[t], 0.0), T.cb[t])
        return [corr] + [T.cb[j] for j in range(t + 1, self.L)]

    @staticmethod
    def _path_tau_law(block, cs, cb):
        L = len(block)
        out = np.zeros(L + 1)
        alive = 1.0
        for i, x in enumerate(block):
            a = coin_accept(cb[i][x], cs[i][x])  # the strict coin of _run: never accepts a token of M_b = M_s = 0
            out[i] = alive * (1.0 - a)
            alive *= a
        out[L] = alive
        return out

    def _run(self, block, cs, cb, gen):
        L = self.L
        tau = 0
        for i in range(L):
            x = block[i]
            # eta_i <= min(1, M_b/M_s), division-free: eta * M_s(x) < M_b(x)
            if gen.random() * cs[i][x] < cb[i][x]:
                tau += 1
            else:
                break
        if tau == L:
            return L, (sample_from(cb[L], gen),)
        res = _residual(np.maximum(cb[tau] - cs[tau], 0.0), cb[tau])
        return tau, (sample_from(res, gen),)


# ---------------------------------------------------------------------------
# BlockVerify, v1 (arXiv:2403.10444, Algorithm 3 with the multi-token residual)
# ---------------------------------------------------------------------------


class BlockVerify(BlockVerifier):
    r"""Block-level verification, Sun et al., arXiv:2403.10444, Algorithm 3 (v1): optimal for block OT.

    Accept the whole block with probability
    :math:`\min(1, M_b(X^L) / M_s(X^L))`; otherwise, for :math:`i = 1..L`,
    accept the prefix :math:`X^{L-i}` with probability
    :math:`\min(1, p_{\rm remain}(X^{L-i}) / p_{\rm rej}(X^{L-i}))`, where

    .. math::

        p_{\rm remain}(x^i) = \sum_x (M_b(x^i, x) - M_s(x^i, x))_+, \qquad
        p_{\rm rej}(x^i) = \sum_x (M_s(x^i, x) - M_b(x^i, x))_+

    (joint probabilities, arXiv:2403.10444, eqs. 8–9). After :math:`\tau < L` accepted
    tokens the next :math:`L - \tau` output tokens are drawn one by one from
    :math:`p_{\rm res}^{y^j}(x) \propto (M_b(y^j, x) - M_s(y^j, x))_+`
    (arXiv:2403.10444, eq. 10) along the output prefix :math:`y^j`, and only then from
    :math:`M_b`. Its expected accepted length is the block-OT optimum
    (arXiv:2403.10444, Theorem 1, eq. 6):
    :math:`\sum_{\ell=1}^{L} \sum_{x^\ell} \min(M_s(x^\ell), M_b(x^\ell))`.

    Deviation from the paper's text: the last backward step (empty prefix)
    accepts with probability 1 exactly (the paper notes
    :math:`p_{\rm remain}(\emptyset) = p_{\rm rej}(\emptyset)`; we do not
    let rounding leave mass undecided).

    See :class:`BlockVerifier` for the parameters.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import BlockVerify
    >>> v = BlockVerify(MemorylessModel([2/3, 1/3]), MemorylessModel([1/3, 2/3]), 2)
    >>> round(v.expected_length() * 9, 10)
    12.0
    """

    name = "block"

    def _remain_rej(self, T):
        """``r[k]`` over prefixes ``x^k`` (k = 0..L-1): min(1, p_remain / p_rej); ``r[0] = 1``."""
        r = []
        for k in range(self.L):
            d = T.Jb[k + 1] - T.Js[k + 1]
            remain = np.maximum(d, 0.0).sum(axis=-1)
            rej = np.maximum(-d, 0.0).sum(axis=-1)
            r.append(_ratio_min1(remain, rej))
        r[0] = np.ones(())  # p_remain(empty) = p_rej(empty): always stop at the empty prefix
        return r

    def _tau_given_block(self, T):
        L = self.L
        shape = (self.vocab_size,) * L
        out = np.empty((L + 1,) + shape)
        aL = _ratio_min1(T.Jb[L], T.Js[L])
        out[L] = aL
        left = 1.0 - aL  # probability the backward walk is still undecided
        r = self._remain_rej(T)
        for i in range(1, L + 1):
            rk = T.expand(r[L - i])
            out[L - i] = left * rk
            left = left * (1.0 - rk)
        return out

    def _continuation(self, T, t):
        conts = []
        for j in range(t, self.L):
            w = np.maximum(T.Jb[j + 1] - T.Js[j + 1], 0.0)
            conts.append(_normalise_rows(w, T.cb[j]))
        return conts

    @staticmethod
    def _path_tau_law(block, cs, cb):
        # P(tau = L) = min(1, w_L); the backward walk accepts X^k with min(1, p_remain / p_rej),
        # computed scale-free as sum_x (w_k q_{k+1}(x) - p_{k+1}(x))_+ over its negative part
        L = len(block)
        w, _ = _path_weights(block, cs, cb)
        return backward_law(w[L], [remain_rej(w[k], cb[k], cs[k]) for k in range(1, L)])

    def _run(self, block, cs, cb, gen):
        L = self.L
        w, _ = _path_weights(block, cs, cb)
        # Step 1-3: whole-block maximal coupling, eta_0 < M_b(X^L) / M_s(X^L) (scale-free, as the law)
        if gen.random() < w[L]:
            return L, (sample_from(cb[L], gen),)
        tau = 0  # k = 0: p_remain(empty) = p_rej(empty), the empty prefix accepted
        for k in range(L - 1, 0, -1):  # Steps 5-11: backward acceptance, p_remain / p_rej scale-free
            remain, rej = remain_rej(w[k], cb[k], cs[k])
            if gen.random() * rej < remain:
                tau = k
                break
        # Step 16: L - tau tokens from p_res along the output prefix (joint probabilities), then M_b
        y = block[:tau]
        js = jb = 1.0
        for i in range(tau):
            js *= float(cs[i][block[i]])
            jb *= float(cb[i][block[i]])
        emitted: tuple[int, ...] = ()
        for _ in range(tau, L):
            cs_y = self._law("draft", y)
            cb_y = self._law("target", y)
            x = draw_residual(jb, cb_y, js, cs_y, gen)
            js *= float(cs_y[x])
            jb *= float(cb_y[x])
            y += (x,)
            emitted += (x,)
        emitted += (sample_from(self._law("target", y), gen),)
        return tau, emitted


# ---------------------------------------------------------------------------
# one-step BlockVerify (published final variant: a single correction token)
# ---------------------------------------------------------------------------


class BlockVerifyOneStep(BlockVerifier):
    r"""Block verification with one correction token (the published final variant of arXiv:2403.10444).

    With :math:`p_0 = 1` and, along the draft block,

    .. math::

        p_i = \min\Big(p_{i-1} \frac{M_b(X_i \mid X^{i-1})}{M_s(X_i \mid X^{i-1})}, 1\Big),
        \quad
        Z_i = \sum_x (p_i M_b(x \mid X^i) - M_s(x \mid X^i))_+,
        \quad
        h_i = \frac{Z_i}{Z_i + 1 - p_i} \ (i < L), \quad h_L = p_L

    (:math:`h_i = 1` when the denominator is 0), draw independent
    :math:`\eta_i \sim U(0, 1)` and set :math:`\tau = \max\{i : \eta_i \le h_i\}`
    (0 if none; not "stop at the first failure"). If :math:`\tau < L` emit
    one token from :math:`(p_\tau M_b(\cdot \mid X^\tau) - M_s(\cdot \mid X^\tau))_+`
    normalised, else the bonus token from :math:`M_b(\cdot \mid X^L)`. It
    uses only the conditionals of one decoding step and satisfies
    TokenVerify <= one-step <= v1 BlockVerify in expected length.

    See :class:`BlockVerifier` for the parameters.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import BlockVerifyOneStep
    >>> v = BlockVerifyOneStep(MemorylessModel([2/3, 1/3]), MemorylessModel([1/3, 2/3]), 2)
    >>> round(v.expected_length() * 9, 10)
    11.0
    """

    name = "block-onestep"

    def _weights(self, T):
        """``p[i]`` over prefixes ``x^i`` (i = 0..L) and ``h[i]`` (i = 1..L; ``h[0] = 1``)."""
        L = self.L
        p = [np.ones(())]
        for i in range(L):
            # M_b / M_s (1 where M_s = 0: such blocks have draft probability zero)
            with np.errstate(divide="ignore", invalid="ignore"):
                raw = np.where(T.cs[i] > 0, T.cb[i] / np.where(T.cs[i] > 0, T.cs[i], 1.0), 1.0)
            p.append(np.minimum(p[i][..., None] * raw, 1.0))
        h = [np.ones(())]
        for i in range(1, L):
            Z = np.maximum(p[i][..., None] * T.cb[i] - T.cs[i], 0.0).sum(axis=-1)
            den = Z + (1.0 - p[i])  # 1 - p exact on [0.5, 1]: p = 1 gives h = 1, not 1 + eps
            with np.errstate(divide="ignore", invalid="ignore"):
                h.append(np.where(den > 0, Z / np.where(den > 0, den, 1.0), 1.0))
        h.append(p[L])
        return p, h

    def _tau_given_block(self, T):
        L = self.L
        _, h = self._weights(T)
        out = np.empty((L + 1,) + (self.vocab_size,) * L)
        # P(tau = t) = h_t * prod_{j > t} (1 - h_j), h_0 = 1
        tail = np.ones((self.vocab_size,) * L)
        for t in range(L, -1, -1):
            ht = T.expand(h[t])
            out[t] = ht * tail
            tail = tail * (1.0 - ht)
        return out

    def _continuation(self, T, t):
        p, _ = self._weights(T)
        w = np.maximum(p[t][..., None] * T.cb[t] - T.cs[t], 0.0)
        return [_normalise_rows(w, T.cb[t])] + [T.cb[j] for j in range(t + 1, self.L)]

    @staticmethod
    def _path_tau_law(block, cs, cb):
        L = len(block)
        _, pw = _path_weights(block, cs, cb)
        h = [1.0]
        for i in range(1, L):
            Z = float(np.maximum(pw[i] * cb[i] - cs[i], 0.0).sum())
            den = Z + (1.0 - pw[i])
            h.append(Z / den if den > 0 else 1.0)
        h.append(pw[L])
        out = np.zeros(L + 1)
        tail = 1.0
        for t in range(L, -1, -1):
            out[t] = h[t] * tail
            tail *= 1.0 - h[t]
        return out

    def _run(self, block, cs, cb, gen):
        L = self.L
        _, p = _path_weights(block, cs, cb)  # the float chain min(p_{i-1} r_i, 1), exact where it overflows
        h = [1.0]
        for i in range(1, L):
            Z = float(np.maximum(p[i] * cb[i] - cs[i], 0.0).sum())
            den = Z + (1.0 - p[i])
            h.append(Z / den if den > 0 else 1.0)
        h.append(p[L])
        eta = gen.random(L)
        tau = 0
        for i in range(1, L + 1):
            if eta[i - 1] < h[i]:
                tau = i
        if tau == L:
            return L, (sample_from(cb[L], gen),)
        res = _residual(np.maximum(p[tau] * cb[tau] - cs[tau], 0.0), cb[tau])
        return tau, (sample_from(res, gen),)


_BLOCK_PAPER = "Sun et al., Block verification, arXiv:2403.10444"
register_verifier(dataclasses.replace(get_verifier("token"), build_block=TokenVerify), replace=True)
register_verifier(VerifierSpec(
    "block", "block", None, BlockVerify, single_draft=True,
    summary="block verification", reference=f"{_BLOCK_PAPER}, Algorithm 3",
))
register_verifier(VerifierSpec(
    "block-onestep", "block", None, BlockVerifyOneStep, single_draft=True,
    summary="block verification, one correction token",
    reference=f"{_BLOCK_PAPER}, published one-correction-token variant",
))

#: Block verifier classes by name: a read-only view of the registry
#: (:data:`otspec.multidraft.VERIFIERS`) restricted to the verifiers that run along a block.
VERIFIERS = types.MappingProxyType({n: get_verifier(n).build_block for n in verifier_names(block=True)})


def _block_class(verifier) -> type:
    names = verifier_names(block=True)
    if isinstance(verifier, BlockVerifier):
        return type(verifier)
    if not isinstance(verifier, str):
        raise TypeError(unknown_name_message("verifier", verifier, names, alternative=" or a BlockVerifier"))
    return lookup_verifier(verifier, "verifier", block=True).build_block


def tau_law_on_path(verifier, block, draft_conditionals, target_conditionals) -> np.ndarray:
    r"""Exact :math:`P(\tau = t \mid X^L)` of a block verifier from the conditionals logged along one block.

    .. math::

        \text{token:}\quad P(\tau \ge \ell \mid X^L) = \prod_{i \le \ell} \min\Big(1, \frac{q_i(X_i)}{p_i(X_i)}\Big);
        \qquad
        \text{block-onestep:}\quad P(\tau = t \mid X^L) = h_t \prod_{j > t} (1 - h_j);

    for ``"block"`` (Sun et al., arXiv:2403.10444, Algorithm 3)
    :math:`P(\tau = L) = \min(1, M_b(X^L)/M_s(X^L))` and the backward walk
    accepts :math:`X^{k}` with :math:`\min(1, p_{\rm remain}(X^k)/p_{\rm rej}(X^k))`.
    Here ``p`` is the draft (:math:`M_s`) and ``q`` the target (:math:`M_b`).
    Only the ``L`` draft and target conditionals along the block are needed
    (what a decoding loop has logged), so this works at any vocabulary size;
    on enumerable models it equals :meth:`BlockVerifier.tau_given_block`.

    Parameters
    ----------
    verifier : str or BlockVerifier
        A block-capable registered name (``"token"``, ``"block"``,
        ``"block-onestep"``) or a block verifier.
    block : sequence of L int
        The draft block.
    draft_conditionals : sequence of L (V,) arrays
        :math:`M_s(\cdot \mid X^{i})`, ``i = 0..L-1``.
    target_conditionals : sequence of L or L + 1 (V,) arrays
        :math:`M_b(\cdot \mid X^{i})`, ``i = 0..L-1`` (more are ignored).

    Returns
    -------
    (L + 1,) ndarray of float64

    Raises
    ------
    ValueError
        Unknown verifier name, an empty block, fewer conditionals than tokens in the block, conditionals that
        are not laws (finite, non-negative, summing to 1) of one vocabulary, or a token outside it.
    TypeError
        A block or conditionals that are not sequences, or token ids that are not integers.

    References
    ----------
    .. [1] Sun et al., "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", arXiv:2403.10444, Algorithms 2 and 3.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.block import tau_law_on_path
    >>> p, q = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    >>> tau_law_on_path("token", (0, 1), [p, p], [q, q]).round(4)
    array([0.5, 0. , 0.5])
    """
    cls = _block_class(verifier)
    if not sequence_like(block):  # a 0-d array: len() raised
        raise TypeError(f"`block` must be a sequence of token ids, got {type(block).__name__}")
    L = len(block)
    if L == 0:
        raise ValueError("`block` must hold at least one token (L >= 1), got an empty block")
    cs = _path_laws(draft_conditionals, "draft_conditionals", L)
    cb = _path_laws(target_conditionals, "target_conditionals", L)
    V = cs[0].shape[0]
    if cb[0].shape[0] != V:
        raise ValueError(f"`draft_conditionals` and `target_conditionals` must share one vocabulary, got laws of "
                         f"{V} and {cb[0].shape[0]} entries")
    if isinstance(verifier, BlockVerifier) and V != verifier.vocab_size:
        raise ValueError(f"`draft_conditionals` must have the verifier's vocabulary of {verifier.vocab_size} "
                         f"entries, got {V}")
    block = validate_sequence(block, V, "block")
    return cls._path_tau_law(block, cs, cb)


def _path_laws(laws, name: str, L: int) -> list:
    """The first ``L`` laws of ``laws`` (a sequence of ``(V,)`` laws or a ``(>= L, V)`` array), each checked as
    :func:`validate_distribution` checks a law and read as before, ``np.asarray(row, float64)`` (no subnormal
    flushed, no rescaling: the decoder's host route reads the same raw rows, and the logged laws agree to the
    bit), all of one length. A float64 row that surely passes is checked in one compiled read without a copy
    (:func:`otspec._validation.law_in_place`); every other row by :func:`validate_distribution`."""
    if not sequence_like(laws):
        raise TypeError(f"`{name}` must be a sequence of laws, got {type(laws).__name__}")
    if len(laws) < L:
        raise ValueError(f"`{name}` needs L={L} laws (one per token of `block`), got {len(laws)}")
    out = []
    for i in range(L):
        raw = laws[i]
        if law_in_place(raw) is None:
            # raises, or accepts a row read as before
            validate_distribution(raw, f"{name}[{i}]", flush=False, normalizable=False)
        row = np.asarray(raw, dtype=np.float64)
        if out and row.shape != out[0].shape:
            raise ValueError(f"`{name}` must hold laws of one length, got {out[0].shape[0]} entries at index 0 "
                             f"and {row.shape[0]} at index {i}")
        out.append(row)
    return out


def make_verifier(draft, target, L, verifier="block", *, max_entries: int = MAX_ENUMERATION) -> BlockVerifier:
    """Build a block verifier by name (``"token"``, ``"block"``, ``"block-onestep"``) or pass one through.

    Parameters
    ----------
    draft, target : Model
    L : int
    verifier : str or BlockVerifier
        A name from :data:`VERIFIERS`, or an existing verifier (its models
        and ``L`` must be ``draft``, ``target``, ``L``).
    max_entries : int, keyword-only

    Returns
    -------
    BlockVerifier
        The verifier named (``TokenVerify``, ``BlockVerify``, ``BlockVerifyOneStep``)
        for ``draft``, ``target`` and ``L``, or ``verifier`` itself.

    Raises
    ------
    ValueError
        Unknown name, or a verifier built for other models or another ``L``.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.block import make_verifier
    >>> make_verifier(MemorylessModel([0.5, 0.5]), MemorylessModel([0.2, 0.8]), 3, "token")
    TokenVerify(vocab_size=2, L=3)
    """
    if isinstance(verifier, BlockVerifier):
        L_ = validate_positive_int(L, "L")
        if verifier.draft is not draft or verifier.target is not target or verifier.L != L_:
            raise ValueError(
                "`verifier` was built for other models or another `L`; pass its name instead"
            )
        return verifier
    return _block_class(verifier)(draft, target, L, max_entries=max_entries)
