r"""Which package verifier runs at each verification step, resolved lazily by name.

Token-level schemes (SpecTr's DraftSelection over ``K`` i.i.d. draft
sequences; ``K = 1`` is Leviathan's speculative sampling) call a builder
``(p, q, k) -> otspec.Verifier`` at every depth, with ``k`` the number of
drafts still alive. Block schemes (``K = 1``) hand the whole draft block to
:mod:`otspec.block`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "TOKEN_VERIFIERS",
    "BLOCK_VERIFIERS",
    "VERIFIER_NAMES",
    "resolve_scheme",
    "Scheme",
    "block_tau_law",
]

#: token-level names -> attribute of ``otspec`` (``None``: the LP plan of :func:`otspec.otm_lp`)
TOKEN_VERIFIERS = {
    "token": "maximal_coupling",
    "kseq": "kseq",
    "multiround": "multiround",
    "optimal": "optimal_verifier",
    "lp": "otm_lp",
    "mentored": "mentored_verifier",
}
#: block names (one draft sequence), driven through :func:`otspec.block.make_verifier`
BLOCK_VERIFIERS = ("block", "block-onestep")
VERIFIER_NAMES = tuple(TOKEN_VERIFIERS) + BLOCK_VERIFIERS
_SINGLE_DRAFT = ("token", "mentored") + BLOCK_VERIFIERS
#: largest support (|supp p ∪ supp q|) the LP plan is built on
LP_MAX_SUPPORT = 64


@dataclass(frozen=True)
class Scheme:
    """A resolved verification scheme.

    Attributes
    ----------
    name : str
        The verifier's name (or the callable's ``__name__``).
    kind : {"token", "block"}
        Token-level DraftSelection or whole-block verification.
    build : callable or None
        ``(p, q, k) -> Verifier`` for token-level schemes.
    lossless : bool or None
        Known losslessness (None for a user callable: asked from the verifier).
    """

    name: str
    kind: str
    build: Callable | None
    lossless: bool | None


def resolve_scheme(verifier, *, num_drafts: int, truncated: bool, options: dict | None) -> Scheme:
    """Validate ``verifier`` against ``num_drafts`` and the sampling; return its :class:`Scheme`.

    Raises
    ------
    ValueError
        Unknown name, a single-draft scheme with ``num_drafts > 1``, ``"lp"``
        without top-k / top-p truncation, options for a scheme that takes none.
    TypeError
        ``verifier`` neither a name nor a callable; ``options`` not a dict.
    """
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise TypeError(f"`verifier_options` must be a dict or None, got {type(options).__name__}")
    if callable(verifier) and not isinstance(verifier, str):
        opts = dict(options)

        def build_callable(p, q, k):
            return verifier(p, q, k, **opts)

        return Scheme(getattr(verifier, "__name__", "custom"), "token", build_callable, None)
    if not isinstance(verifier, str):
        raise TypeError(
            f"`verifier` must be one of {VERIFIER_NAMES} or a callable (p, q, k) -> Verifier, "
            f"got {type(verifier).__name__}"
        )
    if verifier not in VERIFIER_NAMES:
        raise ValueError(f"`verifier` must be one of {VERIFIER_NAMES} or a callable, got {verifier!r}")
    if verifier in _SINGLE_DRAFT and num_drafts != 1:
        raise ValueError(
            f"`verifier`={verifier!r} verifies a single draft sequence, so `num_drafts` must be 1, "
            f"got {num_drafts}"
        )
    if verifier == "lp" and not truncated:
        raise ValueError(
            "`verifier`='lp' solves an LP over the draft sets of the support, which needs a truncated "
            "vocabulary: pass `top_k` (e.g. 8-32) or `top_p`"
        )
    # multi-round without replacement needs drafts drawn without replacement: not this loop's i.i.d. drafts
    allowed = {"mentored": {"D", "method"}, "kseq": {"rho"}}.get(verifier, set())
    extra = set(options) - allowed
    if extra:
        raise ValueError(
            f"`verifier_options` for {verifier!r} accepts {sorted(allowed)}, got unknown keys {sorted(extra)}"
        )
    if verifier == "mentored" and "D" not in options:
        raise ValueError("`verifier`='mentored' needs the KL budget: pass verifier_options={'D': ...}")
    if verifier in BLOCK_VERIFIERS:
        return Scheme(verifier, "block", None, True)
    import otspec

    fn = getattr(otspec, TOKEN_VERIFIERS[verifier])
    opts = dict(options)
    if verifier == "lp":

        def build(p, q, k):
            if p.shape[0] > LP_MAX_SUPPORT:
                raise ValueError(
                    f"`verifier`='lp' met a support of {p.shape[0]} tokens (above {LP_MAX_SUPPORT}); "
                    "lower `top_k` / `top_p`"
                )
            return fn(p, q, k, raise_on_failure=True).verifier

    elif verifier in ("token", "mentored"):

        def build(p, q, k):
            return fn(p, q, **opts)

    else:

        def build(p, q, k):
            return fn(p, q, k, **opts)

    return Scheme(verifier, "token", build, verifier != "mentored")


def _ratio(num: float, den: float) -> float:
    """``num / den`` with the mass-zero convention ``1`` when ``den == 0``."""
    return num / den if den > 0 else 1.0


def block_tau_law(name: str, block, cs, cb) -> np.ndarray:
    r"""Exact :math:`P(\tau = t \mid X^L)` of a block verifier from the conditionals along the block.

    .. math::

        \text{token:}\quad P(\tau \ge \ell \mid X^L) = \prod_{i \le \ell} \min\Big(1, \frac{q_i(X_i)}{p_i(X_i)}\Big);
        \qquad
        \text{block-onestep:}\quad P(\tau = t \mid X^L) = h_t \prod_{j > t} (1 - h_j);

    for ``"block"`` (the seed's v1) :math:`P(\tau = L) = \min(1, M_b(X^L)/M_s(X^L))`
    and the backward walk accepts :math:`X^{k}` with
    :math:`\min(1, p_{\rm remain}(X^k)/p_{\rm rej}(X^k))`, computed here in
    the scale-free form :math:`\sum_x (w_k q_{k+1}(x) - p_{k+1}(x))_\pm` with
    :math:`w_k = M_b(X^k)/M_s(X^k)`. Here ``p`` is the draft (:math:`M_s`) and
    ``q`` the target (:math:`M_b`); the formulas are those of
    :mod:`otspec.block` (checked against its enumeration in the tests).

    Parameters
    ----------
    name : {"token", "block", "block-onestep"}
    block : sequence of L int
        The draft block.
    cs : sequence of L (V,) arrays
        Draft conditionals :math:`M_s(\cdot \mid X^{i})`, ``i = 0..L-1``.
    cb : sequence of L or L+1 (V,) arrays
        Target conditionals :math:`M_b(\cdot \mid X^{i})`, ``i = 0..L-1`` (more are ignored).

    Returns
    -------
    (L + 1,) ndarray of float64
    """
    L = len(block)
    out = np.zeros(L + 1)
    # w[i] = M_b(X^i) / M_s(X^i) and the one-step weights p_i = min(p_{i-1} * ratio, 1)
    w = [1.0]
    pw = [1.0]
    for i in range(L):
        x = int(block[i])
        r = float(cb[i][x]) / float(cs[i][x]) if cs[i][x] > 0 else 1.0
        w.append(w[-1] * r)
        pw.append(min(pw[-1] * r, 1.0))
    if name == "token":
        alive = 1.0
        for i in range(L):
            x = int(block[i])
            a = min(1.0, _ratio(float(cb[i][x]), float(cs[i][x])))
            out[i] = alive * (1.0 - a)
            alive *= a
        out[L] = alive
        return out
    if name == "block-onestep":
        h = [1.0]
        for i in range(1, L):
            Z = float(np.maximum(pw[i] * cb[i] - cs[i], 0.0).sum())
            den = Z + 1.0 - pw[i]
            h.append(Z / den if den > 0 else 1.0)
        h.append(pw[L])
        tail = 1.0
        for t in range(L, -1, -1):
            out[t] = h[t] * tail
            tail *= 1.0 - h[t]
        return out
    if name == "block":
        aL = min(1.0, w[L])
        out[L] = aL
        left = 1.0 - aL
        for i in range(1, L + 1):
            k = L - i
            if k == 0:
                r = 1.0
            else:
                d = w[k] * cb[k] - cs[k]
                r = min(1.0, _ratio(float(np.maximum(d, 0.0).sum()), float(np.maximum(-d, 0.0).sum())))
            out[k] = left * r
            left *= 1.0 - r
        return out
    raise ValueError(f"`name` must be one of ('token', 'block', 'block-onestep'), got {name!r}")


def iid_block_efficiency(alpha: float, L: int) -> float:
    r"""Leviathan's i.i.d. approximation :math:`(1 - \alpha^{L+1}) / (1 - \alpha)` (``L + 1`` at ``alpha = 1``)."""
    if alpha >= 1.0:
        return float(L + 1)
    return (1.0 - alpha ** (L + 1)) / (1.0 - alpha)
