r"""Block verification's path weights, exact past the float range, for one path (Python floats) or rows of paths.

Along a draft block :math:`X^L` with :math:`r_i = q_i(X_i) / p_i(X_i)` (1 where :math:`p_i(X_i) = 0`), block
verification (Sun et al., "Block Verification Accelerates Speculative Decoding", arXiv:2403.10444, Algorithm 3)
reads the weights :math:`w_k = \prod_{i \le k} r_i = M_b(X^k) / M_s(X^k)` and its one-correction-token variant the
capped chain :math:`p_k = \min(1, p_{k-1} r_k)`, :math:`p_0 = w_0 = 1`. Their float products leave the float range
on the way to a representable value: a ratio over a draft probability below about ``1e-154`` overflows (then
``inf * 0 = nan``), ``1e200 * 1e200 * 1e-300`` overflows, ``1e-200 * 1e-200 * 1e300`` underflows. Every route of
the package (:mod:`otspec.block`, the profile's batched laws, the decoder's host and device routes) takes the same
rule: the float products where every product of the chain is normal (or an exact zero after a zero ratio), bit for
bit; elsewhere the weights recomputed without leaving the range, a weight above :data:`BIG_WEIGHT` standing for
itself (every decision it enters is then 1).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .._array import namespace
from .._validation import NEGLIGIBLE

__all__ = ["BIG_WEIGHT", "chains_lost", "float_chains", "path_weights", "path_weight_rows"]

#: Stand-in for a path weight above it: every decision it enters is then 1 (``min(1, w)``, and
#: ``p_remain >= p_rej`` since ``p_remain - p_rej = w sum(q) - sum(p) > 0``), and ``w * q`` summed over any
#: vocabulary stays finite.
BIG_WEIGHT = 2.0**900

#: ``log2`` of :data:`BIG_WEIGHT`.
_BIG_EXP = 900


def float_chains(px, qx) -> tuple[list, list, bool, bool]:
    """The float chains of :func:`path_weights` (``w``, ``p``: lists of ``L + 1`` floats) and whether each stayed
    in the normal range: every ratio zero or normal, every product normal, or an exact zero after a zero ratio."""
    w, pw = [1.0], [1.0]
    exact_zero, ok_w, ok_p = False, True, True
    for s, b in zip(px, qx):
        r = float(b) / float(s) if s > 0 else 1.0
        w.append(w[-1] * r)
        pw.append(min(pw[-1] * r, 1.0))
        exact_zero = exact_zero or r == 0.0
        # a zero weight is exact only after a zero ratio; an infinite or subnormal ratio (a quotient of a few bits,
        # its error absolute: a product with a large weight may be normal and wrong in its 14th digit) or a
        # subnormal, infinite or nan product has lost the weight
        r_ok = r == 0.0 or NEGLIGIBLE <= r < math.inf
        ok_w = ok_w and r_ok and ((w[-1] == 0.0 and exact_zero) or NEGLIGIBLE <= w[-1] < math.inf)
        ok_p = ok_p and r_ok and ((pw[-1] == 0.0 and exact_zero) or NEGLIGIBLE <= pw[-1] < math.inf)
    return w, pw, ok_w, ok_p


def path_weights(px, qx) -> tuple[list, list]:
    r"""``w[k] = prod_{i <= k} r_i`` and the one-step ``p[k] = min(p[k - 1] r_k, 1)``, ``k = 0..L``, of one path.

    .. math::

        r_i = \frac{q_i(X_i)}{p_i(X_i)} \ (1 \text{ where } p_i(X_i) = 0), \qquad
        w_k = \prod_{i \le k} r_i, \qquad p_k = \min(1, p_{k-1} r_k), \qquad w_0 = p_0 = 1.

    When either chain leaves the normal range (:func:`float_chains`: an infinite or subnormal ratio, a subnormal,
    infinite or nan product; a zero only after a zero ratio) both are recomputed in exact rationals of the same float64
    entries, each value rounded once, a weight above :data:`BIG_WEIGHT` standing for itself; chains that stay
    normal are the float products, bit for bit.

    Parameters
    ----------
    px, qx : sequences of L floats
        The draft's and the target's probabilities of the drafted tokens, :math:`p_i(X_i)` and :math:`q_i(X_i)`.

    Returns
    -------
    w, p : lists of L + 1 floats

    Examples
    --------
    >>> from otspec.block._weights import path_weights
    >>> w, p = path_weights([1e-200, 1e-200, 0.5], [0.5, 0.5, 1e-300])  # (5e199)**2 overflows on the way
    >>> w[-1], p[-1]
    (5e+99, 2e-300)
    """
    w, pw, ok_w, ok_p = float_chains(px, qx)
    if ok_w and ok_p:
        return w, pw
    W, PW = Fraction(1), Fraction(1)
    w, pw = [1.0], [1.0]
    for s, b in zip(px, qx):
        s, b = Fraction(float(s)), Fraction(float(b))
        r = b / s if s > 0 else Fraction(1)
        W, PW = W * r, min(PW * r, Fraction(1))
        w.append(BIG_WEIGHT if W > BIG_WEIGHT else float(W))
        pw.append(float(PW))
    return w, pw


def path_weight_rows(px, qx, xp, chains, *, block: bool = True, onestep: bool = False, ratio=None):
    r"""The weights :math:`w_k` and the one-step chain :math:`p_k` of :func:`path_weights` for rows of paths, exact
    past the float range.

    .. math::

        w_{r,k} = \prod_{i \le k} \rho_{r,i}\, 2^{\sum_{i \le k} e_{r,i}}, \qquad
        p_{r,k} = \min\Big(1, \min_{0 \le j < k} \frac{w_{r,k}}{w_{r,j}}\Big),

    with :math:`q_{r,i}(X_i) = m^q 2^{e^q}`, :math:`p_{r,i}(X_i) = m^p 2^{e^p}` (``frexp``),
    :math:`\rho = m^q / m^p \in (1/2, 2)`, :math:`e = e^q - e^p` (integers, summed exactly): the products of the
    :math:`\rho` stay within :math:`2^{\pm L}`, and one scaling by a power of two rounds each weight once (a
    weight above :data:`BIG_WEIGHT` stands for itself, as in :func:`path_weights`); the one-step chain is the
    smallest capped quotient of two weights (:math:`p_k = \min(1, p_{k-1} r_k)` unrolled). The caller's float
    chains (``chains()``) are kept where every product of the chain up to the entry is normal (or an exact zero
    after a zero ratio; the rule of :func:`float_chains`), so the values there are the caller's own bits; the
    other entries take the values above, within a few roundings per depth of the exact chain. numpy arrays are
    checked first by the extremes of the ratios and chains (a few reductions), the values above formed only when
    some entry needs them; torch tensors (on any device) are not read: the values above are formed on every call
    and merged by ``where``.

    Parameters
    ----------
    px, qx : (R, L) float64 arrays of namespace ``xp`` (numpy or torch)
        The draft's and the target's probabilities of the drafted tokens of each row.
    xp : namespace
    chains : callable
        ``chains() -> (w, pw)``: the caller's float chains (``(R, L)`` arrays, :math:`w_1 .. w_L` and
        :math:`p_1 .. p_L`; None for a chain not asked for).
    block, onestep : bool, keyword-only
        Which chains are asked for.
    ratio : (R, L) float64 array, optional, keyword-only
        The caller's ratios (``qx / px``, 1 where ``px = 0``), when already formed.

    Returns
    -------
    w, pw : (R, L) float64 arrays (None for a chain not asked for)

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.block._weights import path_weight_rows
    >>> px, qx = np.array([[1e-200, 1e-200, 0.5]]), np.array([[0.5, 0.5, 1e-300]])
    >>> with np.errstate(over="ignore"):
    ...     w = np.cumprod(qx / px, axis=-1)
    >>> w.tolist(), path_weight_rows(px, qx, np, lambda: (w, None))[0].tolist()
    ([[5e+199, inf, inf]], [[5e+199, 8.452712498170644e+270, 5e+99]])
    """
    w, pw = chains()
    w, pw = (w if block else None), (pw if onestep else None)
    if not isinstance(px, np.ndarray):  # torch (any device): no read, the recomputed chains merged by where
        return _rows(px, qx, w, pw, ratio, xp)
    got = _host_rows(px, qx, w, pw, ratio)
    return (w, pw) if got is None else got


def _host_rows(px, qx, w, pw, ratio):
    """:func:`path_weight_rows` on numpy arrays; None when every entry keeps its float value (most calls: checked
    by the extremes of the ratios and chains first, a few reductions)."""
    if ratio is None:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            ratio = np.where(px > 0, qx / np.where(px > 0, px, 1.0), 1.0)
    if _all_normal(ratio, w, pw):
        return None
    # array-api-compat's numpy namespace, not numpy itself: cumulative_sum, cumulative_prod and concat are numpy >= 2
    return _rows(px, qx, w, pw, ratio, namespace(px))


def _all_normal(ratio, w, pw) -> bool:
    """Whether every ratio and every product of the numpy chains ``w``, ``pw`` (either None) is normal: the
    extremes alone (a nan fails both tests)."""
    arrays = [a for a in (ratio, w, pw) if a is not None]
    lo, hi = min(float(a.min()) for a in arrays), max(float(a.max()) for a in arrays)
    return lo >= NEGLIGIBLE and hi < math.inf


def chains_lost(ratio, w, pw) -> bool:
    r"""Whether float chains brought to the host lost some entry (the rule of :func:`float_chains`, row by row).

    .. math::

        \exists\, r, k:\ 
ho_{r,k} 
otin \{0\} \cup [2^{-1022}, \infty) \ 	ext{ or }        c_{r,k} 
otin [2^{-1022}, \infty) \ (c_{r,k} 
e 0 	ext{ or no } 
ho_{r,i \le k} = 0),
        \quad c \in \{w, p\},

    for the ratios :math:`
ho` (``q / p``, 1 where ``p = 0``) and the running products ``w`` and ``pw`` of
    :func:`path_weight_rows` (``(R, L)``; either None). For a caller that forms the plain float chains where its
    laws are (nothing read there), reads them in a read it already does, and recomputes with
    :func:`path_weight_rows` only when this is true: its values are then :func:`path_weight_rows`' bit for bit
    (where no entry is lost those keep the float chains). Checked by the extremes first (a few reductions), the
    rows' mask only when some ratio or product is zero, subnormal or not finite.

    Parameters
    ----------
    ratio : (R, L) float64 numpy array
    w, pw : (R, L) float64 numpy arrays or None

    Returns
    -------
    bool

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.block._weights import chains_lost
    >>> ratio = np.array([[2.0, 0.0, 3.0], [1e200, 1e200, 1e-300]])
    >>> with np.errstate(over="ignore"):
    ...     w = np.cumprod(ratio, axis=-1)
    >>> chains_lost(ratio[:1], w[:1], None), chains_lost(ratio, w, None)  # an exact zero; an overflow on the way
    (False, True)
    """
    if _all_normal(ratio, w, pw):
        return False
    return bool(np.any(_lost(ratio, w, pw, namespace(ratio))))


def _rows(px, qx, w, pw, ratio, xp):
    """:func:`path_weight_rows` in the namespace ``xp`` (numpy once some entry needs it; torch on every call) without
    reading the arrays: one mask for both chains (an entry lost once its row lost a ratio or a product up to it,
    :func:`float_chains`' rule), the recomputed chains formed whether or not an entry needs them, merged by
    ``where``."""
    some = px > 0
    if ratio is None:
        ratio = xp.where(some, qx / xp.where(some, px, 1.0), 1.0)
    bad = _lost(ratio, w, pw, xp)
    ws, pws = _scaled_chains(px, qx, some, xp, w is not None, pw is not None)
    return tuple(None if v is None else xp.where(bad, s, v) for v, s in zip((w, pw), (ws, pws)))


def _lost(ratio, w, pw, xp):
    """Where the float chains ``w`` and ``pw`` (either None) have lost their value: a row's entries from its first
    infinite or subnormal ratio (a subnormal quotient lost its digits), subnormal, infinite or nan product, or zero
    not after a zero ratio, on (:func:`float_chains`' rule, one mask for both chains)."""
    zero = ratio == 0.0
    zero_seen = xp.cumulative_sum(zero, axis=-1, dtype=xp.int64) > 0  # summed as int64: no cast of its own
    good = zero | _normal(ratio, xp)
    # a product after a zero ratio, every ratio and product before it good, is an exact zero (0 times finite
    # ratios, capped or not); a nonzero one there needs an infinite or nan ratio, not good itself: so "zero seen"
    # alone stands for "zero, after a zero ratio" in the running mask (two ops a chain fewer, the same mask)
    for v in (w, pw):
        if v is not None:
            good = good & (_normal(v, xp) | zero_seen)
    return xp.cumulative_sum(~good, axis=-1, dtype=xp.int64) > 0


#: The largest finite float64.
_MAX = float(np.finfo(np.float64).max)


def _normal(x, xp):
    r"""Where ``x`` is a normal finite float, :math:`2^{-1022} \le x \le` the largest float (a nan is not): the
    clipped value equal to itself, two ops where the two comparisons and their ``&`` were three."""
    return xp.clip(x, NEGLIGIBLE, _MAX) == x


def _ldexp(m, e, xp):
    r""":math:`m\, 2^e` rounded once, for ``m`` in :math:`[2^{-3}, 8]` and int64 ``e`` in ``[-1100, 900]``: the
    exact product by :math:`2^{e + 100}` (a power of two from its bits: ``torch.ldexp`` forms :math:`2^e` in a
    rounding ``pow``), normal and finite, then the one rounding product by :math:`2^{-100}`."""
    bits = (e + (1023 + 100)) << 52
    p = bits.view(np.float64) if isinstance(bits, np.ndarray) else bits.view(_torch_float64(bits))
    return (m * p) * 2.0**-100


def _torch_float64(t):
    import torch

    return torch.float64


def _frexp(x, xp):
    """``frexp`` of float64 ``x``: mantissas and the library's integer exponents (int32; summed as int64 below)."""
    return xp.frexp(x)


def _scaled_chains(px, qx, some, xp, block: bool, onestep: bool):
    """:func:`path_weight_rows`' chains from mantissas and exact integer exponents: ``(w, pw)``, each None unless
    asked for (``block``, ``onestep``)."""
    mq, eq = _frexp(xp.where(some, qx, 1.0), xp)  # 1 / 1 where p = 0: the ratio 1
    mp, ep = _frexp(xp.where(some, px, 1.0), xp)
    mu, f = _frexp(xp.cumulative_prod(mq / mp, axis=-1), xp)  # each factor in (1/2, 2): no under- or overflow
    E = xp.cumulative_sum(eq - ep, axis=-1, dtype=xp.int64) + f  # w_k = mu_k 2**E_k, mu_k in [1/2, 1) (0 after a zero ratio)
    zero = mu == 0.0
    w = pw = None
    if block:
        w = xp.where((E > _BIG_EXP) & ~zero, BIG_WEIGHT, _ldexp(mu, xp.clip(E, -1100, _BIG_EXP), xp))
    if onestep:
        # p_k = min(1, min_{j < k} w_k / w_j), w_0 = 1 = (1/2) 2**1; a zero w_j (j < k) makes w_k zero, and p_k = 0
        R, L = int(px.shape[0]), int(px.shape[-1])
        half, one, upper = _onestep_consts(R, L, mu, E, xp)
        mu0 = xp.concat([half, xp.where(zero, 1.0, mu)[:, : L - 1]], axis=-1)  # w_j, j = 0..L-1
        E0 = xp.concat([one, E[:, : L - 1]], axis=-1)
        q = _ldexp(mu[:, None, :] / mu0[:, :, None], xp.clip(E[:, None, :] - E0[:, :, None], -1100, 2), xp)
        q = xp.where(upper, xp.clip(q, None, 1.0), 1.0)  # (R, j, k): j < k only
        pw = xp.where(zero, 0.0, xp.min(q, axis=1))
    return w, pw


#: :func:`_onestep_consts`' arrays by (namespace, rows, length, dtypes, device): made once per run.
_CONSTS: dict = {}


def _onestep_consts(R: int, L: int, mu, E, xp) -> tuple:
    r"""The constants of :func:`_scaled_chains`' one-step chain, made once per shape, dtype and device (never
    written: only concatenated and selected by): the mantissa and the exponent of :math:`w_0 = 1 = (1/2)\, 2^1`
    (``(R, 1)`` each, of ``mu``'s and ``E``'s dtypes) and the ``(L, L)`` mask ``j <= k``."""
    dev = _device(mu)
    key = (getattr(xp, "__name__", str(xp)), R, L, str(mu.dtype), str(E.dtype), str(dev))
    got = _CONSTS.get(key)
    if got is None:
        j = xp.arange(L, device=dev)
        got = (xp.full((R, 1), 0.5, dtype=mu.dtype, device=dev), xp.ones((R, 1), dtype=E.dtype, device=dev),
               j[:, None] <= j[None, :])
        if len(_CONSTS) >= 64:
            _CONSTS.clear()
        _CONSTS[key] = got
    return got


def _device(x):
    import array_api_compat

    return array_api_compat.device(x)
