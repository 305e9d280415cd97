r"""Batched per-position quantities of the token verifiers: ``(..., V)`` laws in, ``(...)`` values out.

A practitioner logs, at every position of a batch, the acceptance of one
draft (maximal coupling, :math:`1 - \mathrm{TV}`) and of SpecTr's k-Seq
(:math:`\rho^*` and its acceptance) beside :math:`\alpha_k`
(:func:`otspec.alpha_k`, batched the same way). These functions take the
laws as numpy arrays or torch tensors (CPU or CUDA) of shape ``(..., V)``
through the array API standard (array-api-compat) and return the same array
type on the same device, in float64; the values equal the per-row numpy
functions (:func:`otspec.maximal_coupling`, :func:`otspec.kseq_rho_star`,
:func:`otspec.kseq_p_acc`) to 1e-12. Where :math:`\beta(\rho^*)` is tiny
(laws that barely overlap) k-Seq's :math:`\rho^*` is within a few ulps of
the exact root on numpy and on torch alike, and its acceptance below 1/2 is
the accepted mass summed directly (relative accuracy down to 1e-300).

Mentored decoding's acceptance at a KL budget (:func:`otspec.mentored`) is
not batched: its solver searches, per row, a data-dependent set of tokens
whose mass is moved and then a Lagrange multiplier by safeguarded Newton
steps whose number and bracketing differ from row to row (with subnormal
entries handled token by token), so a batched version would be a ragged
loop in disguise; call it per row.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import math

import numpy as np

from .._array import namespace, parse_ks, validate_batch_pair
from ._kseq import _rho_star_exact

__all__ = ["batched_maximal_coupling_acceptance", "batched_kseq_rho_star", "batched_kseq_acceptance"]

#: Bisection steps on the final interval of rho (halving [1, k] to below one ulp): the most ever taken.
_BISECT = 80


def _bisect_steps(k_hi: float) -> int:
    r"""Steps after which the bisection of :func:`_rho_star_rows` on ``[lo, hi]``, ``1 <= lo <= hi <= k_hi``, is still:
    its state after :data:`_BISECT` steps, bit for bit, at far fewer ops (one per step and kernel on a device).

    A step replaces one end of ``[a, b]`` by :math:`m = \mathrm{RN}((a + b) / 2)` (``0.5 * (a + b)``: the sum
    rounded once, the halving exact), which lies strictly inside whenever a float does; within one binade (spacing
    ``u``, :math:`b - a = N u`) the new interval spans at most :math:`\lceil N / 2 \rceil u`, across a binade boundary
    at most :math:`(b - a) / 2 + u_b` (:math:`u_b` the spacing below ``b``). So after
    :math:`\lceil \log_2((k_{hi} - 1) / 2^{-52}) \rceil` steps at most a few floats lie inside, after a few more none
    (``a``, ``b`` adjacent or equal), and one step later the state no longer changes, whatever the predicate: ``m`` is
    then ``a`` or ``b``, and a step either leaves the state as it was (and so does every later one: the same test of
    the same ``m``) or makes ``a == b``. Six steps of margin on top; never more than :data:`_BISECT`
    (``tests/test_profile_quantities_bisect.py`` checks the stillness on every interval shape and on predicates
    that change their answer at every float).
    """
    width = max(float(k_hi) - 1.0, 2.0**-52)
    return min(_BISECT, 52 + max(0, math.ceil(math.log2(width))) + 6)


def _device(x):
    import array_api_compat

    return array_api_compat.device(x)


def _take(A, idx, xp, axis=None):
    """``xp.take(A, idx, axis=axis)`` (``axis=None``: of ``A`` flattened, in ``idx``'s shape) for non-negative indices
    ``idx`` of ``A``'s namespace: on torch tensors by torch's own kernel (``take``, ``index_select``: one op, not the
    array-API wrapper's index arithmetic for negative indices); the same values."""
    if _is_torch(A):
        return A.take(idx) if axis is None else A.index_select(axis, idx)
    if axis is None:
        return xp.reshape(xp.take(xp.reshape(A, (-1,)), xp.reshape(idx, (-1,))), tuple(idx.shape))
    return xp.take(A, idx, axis=axis)


def _take_along(A, idx, xp):
    """``xp.take_along_axis(A, idx, axis=-1)`` for non-negative indices ``idx`` of ``A``'s number of dimensions (no
    broadcasting): on torch tensors by ``torch.gather`` (one op)."""
    if _is_torch(A):
        return A.gather(-1, idx)
    return xp.take_along_axis(A, idx, axis=-1)


def _is_torch(x) -> bool:
    import array_api_compat

    return array_api_compat.is_torch_array(x)


def _c(value: float, like):
    """``value`` for an elementwise ``where`` beside ``like`` (a Python number: a kept 0-d tensor would save torch's
    ``scalar_tensor`` op a call, but array-api-compat's ``where`` then casts it with a ``Tensor.to`` call, which the
    device-copy pins of ``tests/test_profile_device_copies.py`` count)."""
    return value


#: :func:`_const`'s 0-d tensors and :func:`_arange`'s index rows by value and device: made there once per run.
_CONSTS: dict = {}


def _cached(key, make):
    """``_CONSTS[key]``, made by ``make()`` the first time (bounded: cleared when full). The tensors kept are never
    written."""
    got = _CONSTS.get(key)
    if got is None:
        if len(_CONSTS) >= 256:
            _CONSTS.clear()
        got = _CONSTS[key] = make()
    return got


def _const(value: float, like):
    """``value`` beside float64 ``like`` for :func:`_where`: on torch a 0-d float64 tensor on ``like``'s device, made
    there once per run (``torch.where`` then takes it as it is: no ``scalar_tensor`` op per call, no ``Tensor.to``);
    else the Python number."""
    if not _is_torch(like):
        return value
    import torch

    dev = like.device
    return _cached(("c", repr(value), str(dev)), lambda: torch.full((), value, dtype=torch.float64, device=dev))


def _where(cond, x, y, xp):
    """``xp.where(cond, x, y)``; on torch ``torch.where`` itself (its 0-d operands of :func:`_const` taken as they
    are: one op), the same values."""
    if _is_torch(cond):
        import torch

        return torch.where(cond, x, y)
    return xp.where(cond, x, y)


def _arange(start: int, stop: int, step: int, like, xp):
    """``xp.arange(start, stop, step)`` (int64) on ``like``'s device; on torch made there once per run (never
    written)."""
    if not _is_torch(like):
        return xp.arange(start, stop, step, dtype=xp.int64, device=_device(like))
    import torch

    dev = like.device
    return _cached(("a", start, stop, step, str(dev)),
                   lambda: torch.arange(start, stop, step, dtype=torch.int64, device=dev))


def _reshape(x, shape: tuple, xp):
    """``xp.reshape(x, shape)``, or ``x`` itself when it has that shape already (no view op)."""
    return x if tuple(x.shape) == tuple(shape) else xp.reshape(x, shape)


def _sub_div(a, b, c, xp):
    """``a - b / c`` elementwise (broadcast); on torch tensors in one op, ``torch.addcdiv(a, b, c, value=-1)``: the
    same floats (``-1 * b`` and its quotient by ``c`` are exact negations of ``b`` and ``b / c``, and ``a + (-x)`` is
    ``a - x`` in IEEE arithmetic; a quotient is never fused into an addition)."""
    if _is_torch(a) and _is_torch(b) and _is_torch(c):
        import torch

        return torch.addcdiv(a, b, c, value=-1)
    return a - b / c


def batched_maximal_coupling_acceptance(p, q, *, normalize: bool = False, validate: bool = True):
    r"""Acceptance of one draft under maximal coupling, for every row of a batch.

    .. math::

        \beta(p, q) = \sum_x \min\big(p(x), q(x)\big) = 1 - \mathrm{TV}(p, q).

    Parameters
    ----------
    p, q : (..., V) arrays (numpy, torch, any array-API library)
        Draft and target laws, one per row (float32 rows are accepted within
        their precision and renormalised in float64).
    normalize : bool, keyword-only
        Rescale each row to sum to 1 instead of requiring it.
    validate : bool, keyword-only
        ``False`` skips the checks of the rows (hot loops on known laws).

    Returns
    -------
    (...) array of float64, same library and device as ``p``

    Raises
    ------
    ValueError, TypeError
        As :func:`otspec.alpha_k` for batched input.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, §3.5 (acceptance :math:`1 - \mathrm{TV}`).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.multidraft import batched_maximal_coupling_acceptance
    >>> P = np.array([[0.5, 0.5], [0.9, 0.1]])
    >>> Q = np.array([[0.5, 0.5], [0.1, 0.9]])
    >>> batched_maximal_coupling_acceptance(P, Q).round(12).tolist()
    [1.0, 0.2]
    """
    P, Q, xp = validate_batch_pair(p, q, normalize=normalize, validate=validate)
    return xp.clip(xp.sum(xp.minimum(P, Q), axis=-1), 0.0, 1.0)


def _ratio_sorted(P, Q, xp) -> dict:
    """What :func:`_rho_star_rows` needs of ``(..., V)`` float64 laws for every ``k``: one batched sort of q/p (the
    per-row sums ``D1``, ``E1``, ``tot_p``, ``tot_q`` shaped ``(B, 1)``)."""
    shape = tuple(P.shape[:-1])
    V = int(P.shape[-1])
    B = int(np.prod(shape)) if shape else 1
    P2 = _reshape(P, (B, V), xp)
    Q2 = _reshape(Q, (B, V), xp)
    # f at rho = 1 (exact zeros when p == q); every per-row value (B, 1)
    D1 = xp.sum(xp.clip(Q2 - P2, 0.0, None), axis=-1, keepdims=True)
    E1 = xp.sum(xp.clip(P2 - Q2, 0.0, None), axis=-1, keepdims=True)
    # one batched sort of the ratios q/p (p = 0 < q: +inf, and so is a ratio past the largest double, a subnormal p;
    # p = q = 0: nan, last, weightless)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = Q2 / P2
    if _is_torch(r):  # the sorted ratios and their order in one op (argsort's own kernel), the laws by gathers
        ro, order = r.sort(dim=-1, stable=False)
    else:
        order = xp.argsort(r, axis=-1, stable=False)
        ro = _take_along(r, order, xp)
    po, qo = _take_along(P2, order, xp), _take_along(Q2, order, xp)
    del order, r
    # exclusive prefix sums (tokens before j) and suffix sums (tokens after j)
    Pcum = xp.cumulative_sum(po, axis=-1)
    Qcum = xp.cumulative_sum(qo, axis=-1)
    Ps = xp.flip(xp.cumulative_sum(xp.flip(po, axis=-1), axis=-1), axis=-1) - po
    Qs = xp.flip(xp.cumulative_sum(xp.flip(qo, axis=-1), axis=-1), axis=-1) - qo
    return dict(shape=shape, B=B, V=V, P2=P2, Q2=Q2, D1=D1, E1=E1, ro=ro, Pcum=Pcum, Qcum=Qcum, Pp=Pcum - po,
                Qp=Qcum - qo, Ps=Ps, Qs=Qs, tot_p=xp.sum(po, axis=-1, keepdims=True),
                tot_q=xp.sum(qo, axis=-1, keepdims=True))


def _sorted_take(S: dict, idx, xp) -> dict:
    """The rows ``idx`` (an int array of namespace ``xp``) of :func:`_ratio_sorted`'s output, as its output for those
    rows alone (one sort shared by laws that several ``k`` need)."""
    B = int(idx.shape[0])
    out = {key: (xp.take(v, idx, axis=0) if hasattr(v, "shape") else v) for key, v in S.items()}
    out.update(shape=(B,), B=B)
    return out


def _per_row_k(k, B: int, xp):
    """``(kf, power)`` of :func:`_rho_star_rows`' ``k``: an int (``kf`` a float, ``power(x) = x**k``), or a pair
    ``(kf, ks)`` of rows with numbers of drafts of their own (``kf`` their ``(B,)`` float64 numbers of drafts,
    namespace ``xp``; ``ks`` the distinct ints among them), ``power(x)`` then every row's ``x**k`` with its own
    Python int ``k`` (the value a call for that ``k`` alone computes, bit for bit) of a ``(B, m)`` array ``x``;
    ``kf`` shaped ``(B, 1)``."""
    if not isinstance(k, tuple):
        kf = float(k)
        return kf, (lambda x: x**k)
    kf, ks = k
    kf = _reshape(kf, (B, 1), xp)
    ks = sorted({int(c) for c in ks})
    masks = {c: kf == float(c) for c in ks[1:]}

    def power(x):
        out = x ** ks[0]
        for c in ks[1:]:
            out = _where(masks[c], x**c, out, xp)
        return out

    return kf, power


#: :func:`_second_row`'s arrays by (namespace, device): made once per run.
_ROWS2: dict = {}


def _second_row(xp, dev):
    """``[[False, True]]`` on ``dev``, made there (no copy from the host, which waits for the device's queue) once
    per namespace and device."""
    key = (getattr(xp, "__name__", str(xp)), str(dev))
    got = _ROWS2.get(key)
    if got is None:
        if len(_ROWS2) >= 16:
            _ROWS2.clear()
        got = _ROWS2[key] = xp.reshape(xp.arange(2, device=dev), (1, 2)) == 1
    return got


def _rho_star_rows(P, Q, k, xp, sorted_=None, *, tiny_beta: bool = True, beta: bool = False):
    """rho* (and E(rho*)) for every row of (..., V) float64 laws; see batched_kseq_rho_star.

    ``k``: the number of drafts, an int, or a pair ``(kf, ks)`` of one number of drafts per row (every one
    ``>= 2``; :func:`_per_row_k`): one search (:func:`_first_false`) for all of them, every row's values those of a call for its
    ``k`` alone (the same per-row arithmetic; torch's vectorised ``pow`` may round the last bit differently where a
    row lands on another lane of its kernel, as it may between batches of one ``k``). ``sorted_``:
    :func:`_ratio_sorted` of the same laws, shared by several ``k`` (computed here when None).

    The search reads the sign of :math:`f = D - E^k` as the float test :math:`D > E^k`, which places the root to
    about :math:`\\epsilon (D + k E^k) / \\beta` (the slope of :math:`f` is :math:`-\\beta`): to a few ulps unless
    :math:`\\beta(\\rho^*)` is tiny. The rows where that bound exceeds :data:`_TINY_BETA_ULPS` ulps take another
    route: on host (numpy) arrays the per-row search (:func:`_tiny_beta_rows`), on any other namespace (a device's
    tensors) the same search run again on every row in the :math:`c(\\beta) - \\rho` form
    (:func:`_root_rows` with ``cform``), its root kept on those rows by one ``where`` (no value read to the host).
    ``tiny_beta=False`` skips that second search (the float test's bound then holds on those rows of a device).
    ``beta``: :math:`\\beta(\\rho^*) = \\sum \\min(p, q/\\rho^*)` too, summed directly, as a third array (E then
    summed as :math:`\\sum (p - \\min(p, q/\\rho^*))`: the same floats, two ops more on a device for both).
    """
    if not isinstance(k, tuple) and k == 1:  # rho* = 1: one draft is speculative sampling (no sort)
        E1 = xp.sum(xp.clip(P - Q, 0.0, None), axis=-1)
        return xp.ones_like(E1), E1
    S = _ratio_sorted(P, Q, xp) if sorted_ is None else sorted_
    shape, B, P2, Q2 = S["shape"], S["B"], S["P2"], S["Q2"]
    kf, power = _per_row_k(k, B, xp)  # a float, or (B, 1) as every per-row value below
    k_hi = kf if isinstance(kf, float) else float(max(k[1]))
    rho = _root_rows(S, kf, power, k_hi, xp)  # (B, 1)
    if isinstance(rho, np.ndarray):
        rho = _tiny_beta_rows(P2, Q2, rho, k, kf)
    elif tiny_beta:
        bad = _tiny_beta_flags(P2, Q2, rho, kf, xp)
        rho = _where(bad, _root_rows(S, kf, power, k_hi, xp, cform=True), rho, xp)
    if beta:  # p - min(p, q / rho) is p - q / rho where p > q / rho and p - p = 0 elsewhere: clip(p - q / rho)'s
        with np.errstate(divide="ignore", invalid="ignore"):
            mins = xp.minimum(P2, Q2 / rho)
        E_star = xp.sum(P2 - mins, axis=-1)
        return xp.reshape(rho, shape), _reshape(E_star, shape, xp), _reshape(xp.sum(mins, axis=-1), shape, xp)
    E_star = xp.sum(xp.clip(_sub_div(P2, Q2, rho, xp), 0.0, None), axis=-1)
    return xp.reshape(rho, shape), _reshape(E_star, shape, xp)


def _accepted_mass(beta, kf, xp):
    r""":math:`1 - (1 - \beta)^k = -\mathrm{expm1}(k\, \mathrm{log1p}(-\beta))`, no cancellation where :math:`\beta`
    is small (``beta`` clipped to ``[0, 1]`` first: a sum of ``min`` terms may round just above 1)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return -xp.expm1(kf * xp.log1p(-xp.clip(beta, 0.0, 1.0)))


def _kseq_value(Ek, mass, xp):
    r"""k-Seq's acceptance from :math:`E(
ho^*)^k` and the accepted mass: :math:`1 - E^k` where :math:`E^k \le 1/2`
    (no cancellation there), below 1/2 the mass itself (:math:`\sum \min(p, q)` at ``k = 1``, :func:`_accepted_mass`
    above); clipped to ``[0, 1]``."""
    return xp.clip(xp.where(Ek > 0.5, mass, 1.0 - Ek), 0.0, 1.0)


def _lost_mass(nbeta, kf, xp):
    r""":math:`(1 - \beta)^k - 1 = \mathrm{expm1}(k\, \mathrm{log1p}(-\beta))` of ``nbeta`` :math:`= -\beta`: minus
    the accepted mass (no clip: :func:`_root_rows`' ``cform`` reads it only where :math:`\beta` is tiny; a
    :math:`\beta` rounded above 1 elsewhere gives NaN, whose comparisons are false)."""
    return xp.expm1(kf * xp.log1p(nbeta))


def _add_mul(a, b, c, xp):
    """``a + b * c`` elementwise (broadcast); on torch tensors in one op (``torch.addcmul``)."""
    if _is_torch(a) and _is_torch(b) and _is_torch(c):
        import torch

        return torch.addcmul(a, b, c)
    return a + b * c


def _root_rows(S: dict, kf, power, k_hi: float, xp, *, cform: bool = False):
    r"""rho* of every row, ``(B, 1)``, of :func:`_ratio_sorted`'s ``S``: :func:`_rho_star_rows`' search.

    Every sign of :math:`f` is read by the float test :math:`D > E^k`, or with ``cform`` by
    :math:`1 - (1 - \beta)^k > \rho \beta` (:math:`f / \beta = c(\beta) - \rho`, SpecTr eq. 6, the left side by
    ``log1p``/``expm1`` and the right one as :math:`Q_l + \rho P_h`, the sum of the target's mass below and
    :math:`\rho` times the draft's above: each monotone in :math:`\rho` on the floats, so the test is still true,
    then false, along them): its error is about :math:`4 \epsilon \rho \beta` on :math:`f` where the float test's is
    :math:`\epsilon (D + k E^k)`, which is what places the root when :math:`\beta` is tiny (both sides of the float
    test then near 1). The bracket, the split and the rounds on the floats' bits are the same in both forms."""
    P2, Q2, ro = S["P2"], S["Q2"], S["ro"]
    kc = _const(kf, ro) if isinstance(kf, float) else kf
    if cform:
        beta1 = xp.sum(xp.minimum(P2, Q2), axis=-1, keepdims=True)
        f1_le = _accepted_mass(beta1, kf, xp) <= beta1
        with np.errstate(over="ignore"):
            betak = xp.sum(xp.minimum(P2, Q2 / kf), axis=-1, keepdims=True)
        fk_gt = _accepted_mass(betak, kf, xp) > kf * betak
    else:
        # f at rho = 1 and rho = k, term by term (exact zeros when p == q), by their signs alone: f = D - E^k <= 0
        # exactly when D <= E^k (a difference of finite floats has the sign of their order), one op fewer each
        f1_le = S["D1"] <= power(S["E1"])  # f(1) <= 0
        Dk = xp.sum(xp.clip(S["Q2"] - kf * P2, 0.0, None), axis=-1, keepdims=True)
        Ek = xp.sum(xp.clip(_sub_div(P2, Q2, kf, xp), 0.0, None), axis=-1, keepdims=True)
        fk_gt = Dk > power(Ek)  # f(k) > 0
    # f at every breakpoint rho = ro_j inside (1, k): tokens before j are below, after j above (at the others,
    # ratios <= 1 or >= k, the values are not read: no finite stand-in for rho there)
    above1 = ro > 1.0  # not at NaN ratios (p = q = 0, sorted last), which no test below takes for inside or below hi
    inside = above1 & (ro < kf)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # 0, inf and NaN ratios: not read
        if cform:  # beta at ro_j: the target's mass up to j (token j's min(p, q / ro_j) is q_j / ro_j) over ro_j
            nPs = -S["Ps"]  # minus beta (-Ps - Qcum / ro, one op on torch) and minus rho beta: f <= 0 exactly
            neg_in = _lost_mass(_sub_div(nPs, S["Qcum"], ro, xp), kf, xp) >= _add_mul(-S["Qcum"], ro, nPs, xp)
        else:
            E = xp.clip(_sub_div(S["Pp"], S["Qp"], ro, xp), 0.0, None)
            D = S["Qs"] - ro * S["Ps"]  # unclipped: a negative D is <= E^k >= 0 as its clipped 0 is
            neg_in = D <= power(E)
    # f is non-increasing (SpecTr Lemma 4): the first breakpoint with f <= 0 is the upper end; outside (1, k) f is
    # taken as +inf at ratios <= 1 and -inf above, so f <= 0 there exactly where above1
    neg = _where(inside, neg_in, above1, xp)
    # hi: the first such breakpoint if below k, else k. The ratios increase along the row (NaN last, never in neg),
    # so that is the least of the ratios where neg and k (a minimum of exact floats: the same float). k is among
    # them on every row of valid laws: some ratio is <= 1 (q <= p somewhere), and there neg is false.
    hi = xp.min(_where(neg, ro, kc, xp), axis=-1, keepdims=True)
    # lower end: the largest breakpoint below hi that exceeds 1 (else 1): the largest of the ratios below hi and 1
    # (1 among them wherever a ratio is >= hi or NaN; on a row of ratios all below hi and below 1, q < p at every
    # token, D(1) = 0 <= E(1)^k and rho* = 1 whatever lo)
    below = ro < hi
    lo = xp.max(_where(below, ro, _const(1.0, ro), xp), axis=-1, keepdims=True)
    # the split on (lo, hi): ratios <= lo below, >= hi above (no ratio lies in (lo, hi): those <= lo are those < hi)
    nb = _count_true(below)  # Pl, Ql: the sums of the nb first (0 where none), from the cumulative sums after a 0
    zeros = _zeros_column(S["B"], ro, xp)
    Ql = _take_along(xp.concat([zeros, S["Qcum"]], axis=-1), nb, xp)
    if cform:  # the draft's mass above as the suffix sum (tot_p - Pl cancels where it is tiny against 1)
        Ph = _take_along(xp.concat([S["tot_p"], S["Ps"]], axis=-1), nb, xp)

        nPh, nQl = -Ph, -Ql

        def up(rho):  # f > 0: minus the accepted mass below minus rho beta (-Ql - rho Ph)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return _lost_mass(_sub_div(nPh, Ql, rho, xp), kf, xp) < _add_mul(nQl, rho, nPh, xp)

        Pl = Qh = None
    else:
        Pl = _take_along(xp.concat([zeros, S["Pcum"]], axis=-1), nb, xp)
        Ph = xp.clip(S["tot_p"] - Pl, 0.0, None)
        Qh = xp.clip(S["tot_q"] - Ql, 0.0, None)
        up = None
    if _has_bits(lo) and not _BISECT_ONLY:
        b = _first_false(lo, hi, Pl, Ql, Ph, Qh, power, k_hi, xp, up)
    else:
        b = _bisect(lo, hi, Pl, Ql, Ph, Qh, power, k_hi, xp, up)
    ends = xp.concat([lo, hi], axis=-1)
    if cform:  # f(lo) <= 0 and f(hi) >= 0 in the same form
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            left, right = _lost_mass(_sub_div(nPh, Ql, ends, xp), kf, xp), _add_mul(nQl, ends, nPh, xp)
        at_lo, at_hi = (left >= right)[:, :1], (left <= right)[:, 1:]
    else:
        # f(lo) <= 0 and f(hi) >= 0, both ends at once: f = D - E^k <= 0 exactly when D <= E^k (a difference of
        # floats has the sign of their order), D = (Qh - rho Ph)_+, E = (Pl - Ql / rho)_+
        D = xp.clip(Qh - ends * Ph, 0.0, None)
        Ek = power(xp.clip(_sub_div(Pl, Ql, ends, xp), 0.0, None))
        at_lo, at_hi = (D <= Ek)[:, :1], (D >= Ek)[:, 1:]
    root = _where(at_lo, lo, _where(at_hi, hi, b, xp), xp)
    return _where(f1_le, _const(1.0, ro), _where(fk_gt, kc, root, xp), xp)  # (B, 1)


def _tiny_beta_flags(P2, Q2, rho, kf, xp):
    r"""The rows (``(B, 1)`` bool) where the float test's bound on the root at ``rho``,
    :math:`\epsilon (D + k E^k) / \beta`, exceeds :data:`_TINY_BETA_ULPS` ulps of :math:`\rho`: :func:`_tiny_beta_rows`'
    test in the same operations, in ``P2``'s namespace (no read)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        qr = Q2 / rho
        beta = xp.sum(xp.minimum(P2, qr), axis=-1, keepdims=True)
        D = xp.sum(xp.clip(Q2 - rho * P2, 0.0, None), axis=-1, keepdims=True)
        E = xp.sum(xp.clip(P2 - qr, 0.0, None), axis=-1, keepdims=True)
        return ~(D + kf * E**kf <= _TINY_BETA_ULPS * rho * beta)


#: :func:`_tiny_beta_rows`: a row whose root the float test :math:`D > E^k` places only to about
#: :math:`\epsilon (D + k E^k) / \beta` (the slope of :math:`f` is :math:`-\beta`), more than this many ulps of
#: :math:`\rho`, takes the per-row search.
_TINY_BETA_ULPS = 256.0


def _tiny_beta_rows(P2, Q2, rho, k, kf):
    r"""``rho`` (``(B, 1)`` numpy) with the rows where :math:`\beta(\rho) = \sum \min(p, q/\rho)` is tiny against
    :math:`D + k E^k` replaced by :func:`otspec.multidraft._kseq._rho_star_exact`'s root (which takes
    :math:`f / \beta = c(\beta) - \rho` there, accurate to a few ulps of :math:`\rho^*`): at such a row
    :math:`D` and :math:`E^k` are both near 1 and their difference, the sign the search reads, has lost the bits
    that place the root (on torch, before it took :func:`_root_rows`' ``cform`` there: :math:`\rho^*`
    1.9999999248174 for :math:`1 + \sqrt{1 - 1.5 \cdot 10^{-7}} = 1.99999992499999719` at ``p = [0.5, 0, 0.5]``,
    ``q = [0, 1 - 1.5e-7, 1.5e-7]``, ``k = 2``). Elsewhere (every row of laws that overlap by more than about
    :math:`(k + 1) / 256`) the values are unchanged, bit for bit. Host arrays only; a device's flagged rows take
    :func:`_root_rows`' second search in the :math:`c(\beta) - \rho` form instead (no read to the host)."""
    bad = _tiny_beta_flags(P2, Q2, rho, kf, namespace(P2))
    rows = np.flatnonzero(bad[:, 0])
    if rows.size == 0:
        return rho
    rho = rho.copy()
    for i in rows.tolist():  # k: one int, or (kf, ks) with kf every row's number of drafts, (B, 1)
        rho[i, 0] = _rho_star_exact(P2[i], Q2[i], int(kf[i, 0]) if isinstance(k, tuple) else k)
    return rho


def _zeros_column(B: int, like, xp):
    """``(B, 1)`` float64 zeros on ``like``'s device; on torch made there once per run and ``B`` (never written)."""
    if not _is_torch(like):
        return xp.zeros((B, 1), dtype=xp.float64, device=_device(like))
    import torch

    dev = like.device
    return _cached(("z", B, str(dev)), lambda: torch.zeros((B, 1), dtype=torch.float64, device=dev))


def _any_first(neg, xp):
    """Whether each row of a bool ``(B, n)`` array has a true entry, and the first one's column (0 where none):
    ``(B, 1)`` each; on torch one op (``torch.max`` over the row: the first maximal entry's index)."""
    if _is_torch(neg):
        import torch

        return torch.max(neg, -1, keepdim=True)
    return xp.any(neg, axis=-1, keepdims=True), xp.argmax(xp.astype(neg, xp.float64), axis=-1, keepdims=True)


def _go_up(rho, Pl, Ql, Ph, Qh, power, xp):
    r"""The bisection's test of :func:`_rho_star_rows` at ``rho`` (every row's split ``Pl, Ql, Ph, Qh`` broadcast against
    it): :math:`f(\rho) > 0`, i.e. :math:`D > E^k` (a difference of floats is positive exactly when the first is
    larger; an unclipped negative ``D`` is no larger than :math:`E^k \ge 0`, as its clipped 0 is not)."""
    return Qh - rho * Ph > power(xp.clip(_sub_div(Pl, Ql, rho, xp), 0.0, None))


def _bisect(lo, hi, Pl, Ql, Ph, Qh, power, k_hi: float, xp, up=None):
    """The upper end ``b`` of the bisection of :func:`_go_up` on ``[lo, hi]`` after
    :func:`_bisect_steps` steps (the state of :data:`_BISECT`): the reference of :func:`_first_false`, and its route
    for namespaces with no bit view of float64 arrays.

    ``[a, b]`` is held as one ``(B, 2)`` array: ``mid = 0.5 * (a + b)`` is their mean (the sum rounded once, halved
    exactly), and one ``where`` moves ``a`` (column 0) up to ``mid`` where the test holds, ``b`` (column 1) down to
    it elsewhere. Every argument ``(B, 1)``, as ``b``. ``up``: another test, a function of ``rho`` alone (then
    ``Pl, Ql, Ph, Qh, power`` are not read)."""
    ab = xp.concat([lo, hi], axis=-1)
    other = _second_row(xp, _device(ab))  # column 1 moves where column 0 does not
    for _ in range(_bisect_steps(k_hi)):
        mid = xp.mean(ab, axis=-1, keepdims=True)
        g = _go_up(mid, Pl, Ql, Ph, Qh, power, xp) if up is None else up(mid)
        ab = xp.where(g ^ other, mid, ab)
    return ab[:, 1:]


#: Tests only: ``True`` makes :func:`_rho_star_rows` bisect (:func:`_bisect`) on every namespace.
_BISECT_ONLY = False


def _has_bits(x) -> bool:
    """Whether :func:`_float_bits` views ``x``'s namespace (numpy and torch)."""
    return isinstance(x, np.ndarray) or _is_torch(x)


def _float_bits(x, xp):
    """The bits of float64 ``x`` as int64 (a view, no copy; for positive floats their order is the ints' order)."""
    return x.view(xp.int64)


def _grid_points(xp, like=None) -> int:
    """Candidates per row and round of :func:`_first_false`: more on an accelerator (where an op costs its launch,
    whatever its size: 4 rounds of 16,383 for ``k <= 4``) than on a CPU (where it costs its elements: 6 rounds of
    511 on torch, 9 of 63 on numpy). Any number gives the same values."""
    if xp.__name__.endswith("numpy"):
        return 63
    dev = getattr(like, "device", None)
    return 511 if dev is None or getattr(dev, "type", "cpu") == "cpu" else 16383


def _grid_rounds(k_hi: float, M: int) -> list[int]:
    """The spacing, in floats, of :func:`_first_false`'s candidates at each round on ``[lo, hi]``,
    ``1 <= lo <= hi <= k_hi``: ``s = ceil(w / (M + 1))`` of the widest interval ``w`` (in floats) then left, until
    ``w = 1``."""
    w = int(np.float64(k_hi).view(np.int64)) - int(np.float64(1.0).view(np.int64))
    out = []
    while w > 1:
        w = -(-w // (M + 1))
        out.append(w)
    return out


def _first_false(lo, hi, Pl, Ql, Ph, Qh, power, k_hi: float, xp, up=None):
    r""":func:`_bisect`'s ``b``, bit for bit, in a few rounds of many candidates instead of one per step.

    On a row where the test :math:`g` (:func:`_go_up`) holds at ``lo`` and not at ``hi`` (the only rows whose ``b``
    :func:`_rho_star_rows` keeps), the bisection ends with ``[a, b]`` two adjacent floats with :math:`g(a)` true and
    :math:`g(b)` false (it keeps :math:`g` true at ``a`` and false at ``b``, and ends adjacent:
    :func:`_bisect_steps`). :math:`g(
ho)` is :math:`D(
ho) > E(
ho)^k` in floats, :math:`D = Q_h - 
ho P_h`
    non-increasing and :math:`E = (P_l - Q_l/
ho)_+` non-decreasing in :math:`
ho` (each rounded operation is
    monotone), and :math:`x \mapsto x^k` non-decreasing on floats (a product for ``k <= 3``; for larger ``k`` a
    power within one ulp, while adjacent floats' ``k``-th powers lie at least ``k - 1`` ulps apart): so :math:`g` is
    true, then false, along the floats of ``[lo, hi]``, and ``b`` is the first float there where it is false,
    whatever route finds it.

    Here the floats of ``[lo, hi]`` are their int64 bit patterns (for positive floats, in the same order), and each
    round tests :math:`M` candidates per row, ``a + s, a + 2s, ..., a + Ms`` (``s`` of :func:`_grid_rounds`), at
    once: ``a`` moves to the last candidate before the first one false, ``b`` to the candidate after it (or stays),
    so ``b - a <= s`` after the round, and after the last round ``b - a = 1``. The test is the bisection's, value
    for value (the same operations on each row's floats; torch's vectorised ``pow`` on the CPU, for ``k > 3``, may
    round a value's last bit otherwise by its place in the array, as it does between batches).

    Two consequences keep the ops per round few. The candidates increase along a row and :math:`g` is true then
    false there, so the first false column is the number of true ones (one sum, no search for it). And ``b`` need
    not be carried: on a kept row it is a float where :math:`g` is false, ``a`` one where it is true, so
    ``b - a >= 1``, and ``b - a <= 1`` after the last round: ``b = a + 1``; it is returned as
    ``min(a + 1, hi)``, within ``[lo, hi]`` on every row (the rows not kept, where :math:`g` is false at ``lo`` or
    true at ``hi``, are :func:`_rho_star_rows`' ``lo`` or ``hi`` instead).

    ``up``: another test of the same kind (true, then false, along the floats), a function of ``rho`` alone, as
    :func:`_bisect`'s (:func:`_root_rows`' :math:`c(\beta) - \rho` form).
    """
    M = _grid_points(xp, lo)
    a = _float_bits(lo, xp)
    if _is_torch(a):  # the same rounds in fewer ops: the candidates written into one buffer seen as floats
        import torch

        cand = floats = None
        for s in _grid_rounds(k_hi, M):
            if cand is None:  # the buffer made by the first round's sum
                cand = torch.add(a, _arange(s, s * (M + 1), s, a, xp))
                floats = cand.view(torch.float64)
            else:
                torch.add(a, _arange(s, s * (M + 1), s, a, xp), out=cand)  # (B, M): a + s .. a + M s
            g = _go_up(floats, Pl, Ql, Ph, Qh, power, xp) if up is None else up(floats)
            a = torch.add(a, g.sum(-1, keepdim=True), alpha=s)  # the first false column, as below
        # a + 1 on the floats' bits is the next float up (a is positive and finite)
        return torch.minimum(torch.nextafter(a.view(torch.float64), _const(math.inf, hi)), hi)
    for s in _grid_rounds(k_hi, M):
        c = a + _arange(s, s * (M + 1), s, a, xp)  # (B, M): a + s .. a + M s
        g = _go_up(c.view(xp.float64), Pl, Ql, Ph, Qh, power, xp) if up is None else up(c.view(xp.float64))
        a = a + _count_true(g) * s  # the first false column (M: none), g being true then false along the row
    return xp.minimum(a + 1, _float_bits(hi, xp)).view(xp.float64)


def _count_true(g):
    """The number of true entries of each row of a bool ``(B, M)`` array, ``(B, 1)`` int64 (one op on torch)."""
    if _is_torch(g):
        return g.sum(-1, keepdim=True)
    return np.sum(g, axis=-1, keepdims=True, dtype=np.int64)


def batched_kseq_rho_star(p, q, k: int, *, normalize: bool = False, validate: bool = True):
    r"""SpecTr's k-Seq threshold :math:`\rho^*` for every row of a batch.

    .. math::

        \rho^* = \min\{\rho \ge 1 : 1 - (1 - \beta(\rho))^k \le \rho\, \beta(\rho)\},
        \qquad \beta(\rho) = \sum_x \min\big(p(x), q(x)/\rho\big).

    One batched sort of the ratios :math:`q/p`; :math:`f(\rho) = D - E^k`
    (:math:`D = \sum (q - \rho p)_+`, :math:`E = \sum (p - q/\rho)_+`,
    non-increasing, SpecTr Lemma 4) at every breakpoint inside
    :math:`(1, k)` by prefix and suffix sums; the first breakpoint with
    :math:`f \le 0` brackets the root, where the split into low and high
    tokens is fixed, and the root is closed to the float spacing on all rows at
    once: the end of an 80-step bisection, bit for bit, found by a few rounds of
    many candidates on the floats' bits (6 rounds of 511 per row on torch
    for ``k <= 4``, 9 of 63 on numpy).

    Accuracy: the search reads the sign of :math:`f` as :math:`D > E^k`,
    placing the root to about :math:`\epsilon (D + k E^k) / \beta` (to a
    few ulps wherever the laws overlap by more than about :math:`(k+1)/256`).
    The rows where that bound exceeds 256 ulps of :math:`\rho` (a tiny
    :math:`\beta(\rho^*)`: both sides of the test near 1) take the per-row
    search on numpy arrays and, on other arrays (a device's tensors), a
    second search of every row in the :math:`c(\beta) - \rho` form
    (:math:`c(\beta) = (1 - (1 - \beta)^k) / \beta` by ``log1p``/``expm1``)
    kept on those rows by one ``where``: no value is read to the host, and
    such a call issues about twice the torch ops (279 for 141 at ``k = 2``).
    Both are within a few ulps of the exact root; the other rows' values are
    the float search's, bit for bit.

    Parameters
    ----------
    p, q : (..., V) arrays (numpy, torch, any array-API library)
        Draft and target laws, one per row.
    k : int
        Number of drafts.
    normalize, validate : bool, keyword-only
        As :func:`batched_maximal_coupling_acceptance`.

    Returns
    -------
    (...) array of float64, same library and device as ``p``

    Raises
    ------
    ValueError, TypeError
        As :func:`otspec.alpha_k` for batched input.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative
       Decoding via Optimal Transport", NeurIPS 2023, Algorithm 2, Lemma 4.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.multidraft import batched_kseq_rho_star
    >>> P = np.array([[0.75, 0.25], [0.5, 0.5]])
    >>> Q = np.array([[0.25, 0.75], [0.5, 0.5]])
    >>> batched_kseq_rho_star(P, Q, 2).round(9).tolist()
    [1.593070331, 1.0]
    >>> batched_kseq_rho_star(np.array([[0.5, 0.0, 0.5]]), np.array([[0.0, 1 - 1.5e-7, 1.5e-7]]), 2).tolist()
    [1.9999999249999971]
    """
    P, Q, xp, k = _kseq_batch(p, q, k, "batched_kseq_rho_star", normalize, validate)
    return _rho_star_rows(P, Q, k, xp)[0]


def batched_kseq_acceptance(p, q, k: int, *, normalize: bool = False, validate: bool = True):
    r"""k-Seq's acceptance at :math:`\rho^*` for every row of a batch.

    .. math::

        p_{\rm acc}(\rho^*) = 1 - \big(1 - \beta(\rho^*)\big)^k = 1 - E(\rho^*)^k,
        \qquad E(\rho) = \sum_x \big(p(x) - q(x)/\rho\big)_+ .

    At :math:`\rho^*` this is :math:`P(Y \in S(X))` of the verifier built by
    :func:`otspec.kseq` (see its docs). Where it is at least 1/2 it is
    ``1 - E**k`` (:math:`E` a sum of non-negative terms); below 1/2 it is
    the accepted mass :math:`-\mathrm{expm1}(k\, \mathrm{log1p}(-\beta(\rho^*)))`
    with :math:`\beta(\rho^*) = \sum \min(p, q/\rho^*)` summed directly,
    without the cancellation of ``1 - E**k`` (which gave 0 for an
    acceptance of 1e-300). :math:`\rho^*` as :func:`batched_kseq_rho_star`
    (tiny :math:`\beta` included).

    Parameters
    ----------
    p, q : (..., V) array_like of float (numpy or torch)
        Draft and target laws, one per row.
    k : int
        Number of drafts (a single integer).
    normalize : bool, keyword-only
        Rescale each row to sum to 1.
    validate : bool, keyword-only
        Check the rows (False skips it in hot loops).

    Returns
    -------
    (...) array of float64
        Of the input's array type and device.

    Raises
    ------
    TypeError
        ``k`` not a single integer, or inputs of an unsupported type.
    ValueError
        Invalid rows or mismatched shapes.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, Algorithm 2 and Lemma 4.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.multidraft import batched_kseq_acceptance
    >>> P = np.array([[0.75, 0.25], [0.5, 0.5]])
    >>> Q = np.array([[0.25, 0.75], [0.5, 0.5]])
    >>> batched_kseq_acceptance(P, Q, 2).round(9).tolist()
    [0.648267583, 1.0]
    >>> float(batched_kseq_acceptance(np.array([[0.5, 0.0, 0.5]]), np.array([[0.0, 1.0, 5e-300]]), 2)[0])
    5e-300
    """
    P, Q, xp, k = _kseq_batch(p, q, k, "batched_kseq_acceptance", normalize, validate)
    return kseq_acceptance_rows(P, Q, [k], xp)[0]


def kseq_acceptance_rows(P, Q, ks, xp) -> list:
    r"""k-Seq's acceptance :math:`1 - E(\rho^*)^k` of every row of ``(..., V)`` float64 laws, for each ``k`` in ``ks``.

    The laws are not checked (see :func:`batched_kseq_acceptance`); one sort of
    the ratios serves every ``k``, and each value is the one
    :func:`batched_kseq_acceptance` gives for that ``k`` alone, bit for bit.
    Where the acceptance is at least 1/2 it is ``1 - E**k`` (:math:`E` a sum of
    non-negative terms: accurate near 1); below 1/2 it is the accepted mass
    :math:`1 - (1 - \beta)^k` from :math:`\beta(\rho^*) = \sum \min(p, q/\rho^*)`
    summed directly, by ``log1p``/``expm1`` (as :func:`otspec.kseq_p_acc`),
    where ``1 - E**k`` cancels (an acceptance of 5e-300 came out 0).
    Returns a list of ``(...)`` arrays of namespace ``xp``, one per ``k``.
    """
    S = None
    out = []
    for k in ks:
        if k == 1:  # rho* = 1 (_rho_star_rows' E alone; E**1 is E): below 1/2, sum min(p, q) itself
            E = xp.sum(xp.clip(P - Q, 0.0, None), axis=-1)
            kept = xp.sum(xp.minimum(P, Q), axis=-1)
            out.append(_kseq_value(E, kept, xp))
            continue
        if S is None:
            S = _ratio_sorted(P, Q, xp)
        rho, E, beta = _rho_star_rows(P, Q, k, xp, S, beta=True)  # beta(rho*) summed directly, with E
        Ek = E**k
        out.append(_kseq_value(Ek, _accepted_mass(beta, float(k), xp), xp))
    return out


def _kseq_batch(p, q, k, fn: str, normalize: bool, validate: bool):
    """Validated ``(P, Q, xp, k)`` for the batched k-Seq functions (one integer ``k``)."""
    ks, scalar = parse_ks(k)
    if not scalar:
        raise TypeError(f"`k` must be a single integer for `{fn}`")
    P, Q, xp = validate_batch_pair(p, q, normalize=normalize, validate=validate)
    return P, Q, xp, ks[0]
