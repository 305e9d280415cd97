r"""Shared helpers of :mod:`otspec.spectr`: model access and token-level verifier factories.

A *model* is any object with ``next_dist(prefix: tuple[int, ...]) -> (V,)
array`` (the law of the next token given every token so far) and,
optionally, ``vocab_size``; the draft model is :math:`\mathcal M_s` and the
target model :math:`\mathcal M_b` (SpecTr's letters). At one position the
draft law is ``p = draft.next_dist(prefix)`` and the target law is
``q = target.next_dist(prefix)``, as everywhere in otspec.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from .._registry import (
    VerifierSpec,
    get_verifier,
    registered_name,
    registered_spelling,
    unknown_name_message,
    verifier_names,
)
from .._validation import validate_bool, validate_distribution, validate_positive_int
from .._verifier import Verifier
from ..models import (
    MAX_LENGTH,
    MarkovModel,
    MemorylessModel,
    check_length,
    validate_model,
    validate_model_pair,
    validate_sequence,
)
from ..multidraft._kseq import KSeq
from ..multidraft._multiround import MultiRound
from ..otm._multisets import multiset_law, n_multisets, token_counts

__all__ = [
    "VERIFIER_NAMES",
    "VerifierFactory",
    "resolve_verifier",
    "vocab_size",
    "next_dist",
    "context_key",
    "validate_models",
    "validate_prefix",
    "validate_branching",
    "read_branching",
    "MAX_STEP_ENUM",
    "MAX_DRAFT_TOKENS",
    "capped_count",
]

#: Names accepted by ``verifier=``: the token-level verifiers of the registry
#: (:data:`otspec.multidraft.VERIFIERS`) that need no options; each is built
#: lazily (when first used). Whether a verifier is symmetric (its conditional
#: depends on the drafts only through their multiset, so enumeration over
#: multisets is exact) or sequential is read from the registry.
VERIFIER_NAMES = tuple(
    n for n in verifier_names(kind="token")
    if not get_verifier(n).required and get_verifier(n).lossless and get_verifier(n).draft_process == "iid"
)


def _why_not(name: str) -> str:
    """Why the registered ``name`` is not in :data:`VERIFIER_NAMES`."""
    spec = get_verifier(name)
    if spec.kind != "token":
        return "a block-level verifier"
    if not spec.lossless:
        return "lossy"
    if spec.required:
        return f"needs the options {sorted(spec.required)}"
    return f"assumes {spec.draft_process!r} drafts, not i.i.d."


#: Default largest number of draft tuples (or multisets) enumerated for one
#: token-level step law.
MAX_STEP_ENUM = 2_000_000


# ----------------------------------------------------------------------------- models
def vocab_size(model, name: str) -> int:
    """Vocabulary size of a model (see :func:`otspec.models.validate_model`)."""
    return validate_model(model, name)


def validate_models(draft, target) -> int:
    """Check ``draft`` and ``target`` are models on the same vocabulary; return its size."""
    return validate_model_pair(draft, target)


def next_dist(model, prefix: tuple[int, ...], n: int, name: str) -> np.ndarray:
    """``model.next_dist(prefix)`` validated as a read-only float64 distribution of length ``n``."""
    law = validate_distribution(model.next_dist(prefix), f"{name}.next_dist({prefix})", normalizable=False)
    if law.shape[0] != n:
        raise ValueError(
            f"`{name}.next_dist({prefix})` must have length vocab_size={n}, got {law.shape[0]}"
        )
    return law


def validate_prefix(prefix, n: int) -> tuple[int, ...]:
    """The context as a tuple of token ids in ``[0, n)``."""
    return validate_sequence(prefix, n, "prefix")


def context_key(model, prefix: tuple[int, ...]):
    """A key such that equal keys give equal futures ``next_dist(prefix + s)`` for every ``s``.

    Used only to memoise exact recursions. A model may provide
    ``context_key(prefix)``; memoryless and order-``m`` Markov models of
    :mod:`otspec.models` are recognised (the last ``m`` tokens); any other
    model is keyed by its whole prefix (always correct, never merged).
    """
    fn = getattr(model, "context_key", None)
    if callable(fn):
        return ("user", fn(prefix))
    order = _known_order(model)
    if order is not None:
        return ("order", prefix[len(prefix) - order:] if order else ())
    return ("prefix", prefix)


def _known_order(model):
    if type(model) is MemorylessModel:
        return 0
    if type(model) is MarkovModel:
        return int(model.order)
    return None


#: Largest number of draft tokens ``K * L`` of one SpecTr iteration: every route
#: holds the ``(K, L)`` draft tokens (or walks that many tree nodes).
MAX_DRAFT_TOKENS = 10_000_000


def _too_many_tokens(K: int, L: int):
    return ValueError(
        f"`k` * `L` = {K} * {L} draft tokens exceeds the stated limit MAX_DRAFT_TOKENS={MAX_DRAFT_TOKENS}"
    )


def read_branching(branching, L: int | None = None, K: int | None = None) -> tuple[int, ...]:
    """The branching factors ``(k_1, ..., k_L)`` as positive ints, read in bounded time and memory.

    A sized container's length is checked before any entry is read; other iterables are read for at most
    ``L + 1`` entries (``MAX_LENGTH + 1`` when ``L`` is None), so ``range(10**12)`` or an endless generator is
    refused at once, never listed. The running product is refused as soon as it passes ``K`` (when given: the
    product must be ``K``) or ``prod * L`` passes ``MAX_DRAFT_TOKENS``, so no big integer is built either.
    """
    want = f"a sequence of L={L} positive integers" if L is not None else "a sequence of positive integers"
    if isinstance(branching, (str, bytes)):
        raise TypeError(f"`branching` must be {want}, got a string")
    limit = MAX_LENGTH if L is None else L
    try:
        n = len(branching)
    except TypeError:
        n = None
    sized = n is not None
    if n is None or n <= limit:
        try:
            ks = list(itertools.islice(branching, limit + 1))
        except TypeError as exc:
            raise TypeError(f"`branching` must be {want}, got {type(branching).__name__}") from exc
        n = len(ks)
    got = f"more than {limit}" if n > limit and not sized else str(n)
    if L is not None and n != L:
        raise ValueError(f"`branching` must have L={L} entries (k_1, ..., k_L), got {got}")
    if n == 0:
        raise ValueError("`branching` must have at least one entry (L >= 1), got an empty sequence")
    if n > limit:
        raise ValueError(f"`branching` must have at most MAX_LENGTH={MAX_LENGTH} entries (L: one model call per "
                         f"position), got {got}")
    out: list[int] = []
    prod = 1
    for k in ks:
        prod *= validate_positive_int(k, "branching[i]")
        out.append(int(k))
        # the running product: no bignum of a long branching
        if K is not None and prod > K:
            raise ValueError(f"`branching` must multiply to k={K} (prod k_i = k), got a product above it: "
                             f"{prod} after {len(out)} of its {n} entries")
        if prod * n > MAX_DRAFT_TOKENS:
            raise _too_many_tokens(prod if len(out) == n else f"at least {prod}", n)
    return tuple(out)


def validate_branching(K, L, branching) -> tuple[int, ...]:
    """Branching factors ``(k_1, ..., k_L)`` with product ``K``; i.i.d. drafts are ``(K, 1, ..., 1)``.

    Refuses ``L > MAX_LENGTH`` and ``K * L > MAX_DRAFT_TOKENS`` before building anything; the branching is read
    by :func:`read_branching` (at most ``L + 1`` entries).
    """
    K = validate_positive_int(K, "k")
    L = check_length(validate_positive_int(L, "L"))
    if K * L > MAX_DRAFT_TOKENS:
        raise _too_many_tokens(K, L)
    if branching is None:
        return (K,) + (1,) * (L - 1)
    ks = read_branching(branching, L, K)
    if math.prod(ks) != K:
        raise ValueError(f"`branching` must multiply to k={K} (prod k_i = k), got prod{ks} = {math.prod(ks)}")
    return ks


def capped_count(s: int, k: int, symmetric: bool, cap: int):
    """Number of draft multisets ``C(s + k - 1, k)`` (or tuples ``s**k``); ``math.inf`` when astronomically above ``cap``.

    Decided by logarithms first, so ``K = 10**12`` never builds a huge integer;
    counts within a factor ``e**30`` of ``cap`` are exact integers.
    """
    if s <= 1:
        return 1
    if symmetric:
        log_size = math.lgamma(s + k) - math.lgamma(k + 1) - math.lgamma(s)
    else:
        log_size = k * math.log(s)
    if log_size > math.log(cap) + 30.0:
        return math.inf
    return n_multisets(s, k) if symmetric else s**k


# ----------------------------------------------------------------------------- verifiers
class VerifierFactory:
    r"""Builds, checks and memoises the token-level verifier used at each depth of SpecTr.

    At a depth where ``k`` draft tokens :math:`X_1, \dots, X_k \sim p` i.i.d.
    are compared with the target law ``q``, ``factory(p, q, k)`` returns a
    :class:`~otspec.Verifier` for exactly that triple. Verifiers and their
    exact step laws (:meth:`step_law`) are cached by the bytes of ``(p, q)``
    and ``k``, so repeated contexts (Markov models, Monte Carlo loops) are
    built once.

    Parameters
    ----------
    build : callable ``(p, q, k) -> Verifier``
        Constructor of the token-level verifier.
    name : str
        A label for messages and reprs.
    symmetric : bool
        Whether ``conditional(drafts)`` depends on the drafts only through
        their multiset. Exact enumeration then runs over multisets
        (:math:`\binom{s + k - 1}{k}` of them) instead of the :math:`s^k`
        ordered tuples (``s`` = support size of ``p``). Claiming symmetry for
        an order-dependent verifier (k-Seq, multi-round) makes the exact
        analysis wrong, so it is False for callables unless stated.
    sequential : bool
        Whether every verifier built is k-Seq or multi-round with
        replacement, whose step law has the
        polynomial route of :meth:`step_law` (no enumeration, so no
        enumeration limit applies a priori).
    maxsize : int
        Largest number of cached verifiers (the cache is cleared when full).
    """

    def __init__(
        self, build: Callable, *, name: str, symmetric: bool, sequential: bool = False, maxsize: int = 100_000
    ):
        if not callable(build):
            raise TypeError(f"`build` must be a callable (p, q, k) -> Verifier, got {type(build).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str, got {type(name).__name__}")
        self._build = build
        self.name = name
        self.symmetric = validate_bool(symmetric, "symmetric")
        self.sequential = validate_bool(sequential, "sequential")
        self._maxsize = validate_positive_int(maxsize, "maxsize")
        self._verifiers: dict = {}
        self._laws: dict = {}

    def __repr__(self) -> str:
        return f"VerifierFactory(name={self.name!r}, symmetric={self.symmetric}, sequential={self.sequential})"

    def __call__(self, p: np.ndarray, q: np.ndarray, k: int) -> Verifier:
        key = (p.tobytes(), q.tobytes(), int(k))
        v = self._verifiers.get(key)
        if v is None:
            v = self._build(p, q, k)
            self._check(v, p, q, k)
            if len(self._verifiers) >= self._maxsize:
                self._verifiers.clear()
            self._verifiers[key] = v
        return v

    def _check(self, v, p, q, k) -> None:
        if not isinstance(v, Verifier):
            raise TypeError(
                f"`verifier` must build an otspec Verifier from (p, q, k), got {type(v).__name__} "
                f"from {self.name!r}"
            )
        if v.k != k:
            raise ValueError(
                f"`verifier` {self.name!r} returned a verifier for k={v.k} drafts, but {k} draft "
                "tokens are to be verified at this depth"
            )
        if v.n != p.shape[0]:
            raise ValueError(
                f"`verifier` {self.name!r} returned a verifier on {v.n} tokens, expected {p.shape[0]}"
            )
        if not (np.array_equal(np.asarray(v.p), p) and np.array_equal(np.asarray(v.q), q)):
            # a factory may renormalise; accept rounding, refuse a different pair
            if not (np.allclose(v.p, p, rtol=0, atol=1e-12) and np.allclose(v.q, q, rtol=0, atol=1e-12)):
                raise ValueError(
                    f"`verifier` {self.name!r} returned a verifier for a different (p, q) pair than asked"
                )

    def step_law(
        self, p: np.ndarray, q: np.ndarray, k: int, *, max_enum: int = MAX_STEP_ENUM, fast: bool = True
    ) -> np.ndarray:
        r"""Exact joint law of the output token and how many drafts equal it.

        .. math::

            W(y, c) = P\big(Y = y,\ \#\{i : X_i = y\} = c\big), \qquad
            X_1, \dots, X_k \overset{\text{i.i.d.}}{\sim} p,\quad Y \sim K(\cdot \mid X),

        for ``c = 0..k``, by enumeration of the draft tuples of
        :math:`\mathrm{supp}(p)^k` (multisets with multinomial weights when
        the factory is symmetric).

        Sequential first-accept verifiers (k-Seq and multi-round rejection
        sampling with replacement: accept draft ``i`` with probability
        :math:`a_i(X_i)`, return the first accepted, else draw a residual
        ``r``) get an exact polynomial-time route instead: with
        :math:`A_i = p(y) a_i(y)`, :math:`R_i(z) = \sum_{x \ne y} p(x)(1 -
        a_i(x)) + p(y)(1 - a_i(y))\, z` and :math:`F(z) = 1 - p(y) + p(y) z`,

        .. math::

            \sum_c W(y, c) z^c = \sum_{j=1}^{k} \Big[\prod_{i<j} R_i(z)\Big]
            A_j z\, F(z)^{k-j} + r(y) \prod_{i=1}^{k} R_i(z),

        (first acceptance at draft ``j``, or none), in :math:`O(n k^2)`.
        ``fast=False`` forces the enumeration (the tests compare both).

        Returns
        -------
        (n, k + 1) ndarray of float64
            ``W``; its entries sum to 1 and ``W.sum(axis=1)`` is the output law.

        Raises
        ------
        ValueError
            If more than ``max_enum`` tuples or multisets would be enumerated.
        """
        key = (p.tobytes(), q.tobytes(), int(k), bool(fast))
        law = self._laws.get(key)
        if law is not None:
            return law
        n = p.shape[0]
        if fast:
            v = self(p, q, k)
            seq = _sequential_params(v)
            if seq is not None:
                law = _sequential_step_law(p, *seq)
                law.setflags(write=False)
                self._store(key, law)
                return law
        support = np.flatnonzero(p > 0)
        s = support.shape[0]
        size = capped_count(s, k, self.symmetric, max_enum)
        if size > max_enum:
            kind = "multisets" if self.symmetric else "ordered draft tuples"
            count = f"more than {max_enum}" if size == math.inf else str(size)
            raise ValueError(
                f"the exact step law would enumerate {count} {kind} (|supp p|={s}, k={k}), above "
                f"`max_enum`={max_enum}; use block_efficiency_mc for models this large"
            )
        v = self(p, q, k)
        if self.symmetric:
            law_m = multiset_law(p, k)
            X, weights, counts = law_m.drafts, law_m.weights, law_m.counts()
        else:
            X = np.array(list(itertools.product(support.tolist(), repeat=k)), dtype=np.int64).reshape(-1, k)
            weights = np.prod(p[X], axis=1)
            counts = token_counts(X, n)
        drafts = [tuple(x) for x in X.tolist()]
        conds = np.empty((X.shape[0], n))
        for i, x in enumerate(drafts):
            conds[i] = v.conditional(x)
        law = np.zeros((n, k + 1))
        np.add.at(law, (np.broadcast_to(np.arange(n), counts.shape), counts), weights[:, None] * conds)
        law.setflags(write=False)
        self._store(key, law)
        return law

    def _store(self, key, law) -> None:
        if len(self._laws) >= self._maxsize:
            self._laws.clear()
        self._laws[key] = law


def _sequential_params(v):
    """``(accepts (k, n), residual (n,))`` for verifiers known to be sequential first-accept rules, else None."""
    if type(v) is KSeq:
        a = np.asarray(v.accept_probs, dtype=np.float64)
        return np.broadcast_to(a, (v.k, a.shape[0])), np.asarray(v.residual, dtype=np.float64)
    if type(v) is MultiRound and v.replacement:
        # round i accepts x with min(1, q_i(x)/p(x)); tokens with p(x) = 0 are never drawn
        T = np.asarray(v.targets, dtype=np.float64)
        p = np.asarray(v.p, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(p[None, :] > 0, np.minimum(1.0, T[: v.k] / np.where(p > 0, p, 1.0)[None, :]), 1.0)
        return a, T[v.k]
    return None


def _sequential_step_law(p: np.ndarray, accepts: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """W(y, c) of a sequential first-accept rule by generating functions (see ``step_law``)."""
    k, n = accepts.shape
    law = np.zeros((n, k + 1))
    rej = p[None, :] * (1.0 - accepts)  # (k, n): draw x at draft i and reject it
    rej_tot = rej.sum(axis=1)
    for y in range(n):
        py = p[y]
        # powers of F(z) = (1 - p(y)) + p(y) z
        fpow = [np.ones(1)]
        for _ in range(k):
            fpow.append(np.convolve(fpow[-1], [1.0 - py, py]))
        prefix = np.ones(1)  # prod_{i<j} R_i(z)
        for j in range(k):
            acc = py * accepts[j, y]
            if acc > 0:
                term = np.convolve(prefix, fpow[k - 1 - j]) * acc  # times z: shift by one
                law[y, 1 : term.shape[0] + 1] += term
            r_y = rej[j, y]
            prefix = np.convolve(prefix, [max(rej_tot[j] - r_y, 0.0), r_y])
        law[y, : prefix.shape[0]] += residual[y] * prefix
    return law


def resolve_verifier(verifier="lp", *, symmetric: bool | None = None) -> VerifierFactory:
    """Turn ``verifier=`` (a name, a package builder, a registry entry, a callable or a :class:`VerifierFactory`) into a factory.

    Parameters
    ----------
    verifier : str, callable, VerifierSpec or VerifierFactory
        A name of :data:`VERIFIER_NAMES` (``"lp"``: the OTM-k LP plan,
        :func:`otspec.otm_lp`; ``"optimal"``: :func:`otspec.optimal_verifier`;
        ``"kseq"``: SpecTr's k-Seq, :func:`otspec.kseq`; ``"multiround"``:
        recursive rejection sampling, :func:`otspec.multiround`; ...); a
        builder of the package standing for one of them (``otspec.otm_lp``,
        ``otspec.kseq``, ...: resolved to its name, with its registered
        flags, as in :mod:`otspec.decoding`); a registry entry
        (:class:`otspec.VerifierSpec`, e.g. ``otspec.get_verifier("kseq")``).
        Any other callable ``(p, q, k) -> Verifier`` is used as is.
    symmetric : bool or None
        Override the symmetry flag (see :class:`VerifierFactory`); None keeps
        the known value for names and False for callables.

    Returns
    -------
    VerifierFactory
        Builds ``(p, q, k) -> Verifier`` (memoised) with the verifier's symmetry
        and sequential flags.

    Raises
    ------
    ValueError
        An unknown name (with the closest names), or a package builder or
        registry entry of a verifier SpecTr cannot run (lossy, options
        required, or drafts not i.i.d.).
    TypeError
        A verifier instance (SpecTr needs a new plan at every depth) or a non-callable.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
       Transport", arXiv:2310.15141, Algorithm 3 (DraftSelection calls a token-level verifier at every
       depth).

    Examples
    --------
    >>> from otspec.spectr import resolve_verifier
    >>> f = resolve_verifier("kseq")
    >>> f.name, f.sequential
    ('kseq', True)
    >>> import otspec
    >>> resolve_verifier(otspec.otm_lp).name, resolve_verifier(otspec.get_verifier("optimal")).name
    ('lp', 'optimal')
    """
    symmetric = validate_bool(symmetric, "symmetric", allow_none=True)
    if isinstance(verifier, VerifierFactory):
        if symmetric is not None and bool(symmetric) != verifier.symmetric:
            return VerifierFactory(
                verifier._build, name=verifier.name, symmetric=bool(symmetric), sequential=verifier.sequential
            )
        return verifier
    known = registered_name(verifier) if not isinstance(verifier, (str, Verifier)) else None
    if known is not None:  # a package builder or a registry entry: the name it stands for
        if known not in VERIFIER_NAMES:
            raise ValueError(
                f"`verifier`={getattr(verifier, '__name__', known)} stands for the registered {known!r}, which "
                f"SpecTr cannot run ({_why_not(known)}); use one of {VERIFIER_NAMES}"
            )
        verifier = known
    elif isinstance(verifier, VerifierSpec):
        raise ValueError(f"`verifier` is a VerifierSpec named {verifier.name!r} that is not registered")
    if isinstance(verifier, str):
        if verifier not in VERIFIER_NAMES:
            meant = registered_spelling(verifier)
            note = (f"; {meant!r} is registered but SpecTr cannot run it ({_why_not(meant)})"
                    if meant is not None and meant not in VERIFIER_NAMES else "")
            raise ValueError(unknown_name_message("verifier", verifier, VERIFIER_NAMES,
                                                  alternative=" or a callable", note=note))
        spec = get_verifier(verifier)
        sym = spec.symmetric if symmetric is None else bool(symmetric)
        return VerifierFactory(spec.build, name=verifier, symmetric=sym, sequential=spec.sequential)
    if isinstance(verifier, Verifier):
        raise TypeError(
            f"`verifier` got a {type(verifier).__name__} instance, built for one fixed (p, q): SpecTr needs a new "
            "token-level plan at every depth: pass its name (e.g. 'kseq') or its builder (e.g. otspec.kseq)"
        )
    if callable(verifier):
        name = getattr(verifier, "__name__", type(verifier).__name__)
        return VerifierFactory(verifier, name=name, symmetric=bool(symmetric) if symmetric is not None else False)
    raise TypeError(unknown_name_message("verifier", verifier, VERIFIER_NAMES, alternative=" or a callable"))
