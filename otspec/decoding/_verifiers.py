r"""Which package verifier runs at each verification step, resolved lazily by name.

Token-level schemes (SpecTr's DraftSelection over ``k`` i.i.d. draft
sequences; ``k = 1`` is Leviathan's speculative sampling) call a builder
``(p, q, k) -> otspec.Verifier`` at every depth, with ``k`` the number of
drafts still alive. Block schemes (``k = 1``) hand the whole draft block to
:mod:`otspec.block`. Names, builders and properties come from the one
registry, :data:`otspec.multidraft.VERIFIERS`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._array import namespace
from .._registry import get_verifier, registered_name, registered_spelling, suggest, unknown_name_message, verifier_names
from .._verifier import Verifier, coin_accept
from ..block._multidraft import MAX_MULTIDRAFT_VARIABLES, check_multidraft_size
from ..block._weights import path_weight_rows
from ._deps import require
from ._sampling import _arange, _block, _scalar, draw_rows

torch = require("torch", "otspec.decoding")

__all__ = [
    "DEVICE_VERIFIERS",
    "LP_MAX_COLUMNS",
    "MULTIBLOCK_MAX_BLOCKS",
    "VERIFIER_NAMES",
    "as_verifier",
    "lp_columns",
    "lp_max_support",
    "decoding_names",
    "resolve_scheme",
    "trial_build",
    "round_targets_t",
    "Scheme",
    "step_law_t",
    "block_onestep_tau_law_t",
    "block_walk_t",
    "verify_block_onestep_t",
    "verify_chain_t",
]


def decoding_names() -> tuple[str, ...]:
    """Registered verifiers the decoding loop runs: i.i.d.-draft token-level schemes and block schemes."""
    return tuple(
        n for n in verifier_names() if get_verifier(n).kind == "block" or get_verifier(n).draft_process == "iid"
    )


#: Names accepted by ``verifier=`` at import (the registry, :data:`otspec.multidraft.VERIFIERS`, is
#: read again at every call, so verifiers registered later are accepted too).
VERIFIER_NAMES = decoding_names()
#: Largest number of columns (pairs (draft set A, token y in A)) of the OTM LP built at one
#: decoding step: sum_{j <= k} j * C(s, j) for a support of s tokens and k drafts. At this size one
#: HiGHS solve takes about a second on one core (s = 16, k = 4: 9,216 columns, 1.1 s; s = 32, k = 3:
#: 15,904 columns, 1.0 s; s = 32, k = 4: 125,456 columns, 107 s). Every other verifier of the package
#: costs O(s log s) or O(s k) per step and runs on a full vocabulary.
LP_MAX_COLUMNS = 16_384
#: Largest ``V**L`` (draft blocks enumerated) for the multi-draft block verifiers ``"multidraft-plan"`` and
#: ``"multidraft-one-token"``: they query both models on every prefix shorter than ``L`` (and the target
#: on every block) and solve an LP over sets of ``k`` blocks at every step, so they run on toy
#: vocabularies only (never at V = 49,152).
MULTIBLOCK_MAX_BLOCKS = 4096


def check_multiblock_size(name: str, V: int, L: int, k: int) -> None:
    """Raise ValueError when ``V**L`` exceeds :data:`MULTIBLOCK_MAX_BLOCKS`, or the LP over sets of ``k`` blocks
    exceeds :data:`otspec.block.MAX_MULTIDRAFT_VARIABLES` (checked before any model call)."""
    if V ** L > MULTIBLOCK_MAX_BLOCKS:
        raise ValueError(
            f"`verifier`={name!r} enumerates all V**L draft blocks at every step: V={V}, L={L} gives {V ** L} "
            f"> {MULTIBLOCK_MAX_BLOCKS} (MULTIBLOCK_MAX_BLOCKS); use a smaller L or a block verifier such as 'block'"
        )
    check_multidraft_size(V, L, k, MAX_MULTIDRAFT_VARIABLES, "MAX_MULTIDRAFT_VARIABLES")


def lp_columns(s: int, k: int) -> int:
    """Columns of the reduced OTM LP on a support of ``s`` tokens with ``k`` drafts: ``sum_{j<=k} j C(s, j)``."""
    return sum(j * math.comb(s, j) for j in range(1, min(k, s) + 1))


def lp_max_support(k: int) -> int:
    """Largest support ``s`` whose LP has at most :data:`LP_MAX_COLUMNS` columns for ``k`` drafts."""
    lo, hi = 1, LP_MAX_COLUMNS + 1  # lp_columns(s, k) >= s increases in s: bisect, lo fits and hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if lp_columns(mid, k) <= LP_MAX_COLUMNS else (lo, mid)
    return lo


@dataclass(frozen=True)
class Scheme:
    """A resolved verification scheme.

    Attributes
    ----------
    name : str
        The verifier's name (or the callable's ``__name__``).
    kind : {"token", "block", "multiblock", "tree"}
        Token-level DraftSelection, whole-block verification, ``k`` enumerated
        blocks, or a draft tree (verified by an :mod:`otspec.tree` verifier).
    build : callable or None
        ``(p, q, k) -> Verifier`` for token-level schemes.
    lossless : bool or None
        Known losslessness (None for a user callable: asked from the verifier).
    """

    name: str
    kind: str
    build: Callable | None
    lossless: bool | None


def _takes_k(fn) -> bool:
    """Whether a user callable is called as ``fn(p, q, k, ...)`` (third parameter named ``k``, or ``*args``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: assume the documented (p, q, k)
        return True
    positional = [q for q in params if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    if any(q.kind is q.VAR_POSITIONAL for q in params):
        return True
    return len(positional) >= 3 and positional[2].name == "k"


def as_verifier(out, name: str):
    """The :class:`otspec.Verifier` a builder returned: itself, or the ``.verifier`` of a result object."""
    if isinstance(out, Verifier):
        return out
    v = getattr(out, "verifier", None)
    if isinstance(v, Verifier):
        return v
    if hasattr(out, "verifier"):
        status = getattr(out, "status", None)
        raise ValueError(
            f"`verifier`={name!r} returned a {type(out).__name__} without a verifier"
            + (f" (status {status!r})" if status is not None else "")
        )
    raise TypeError(
        f"`verifier`={name!r} must return an otspec.Verifier or a result with a `.verifier` attribute "
        f"(e.g. otspec.OTMResult), got {type(out).__name__}"
    )


def _callable_scheme(fn, k: int, options: dict) -> Scheme:
    name = getattr(fn, "__name__", type(fn).__name__)
    opts = dict(options)
    if _takes_k(fn):

        def build(p, q, kk):
            return as_verifier(fn(p, q, kk, **opts), name)

    else:
        if k != 1:
            raise ValueError(
                f"`verifier`={name} takes no `k` parameter, so it verifies a single draft: `k` must be 1, got {k}"
            )

        def build(p, q, kk):
            return as_verifier(fn(p, q, **opts), name)

    return Scheme(name, "token", build, None)


def trial_build(spec, k: int, options: dict, label: str) -> None:
    """Build the registered verifier ``spec`` (a :class:`otspec.multidraft.VerifierSpec`) with ``options`` once on
    two equal laws of two tokens, so that an option value no pair of laws takes (``"mentored"``'s ``D < 0``,
    ``"kseq"``'s ``rho < 1``, a string for a number) is refused before any model call; the builder's ValueError or
    TypeError is raised again with ``label`` (which names the option's parameter) before its message. Schemes
    without a token-level builder: nothing."""
    if spec.build is None:
        return
    half = np.array([0.5, 0.5])
    try:
        spec.build(half, half.copy(), k, **options)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"{label}: {exc}") from None


def resolve_scheme(verifier, *, k: int, options: dict | None, vocab_size: int | None = None,
                   top_k: int | None = None, top_p: float | None = None) -> Scheme:
    r"""Validate ``verifier`` against ``k``, the vocabulary and the sampling; return its :class:`Scheme`.

    .. math::

        \text{verifier} \mapsto \big((p, q, k) \mapsto \text{Verifier}\big)
        \ \text{or a block scheme.}

    ``verifier`` may be

    * a registered name (:data:`otspec.multidraft.VERIFIERS` whose draft law
      is i.i.d., and the block schemes);
    * a builder of the package (``otspec.kseq``, ``otspec.otm_lp``,
      ``otspec.maximal_coupling``, ``otspec.mentored_verifier``, the block
      classes ``otspec.block.BlockVerify``, ...): run as its registered name;
    * any other callable: called as ``fn(p, q, k, **verifier_options)`` when
      its third parameter is named ``k`` (or it takes ``*args``), otherwise as
      ``fn(p, q, **verifier_options)`` with ``k = 1`` (e.g.
      ``otspec.lenient_verifier`` with ``verifier_options={"l": 0.5}``); it
      must return an :class:`otspec.Verifier` or a result object carrying one
      as ``.verifier`` (:class:`otspec.OTMResult`, :class:`otspec.MentoredResult`).

    ``"lp"`` builds the OTM LP at every step; its size is bounded by
    :data:`LP_MAX_COLUMNS` columns; :func:`lp_max_support` gives the largest
    support for each ``k``: 128 tokens for ``k = 2``, 32 for ``k = 3``, 18
    for ``k = 4``, 14 for ``k = 5``. A vocabulary within that bound needs
    no truncation; a larger one needs ``top_k`` at most that bound (or
    ``top_p``, checked at every step).

    Parameters
    ----------
    verifier : str or callable
        See above.
    k : int, keyword-only
        Number of drafts.
    options : dict or None, keyword-only
        ``verifier_options``: keyword options of the builder.
    vocab_size : int or None, keyword-only
        ``V`` (the LP's size check at resolve time; None skips it).
    top_k, top_p : keyword-only
        The sampling's truncation.

    Returns
    -------
    Scheme

    Raises
    ------
    ValueError
        Unknown name, a single-draft scheme with ``k > 1``, ``"lp"`` on a
        support above its bound without ``top_k`` / ``top_p``, options the
        scheme does not take, missing required options, option values no
        pair of laws takes (the builder is tried once on two equal laws of
        two tokens: ``"mentored"``'s ``D < 0``, ``"kseq"``'s ``rho < 1``).
    TypeError
        ``verifier`` a verifier instance, neither a name nor a callable;
        ``options`` not a dict.

    Examples
    --------
    >>> import otspec
    >>> from otspec.decoding._verifiers import resolve_scheme
    >>> resolve_scheme(otspec.otm_lp, k=2, options=None, vocab_size=6).name
    'lp'
    >>> resolve_scheme("lp", k=3, options=None, vocab_size=32000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `verifier`='lp' solves an LP ... the vocabulary has 32000 tokens: pass top_k between 1 and 32 ...
    """
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise TypeError(f"`verifier_options` must be a dict or None, got {type(options).__name__}")
    if isinstance(verifier, Verifier):
        raise TypeError(
            f"`verifier` got a {type(verifier).__name__} instance, built for one fixed (p, q); the decoder "
            "builds one at every step: pass its name (e.g. 'kseq') or its builder (e.g. otspec.kseq)"
        )
    if callable(verifier) and not isinstance(verifier, str):
        name = registered_name(verifier)  # a package builder (otspec.kseq -> "kseq"), by the one registry
        if name not in decoding_names():
            return _callable_scheme(verifier, k, options)
        verifier = name
    names = decoding_names()
    if not isinstance(verifier, str):
        raise TypeError(
            unknown_name_message("verifier", verifier, names, alternative=" or a callable (p, q, k) -> Verifier")
        )
    if verifier not in names:
        note, meant = "", registered_spelling(verifier)
        if meant is not None and meant not in names:
            note = (f"; {meant!r} is registered but assumes {get_verifier(meant).draft_process!r} drafts, "
                    "and the decoding loop draws them i.i.d.")
        raise ValueError(unknown_name_message("verifier", verifier, names, alternative=" or a callable", note=note))
    spec = get_verifier(verifier)
    if spec.single_draft and k != 1:
        raise ValueError(
            f"`verifier`={verifier!r} verifies a single draft sequence, so `k` must be 1, "
            f"got {k}"
        )
    if verifier == "lp" and vocab_size is not None:
        bound = lp_max_support(k)
        reach = vocab_size if top_k is None else min(vocab_size, top_k)
        if reach > bound and (top_p is None or top_p >= 1.0):
            raise ValueError(
                f"`verifier`='lp' solves an LP with sum_{{j<=k}} j*C(s, j) columns over a support of s tokens; "
                f"with k={k} drafts s may be at most {bound} ({LP_MAX_COLUMNS} columns, about 1 s per step), "
                f"but the {'top_k' if top_k is not None and top_k < vocab_size else 'vocabulary'} has "
                f"{reach} tokens: pass top_k between 1 and {bound} (or top_p, checked at every step)"
            )
    extra = set(options) - spec.options
    if extra:
        first = sorted(extra, key=str)[0]
        raise ValueError(
            f"`verifier_options` for {verifier!r} accepts {sorted(spec.options)}, got unknown keys "
            f"{sorted(extra, key=str)}{suggest(first, spec.options)}"
        )
    missing = spec.required - set(options)
    if missing:
        raise ValueError(
            f"`verifier`={verifier!r} needs options {sorted(missing)}: pass verifier_options={{...}}"
            + (" (the KL budget)" if verifier == "mentored" else "")
        )
    if options:  # option values no law takes (mentored's D < 0): refused before any call
        trial_build(spec, k, options, f"`verifier_options` for {verifier!r}")
    if spec.build_multi is not None:  # k draft blocks, every one of the V**L blocks enumerated
        return Scheme(verifier, "multiblock", None, spec.lossless)
    if spec.kind == "block":
        return Scheme(verifier, "block", None, spec.lossless)
    opts = dict(options)
    if verifier == "lp":

        def build(p, q, k):
            bound = lp_max_support(k)
            if p.shape[0] > bound:
                raise ValueError(
                    f"`verifier`='lp' met a support of {p.shape[0]} tokens with k={k} drafts (at most {bound}: "
                    f"{LP_MAX_COLUMNS} LP columns); pass top_k between 1 and {bound}"
                )
            return spec.build(p, q, k)

    else:

        def build(p, q, k):
            return spec.build(p, q, k, **opts)

    return Scheme(verifier, "token", build, spec.lossless)


# --------------------------------------------------------------------------- the device route (torch)
#: Registered verifiers that also run on the models' device, in torch: speculative sampling (``"token"``,
#: ``k = 1``) and multi-round rejection sampling (``"multiround"``, SpecInfer's rule over ``k`` i.i.d. drafts;
#: at ``k = 1`` it is ``"token"``) by :func:`verify_chain_t`, one-step block verification (``"block-onestep"``)
#: by :func:`verify_block_onestep_t`, block verification (``"block"``, Sun et al.'s Algorithm 3 with its
#: continuation) by :func:`block_walk_t` and the decoder's continuation on the device.
DEVICE_VERIFIERS = ("token", "multiround", "block-onestep", "block")


def round_targets_t(p, q, k: int):
    r"""The round targets of multi-round rejection sampling, where ``p`` and ``q`` live (torch, float64).

    .. math::

        T_0 = q, \qquad T_{i+1} = \frac{(T_i - p)_+}{\sum_y (T_i(y) - p(y))_+}
        \quad(T_{i+1} = T_i \text{ when the sum is } 0),

    the guarded residual of :func:`otspec.multidraft.residual` (a zero sum
    means a rejection has probability zero, so any law is correct).

    Parameters
    ----------
    p, q : torch.Tensor, shape ``(V,)``
        Draft and target laws (float64).
    k : int
        Rounds.

    Returns
    -------
    torch.Tensor, shape ``(k + 1, V)``
    """
    T = torch.empty((k + 1,) + tuple(q.shape), dtype=q.dtype, device=q.device)
    T[0] = q
    for i in range(k):
        r = (T[i] - p).clamp_(min=0.0)
        s = r.sum(dim=-1, keepdim=True)
        T[i + 1] = torch.where(s > 0, r / s, T[i])
    return T


def step_law_t(p, q, drafts):
    r"""Exact law of the output of one verified depth of :func:`verify_chain_t`, given its drafts.

    .. math::

        K(y \mid x_{1:k}) = \sum_{i=1}^k \Big[\prod_{j<i} (1 - a_j)\Big] a_i\,
        \mathbb 1\{y = x_i\} + \prod_{j=1}^k (1 - a_j)\, T_k(y),
        \qquad a_i = \min\Big(1, \frac{T_{i-1}(x_i)}{p(x_i)}\Big),

    computed from the same round targets (:func:`round_targets_t`) as the
    sampler; the tests hold it against :meth:`otspec.multidraft.MultiRound.conditional`
    and :meth:`otspec.multidraft.MaximalCoupling.conditional` (the independent numpy route).

    Parameters
    ----------
    p, q : torch.Tensor, shape ``(V,)``
    drafts : sequence of int
        The ``k`` draft tokens of the surviving rows, in row order.

    Returns
    -------
    torch.Tensor of float64, shape ``(V,)``
    """
    xs = [int(x) for x in drafts]
    T = round_targets_t(p, q, len(xs))
    out = torch.zeros_like(q)
    rem = 1.0
    for i, x in enumerate(xs):
        # the sampler's strict test u * p(x) < T_i(x), u uniform in [0, 1): never passed where T_i(x) = 0, p(x) = 0
        # included (``px <= tx`` gave 1 there, a token of target mass 0 emitted surely)
        a = coin_accept(float(T[i, x]), float(p[x]))
        out[x] += rem * a
        rem *= 1.0 - a
    return out + rem * T[len(xs)]


def verify_chain_t(X, P, Q, gen, *, draw=None, work=None):
    r"""Verify ``K`` i.i.d. draft chains on their device: multi-round rejection sampling at every depth.

    SpecTr's DraftSelection (Sun et al., arXiv:2310.15141, Algorithm 3) with
    SpecInfer's multi-round rule (Miao et al., arXiv:2305.09781, Algorithm 1)
    at each depth ``j``: the ``k_j`` drafts still alive (they share the
    prefix, so one pair of rows ``p_j, q_j``) are tried in row order, the
    ``i``-th accepted when :math:`u\,p_j(x) < T_{i-1}(x)`, otherwise the
    output is drawn from :math:`T_{k_j}` (:func:`round_targets_t`); the
    drafts equal to the output survive; a depth with none stops the chain,
    and after ``L`` accepted tokens a bonus token is drawn from
    :math:`q_{L+1}`. With ``K = 1`` this is Leviathan et al.'s speculative
    sampling (arXiv:2211.17192, Algorithm 1): every depth at once, the
    residual :math:`(q_{\tau+1} - p_{\tau+1})_+` drawn only at the first
    rejection (:math:`p_{L+1} = 0`: the bonus). Each depth's output follows
    :math:`q_j` exactly (:func:`step_law_t`), so the chain is lossless.

    Nothing leaves the device (no tensor is used as a Python index, which would synchronise a GPU): the
    draws use ``gen`` and :func:`draw_rows`
    (unnormalised weights, no sort; vLLM's v1 rejection sampler,
    ``vllm/v1/sample/rejection_sampler.py``, is the model: per-draft
    uniforms against the ratio, the recovered token from the residual), and
    the caller reads the results with one transfer.

    Parameters
    ----------
    X : torch.Tensor of int64, shape ``(K, L)``
        Draft tokens.
    P : torch.Tensor of float64, shape ``(K, L, V)``
        Draft laws along each chain.
    Q : torch.Tensor of float64, shape ``(K, L + 1, V)``
        Target laws along each chain (the last one gives the bonus token).
    gen : torch.Generator
        On the tensors' device.
    draw : callable, optional
        ``(W, gen) -> ids`` (default :func:`draw_rows`).
    work : dict, optional
        Buffers kept across calls (``_block``): at ``K = 1`` the residual's rows, its running sums and the
        acceptances' minima are written there instead of fresh ``(L, V)`` and ``(1, V)`` blocks (the same
        operations, the same bits); None: fresh tensors.

    Returns
    -------
    out : torch.Tensor of int64, shape ``(L + 1,)``
        ``out[:tau + 1]`` are the emitted tokens.
    tau : torch.Tensor of int64, shape ``()``
        Accepted draft tokens.
    row : torch.Tensor of int64, shape ``()``
        A chain holding the accepted tokens (its KV cache rows are kept).
    alpha : torch.Tensor of float64, shape ``(L,)``
        Exact acceptance of the verification at each depth, given that it is
        reached (meaningful for depths ``<= tau + 1``): :math:`\sum_x
        \min(p_j, q_j)` at ``K = 1``, :math:`1 - \prod_{i \le k_j} (1 -
        \beta_i)`, :math:`\beta_i = \sum_x \min(p_j, T_{i-1})`, otherwise.
    """
    draw = draw_rows if draw is None else draw
    K, L = X.shape
    dev = X.device
    if K == 1:
        return _verify_one_chain_t(X[0], P[0], Q[0], gen, draw, work)
    alive = torch.ones(K, dtype=torch.bool, device=dev)
    done = torch.zeros((), dtype=torch.bool, device=dev)
    tau = torch.zeros((), dtype=torch.int64, device=dev)
    out = torch.zeros(L + 1, dtype=torch.int64, device=dev)
    alpha = torch.empty(L, dtype=torch.float64, device=dev)
    u = torch.rand((L, K), dtype=torch.float64, device=dev, generator=gen)
    ranks = torch.arange(K, device=dev)
    for j in range(L):
        r0 = torch.argmax(alive.to(torch.int8)).reshape(1)  # the first chain alive: all share p_j, q_j
        p, q = P[:, j].index_select(0, r0)[0], Q[:, j].index_select(0, r0)[0]
        T = round_targets_t(p, q, K)
        kj = alive.sum()
        x = X[:, j]
        rnd = (torch.cumsum(alive, 0) - 1).clamp_(min=0)  # round of each alive chain
        acc = alive & (u[j] * p[x] < T[rnd, x])
        first = torch.argmax(acc.to(torch.int8))
        y = torch.where(acc.any(), x.index_select(0, first.reshape(1))[0], draw(T.index_select(0, kj.reshape(1)), gen)[0])
        beta = torch.minimum(p[None], T[:K]).sum(-1)
        alpha[j] = -torch.expm1(torch.where(ranks < kj, torch.log1p(-beta.clamp(max=1.0)), 0.0).sum())
        out[j] = torch.where(done, out[j], y)
        surv = alive & (x == y)
        go = ~done & surv.any()
        tau += go.to(torch.int64)
        alive = torch.where(go, surv, alive)
        done = ~go
    row = torch.argmax(alive.to(torch.int8))
    bonus = draw(Q[:, L].index_select(0, row.reshape(1)), gen)[0]
    out[L] = torch.where(done, out[L], bonus)
    return out, tau, row, alpha


def _draw_into(draw, W, gen, work, name: str):
    """``draw(W, gen)``; :func:`draw_rows` writes its running sums into the ``work`` block ``name`` (same bits)."""
    if draw is draw_rows and work is not None:
        return draw_rows(W, gen, out=_block(work, name, tuple(W.shape), W.device))
    return draw(W, gen)


def _verify_one_chain_t(x, P, Q, gen, draw, work=None):
    """:func:`verify_chain_t` at ``K = 1``: every depth's ratio test at once, one residual draw; the rows it
    forms written into the blocks of ``work`` (:func:`_block`; None: fresh ones)."""
    L, V = P.shape
    dev = x.device
    ar = _arange(0, L + 1, 1, dev)  # kept: no op per call
    px, qx = P[ar[:L], x], Q[ar[:L], x]
    u = torch.rand(L, dtype=torch.float64, device=dev, generator=gen)
    acc = u * px < qx  # strict and division-free: u = 0 never accepts a token with q(x) = 0
    tau = torch.cumprod(acc, 0, dtype=torch.int64).sum()  # the leading run of acceptances (no cast op first)
    j = tau.clamp(max=L - 1)
    r = torch.index_select(P, 0, j.reshape(1), out=_block(work, "chain_r", (1, V), dev))
    qrow = torch.index_select(Q, 0, tau.reshape(1), out=_block(work, "chain_q", (1, V), dev))
    r.mul_(tau < L)  # p_{L+1} = 0: at tau = L, q_{L+1} (a tensor, no sync)
    torch.sub(qrow, r, out=r).clamp_(min=0.0)
    r = torch.where(r.sum() > 0, r, qrow, out=r)  # the guarded residual (no mass: rejection had probability 0)
    y = _draw_into(draw, r, gen, work, "chain_c")[0]
    out = torch.cat([x, x[:1]])
    out = torch.where(ar < tau, out, y)
    alpha = torch.minimum(P, Q[:L], out=_block(work, "chain_min", (L, V), dev)).sum(-1)  # 1 - TV(p_j, q_j)
    return out, tau, _scalar(0, torch.int64, dev), alpha


def block_onestep_tau_law_t(x, P, Q, *, work=None):
    r"""The law of the accepted length of one-step block verification along a block, on its device.

    With :math:`w_0 = 1`, :math:`w_i = \min(1, w_{i-1} q_i(x_i) / p_i(x_i))`
    (the ratio 1 where :math:`p_i(x_i) = 0`),
    :math:`Z_i = \sum_y (w_i q_{i+1}(y) - p_{i+1}(y))_+`, :math:`h_i = Z_i / (Z_i + 1 - w_i)`
    for :math:`0 < i < L` (1 when the denominator is 0), :math:`h_0 = 1`, :math:`h_L = w_L`:

    .. math::

        P(\tau = t \mid x_{1:L}) = h_t \prod_{j > t} (1 - h_j)

    (Sun et al., arXiv:2403.10444, the one-correction-token variant; the
    numpy route is :meth:`otspec.block.BlockVerifyOneStep` and
    :func:`otspec.block.tau_law_on_path`).

    Parameters
    ----------
    x : torch.Tensor of int64, shape ``(L,)``
    P : torch.Tensor of float64, shape ``(L, V)``
        Draft laws along the block (``P[i]`` after ``x_{1:i}``).
    Q : torch.Tensor of float64, shape ``(L + 1, V)``
        Target laws along the block.
    work : dict, optional, keyword-only
        Buffers kept across calls (``_block``) for the ``(L - 1, V)`` block of the :math:`Z_i` (the same
        operations, the same bits); None: a fresh one.

    Returns
    -------
    law : torch.Tensor of float64, shape ``(L + 1,)``
    h : torch.Tensor of float64, shape ``(L + 1,)``
    w : torch.Tensor of float64, shape ``(L + 1,)``
    """
    L = x.shape[0]
    dev, dt = x.device, P.dtype
    one = _scalar(1.0, dt, P.device)  # kept 0-d operands: no scalar_tensor op per where
    ar = _arange(0, L, 1, dev)
    px, qx = P[ar, x], Q[ar, x]
    pos = px > 0
    raw = torch.where(pos, qx / torch.where(pos, px, one), one)

    def chain():  # w_i = min(w_{i-1} raw_i, 1), in order
        w = [one]
        for i in range(L):
            w.append(torch.clamp(w[i] * raw[i], max=1.0))
        return None, torch.stack(w[1:])[None]

    # exact past the float range (a draft probability below about 1e-154, ratios over- or underflowing on the way):
    # otspec.block's rule (path_weight_rows: this chain where it stays normal on the CPU)
    pw = path_weight_rows(px[None], qx[None], namespace(P), chain, block=False, onestep=True, ratio=raw[None])[1]
    w = torch.cat([one[None], pw[0]])  # (L + 1,)
    V = P.shape[-1]
    Z = torch.mul(w[1:L, None], Q[1:L], out=_block(work, "block_z", (L - 1, V), P.device))
    Z = Z.sub_(P[1:L]).clamp_(min=0.0).sum(-1)  # (L - 1,)
    den = Z + (1.0 - w[1:L])
    pos = den > 0
    hmid = torch.where(pos, Z / torch.where(pos, den, one), one)
    h = torch.cat([w[:1], hmid, w[L:]])  # h_0 = 1, h_L = w_L
    tail = torch.flip(torch.cumprod(torch.flip(1.0 - h, (0,)), 0), (0,))  # prod_{j >= t} (1 - h_j)
    law = h * torch.cat([tail[1:], one[None]])
    return law, h, w


def verify_block_onestep_t(X, P, Q, gen, *, draw=None, work=None):
    r"""One-step block verification (``K = 1``) on the models' device: one uniform per depth, one draw.

    :math:`\tau = \max\{i : \eta_i < h_i\}` (0 if none) with the :math:`h_i` of
    :func:`block_onestep_tau_law_t`; then one token from
    :math:`(w_\tau q_{\tau+1} - p_{\tau+1})_+` normalised (guarded to
    :math:`q_{\tau+1}` when it has no mass), or the bonus from
    :math:`q_{L+1}` at :math:`\tau = L` (:math:`p_{L+1} = 0`). The same rule
    as :class:`otspec.block.BlockVerifyOneStep`, lossless (Sun et al.,
    arXiv:2403.10444).

    Parameters
    ----------
    X, P, Q, gen, draw, work
        As :func:`verify_chain_t` with ``K = 1``.

    Returns
    -------
    out, tau, row
        As :func:`verify_chain_t`.
    law : torch.Tensor of float64, shape ``(L + 1,)``
        :math:`P(\tau = t \mid X)`, the exact prediction of this iteration.
    """
    draw = draw_rows if draw is None else draw
    x, P, Q = X[0], P[0], Q[0]
    L = x.shape[0]
    dev = x.device
    V = P.shape[-1]
    law, h, w = block_onestep_tau_law_t(x, P, Q, work=work)
    eta = torch.rand(L, dtype=torch.float64, device=dev, generator=gen)
    ar = _arange(0, L + 1, 1, dev)  # kept: no op per call
    tau = torch.amax(torch.where(eta < h[1:], ar[1:], _scalar(0, torch.int64, dev)))
    j = tau.clamp(max=L - 1).reshape(1)
    prow = torch.index_select(P, 0, j, out=_block(work, "chain_r", (1, V), dev)).mul_(tau < L)  # p_{L+1} = 0
    qrow = torch.index_select(Q, 0, tau.reshape(1), out=_block(work, "chain_q", (1, V), dev))
    r = torch.mul(qrow, w.index_select(0, tau.reshape(1)), out=_block(work, "block_r", (1, V), dev))
    r = r.sub_(prow).clamp_(min=0.0)
    r = torch.where(r.sum() > 0, r, qrow, out=r)
    y = _draw_into(draw, r, gen, work, "chain_c")[0]
    out = torch.where(ar < tau, torch.cat([x, x[:1]]), y)
    return out, tau, _scalar(0, torch.int64, dev), law


def block_walk_t(x, P, Q, gen, *, draw=None, work=None):
    r"""Block verification's decision (``verifier="block"``, ``K = 1``) on the models' device, and the first token
    after the accepted ones.

    With :math:`w_k = M_b(X^k) / M_s(X^k) = \prod_{i \le k} q_i(x_i) / p_i(x_i)` (a ratio 1 where
    :math:`p_i(x_i) = 0`) and, for ``k = 1..L-1``,

    .. math::

        (p_{\rm remain}, p_{\rm rej})(X^k) \propto \Big(\sum_x (w_k q_{k+1}(x) - p_{k+1}(x))_+,\;
        \sum_x (p_{k+1}(x) - w_k q_{k+1}(x))_+\Big),

    ``L`` uniforms :math:`\eta_0, \ldots, \eta_{L-1}`: :math:`\tau = L` if :math:`\eta_0 < w_L`, else the
    largest ``k`` with :math:`\eta_k\, p_{\rm rej}(X^k) < p_{\rm remain}(X^k)` (0 if none) -- the backward walk
    of Sun et al. (arXiv:2403.10444, Algorithm 3) from ``k = L-1`` down, stopping at its first acceptance, with
    an independent uniform per test, so the same law (:class:`otspec.block.BlockVerify` consumes them one by
    one). Then the first token of the output past :math:`X^\tau`: the bonus from :math:`q_{L+1}` at
    :math:`\tau = L`, else the residual :math:`(w_\tau q_{\tau+1} - p_{\tau+1})_+` normalised
    (:math:`\propto (M_b(X^\tau, x) - M_s(X^\tau, x))_+`, eq. 10; :math:`q_{\tau+1}` when it has no mass, an
    event of probability zero). The rest of the continuation needs model calls (the decoder's).

    Parameters
    ----------
    x : torch.Tensor of int64, shape ``(L,)``
    P : torch.Tensor of float64, shape ``(L, V)``
    Q : torch.Tensor of float64, shape ``(L + 1, V)``
        Draft and target laws along the block, as :func:`block_onestep_tau_law_t`.
    gen : torch.Generator
        On their device.
    draw, work
        As :func:`verify_chain_t`.

    Returns
    -------
    tau : torch.Tensor of int64, shape ``()``
    y : torch.Tensor of int64, shape ``()``
        The output's token ``tau + 1``.
    w : torch.Tensor of float64, shape ``(L + 1,)``
    sums : torch.Tensor of float64, shape ``(L - 1, 2)``
        :math:`(p_{\rm remain}, p_{\rm rej})` of :math:`X^k`, ``k = 1..L-1``, scaled by :math:`M_s(X^k)`: with
        :math:`w_L`, the exact law of :math:`\tau` (:func:`otspec.block._verifiers.backward_law`). Nothing is
        read on the host.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding._verifiers import block_walk_t
    >>> P = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    >>> Q = torch.tensor([[0.5, 0.5], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    >>> tau, y, w, sums = block_walk_t(torch.tensor([0, 1]), P, Q, torch.Generator().manual_seed(0))
    >>> int(tau), int(y), w.tolist()  # the same laws: every block accepted, the bonus from q_3
    (2, 0, [1.0, 1.0, 1.0])
    """
    draw = draw_rows if draw is None else draw
    L = x.shape[0]
    V = P.shape[-1]
    dev = x.device
    ar = torch.arange(L, device=dev)
    px, qx = P[ar, x], Q[ar, x]
    raw = torch.where(px > 0, qx / torch.where(px > 0, px, 1.0), 1.0)
    # the running products, exact past the float range by otspec.block's rule (path_weight_rows: a draft
    # probability below about 1e-154 or ratios over- or underflowing on the way; a weight above 2**900 stands for
    # itself)
    w = path_weight_rows(px[None], qx[None], namespace(P), lambda: (torch.cumprod(raw, 0)[None], None),
                         ratio=raw[None])[0][0]
    w = torch.cat([torch.ones(1, dtype=P.dtype, device=dev), w])
    D = torch.mul(w[1:L, None], Q[1:L], out=_block(work, "block_z", (L - 1, V), dev)).sub_(P[1:L])
    remain = torch.clamp(D, min=0.0).sum(-1)
    sums = torch.stack([remain, D.neg_().clamp_(min=0.0).sum(-1)], dim=-1)  # (L - 1, 2)
    eta = torch.rand(L, dtype=torch.float64, device=dev, generator=gen)
    back = torch.where(eta[1:] * sums[:, 1] < sums[:, 0], ar[1:], 0)
    tau = torch.where(eta[0] < w[L], L, torch.cat([back, ar[:1]]).amax())
    j = tau.clamp(max=L - 1).reshape(1)
    prow = torch.index_select(P, 0, j, out=_block(work, "chain_r", (1, V), dev)).mul_(tau < L)  # p_{L+1} = 0
    qrow = torch.index_select(Q, 0, tau.reshape(1), out=_block(work, "chain_q", (1, V), dev))
    r = torch.mul(qrow, torch.where(tau < L, w.index_select(0, tau.reshape(1)), 1.0),
                  out=_block(work, "block_r", (1, V), dev))
    r = r.sub_(prow).clamp_(min=0.0)
    r = torch.where(r.sum() > 0, r, qrow, out=r)
    y = _draw_into(draw, r, gen, work, "chain_c")[0]
    return tau, y, w, sums
