r"""Exact optimal acceptance :math:`\alpha_k(p, q)` of OTM-k, in closed form after one sort.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._array import int_power, is_batched_input, parse_ks, take_along_last, validate_batch_pair
from .._registry import unknown_name_message
from .._validation import validate_bool, validate_pair
from . import _alpha_kernel as _kernel
from ._cut import MinCut, ratio_order
from ._lp import otm_lp, otm_lp_tuples
from ._without_replacement import alpha_k_without_replacement

__all__ = ["alpha_k", "min_cut", "MinCut", "ratio_order", "int_power"]

_METHODS = ("exact", "lp", "lp-tuples")
#: Beyond this ``k``, ``x**k`` underflows to 0 for every ``x <= 1/2`` in float64.
_UNDERFLOW_K = 1100


def _prefix_sums(p: np.ndarray, q: np.ndarray, order: np.ndarray):
    """Prefix sums P, Q (length n + 1) in ``order`` and the suffix masses S = 1 - P of ``p``.

    The suffix masses are summed from the end, so they keep full relative
    accuracy when small: :math:`P^k = (1 - S)^k` is then evaluated as
    ``exp(k * log1p(-S))``, which stays exact when ``P`` is within rounding
    of 1 and ``k`` is large (a plain ``P**k`` would amplify ``1 - P``'s
    rounding error ``k``-fold).
    """
    n = p.shape[0]
    po = p[order]
    P = np.empty(n + 1)
    Q = np.empty(n + 1)
    S = np.empty(n + 1)
    P[0] = Q[0] = 0.0
    np.cumsum(po, out=P[1:])
    np.cumsum(q[order], out=Q[1:])
    S[n] = 0.0
    S[:n] = np.cumsum(po[::-1])[::-1]
    # the full prefix is the whole simplex; pin it to remove accumulated rounding
    P[n] = Q[n] = 1.0
    S[0] = 1.0
    np.minimum(P, 1.0, out=P)
    np.minimum(Q, 1.0, out=Q)
    np.minimum(S, 1.0, out=S)
    return P, Q, S


def _cut_values(P: np.ndarray, Q: np.ndarray, S: np.ndarray, split: int, log_s: np.ndarray, k: int) -> np.ndarray:
    """``1 + Q_j - P_j**k`` for every prefix j, accurate where P is near 1."""
    vals = np.empty(P.shape[0])
    # P <= 1/2 there, so P**k underflows to 0 once k > 1100 (any k is a valid question)
    low = (int_power(P[:split], k) if k <= _UNDERFLOW_K else np.zeros(split)) if split else np.empty(0)
    np.subtract(Q[:split], low, out=low)
    vals[:split] = low
    vals[:split] += 1.0
    # 1 - P**k = -expm1(k * log1p(-S)) for the prefixes holding more than half the mass
    hi = np.multiply(log_s, float(k))
    np.expm1(hi, out=hi)
    np.subtract(Q[split:], hi, out=vals[split:])
    return vals


def _exact(p: np.ndarray, q: np.ndarray, ks):
    """``(values, argmins, order, P, Q)`` of the closed form on one row: the fused kernels with numba, else numpy."""
    if _kernel.JIT:
        return _exact_fused(p, q, ks)
    return _exact_numpy(p, q, ks)


def _exact_fused(p: np.ndarray, q: np.ndarray, ks):
    """:func:`_exact_numpy`'s operations in :mod:`._alpha_kernel`'s fused passes, after a sort of ``int64`` keys.

    The order is the stable one (ties by index) where :func:`_exact_numpy` takes numpy's unstable argsort: the
    two agree bit for bit but for the order of the additions inside a tie group of ratios.
    """
    n = p.shape[0]
    bits = _kernel.index_bits(n)
    keys = _kernel.ratio_keys(p, q, bits)
    keys.sort()  # distinct keys: the unstable sort gives the one order
    order = np.empty(n, dtype=np.int64)
    P = np.empty(n + 1)
    Q = np.empty(n + 1)
    S = np.empty(n + 1)
    split = _kernel.prefix_from_keys(p, q, keys, bits, order, P, Q, S)
    log_s = np.log1p(-S[split:])  # numpy's log1p and expm1, as in _cut_values (their bits are numpy's per machine)
    out = np.empty(len(ks))
    argmins = np.empty(len(ks), dtype=np.int64)
    for i, k in enumerate(ks):
        hi = np.multiply(log_s, float(k))
        np.expm1(hi, out=hi)
        out[i], argmins[i] = _kernel.cut_min(P, Q, split, min(k, _UNDERFLOW_K + 1), hi)
    return out, argmins, order, P, Q


def _exact_numpy(p: np.ndarray, q: np.ndarray, ks):
    # any order of tied ratios gives the same minimum (the objective is concave
    # in the mass of a tie group), so the faster unstable sort is enough here
    order = ratio_order(p, q, stable=False)
    P, Q, S = _prefix_sums(p, q, order)
    split = int(np.searchsorted(P, 0.5, side="right"))
    log_s = np.log1p(-S[split:])
    out = np.empty(len(ks))
    argmins = np.empty(len(ks), dtype=np.int64)
    for i, k in enumerate(ks):
        vals = _cut_values(P, Q, S, split, log_s, k)
        j = int(np.argmin(vals))
        argmins[i] = j
        out[i] = min(1.0, max(0.0, vals[j]))
    return out, argmins, order, P, Q


def min_cut(p, q, k: int, *, normalize: bool = False) -> MinCut:
    r"""The minimum cut of the OTM-k flow network, found by one sort.

    .. math::

        \alpha_k(p, q) = \min_{\Omega_0 \subseteq \Omega}
            \big[\, 1 + q(\Omega_0) - p(\Omega_0)^k \,\big],

    and a minimiser is a prefix of the tokens sorted by :math:`q(x)/p(x)`
    ascending (tokens with :math:`p(x) = 0` last).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of i.i.d. drafts.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    MinCut
        The value and the minimising set.

    Raises
    ------
    ValueError, TypeError
        On invalid distributions or ``k``.

    Examples
    --------
    >>> import otspec
    >>> cut = otspec.min_cut([0.5, 0.5], [0.9, 0.1], 2)
    >>> cut.omega0.tolist(), round(cut.alpha, 12)
    ([1], 0.85)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    ks, scalar = parse_ks(k)
    if not scalar:
        raise TypeError(f"`k` must be a single integer for `min_cut`, got a sequence of {len(ks)}")
    vals, argmins, order, P, Q = _exact(p_, q_, ks)
    j = int(argmins[0])
    omega0 = np.sort(order[:j])
    return MinCut(
        alpha=float(vals[0]),
        omega0=omega0,
        order=order,
        size=j,
        p_mass=float(P[j]),
        q_mass=float(Q[j]),
        k=int(ks[0]),
    )


def alpha_k(p, q, k, *, method: str = "exact", normalize: bool = False, validate: bool = True,
            replacement: bool = True, workers: int | None = None):
    r"""Optimal acceptance probability of ``k`` i.i.d. drafts (OTM-k).

    .. math::

        \alpha_k(p, q) = \max_{\pi \in \Pi(p^{\otimes k}, q)}
            P_{(X, Y) \sim \pi}\big(Y \in S(X)\big)
          = \min_{\Omega_0 \subseteq \Omega}
            \big[\, 1 + q(\Omega_0) - p(\Omega_0)^k \,\big],

    where :math:`S(x)` is the set of distinct tokens of the draft tuple
    :math:`x \in \Omega^k`. The minimum is attained at a prefix of the
    tokens sorted by :math:`q/p` ascending, so ``method="exact"`` costs one
    sort for every ``k`` at once.

    Parameters
    ----------
    p : (n,) array_like of float, or (..., n) array (numpy, torch, any array-API library)
        Draft distribution (small model); a batch of them along the leading axes.
    q : same shape as ``p``
        Target distribution (large model).
    k : int or sequence of int
        Number of drafts (any positive integer: a huge ``k`` gives the limit
        :math:`q(\operatorname{supp} p)`); a sequence returns one value per entry.
    method : {"exact", "lp", "lp-tuples"}, keyword-only
        ``"exact"``: the sort-based closed form, :math:`O(n \log n)`.
        ``"lp"``: the membership-cost LP reduced by symmetry to
        distinct-token sets, solved with HiGHS (see :func:`otm_lp`).
        ``"lp-tuples"``: SpecTr's LP (eq. 4) as written, :math:`n^{k+1}`
        variables, built with cvxpy (tiny inputs only).
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of requiring it.
    replacement : bool, keyword-only
        ``False``: the ``k`` drafts are distinct, drawn without replacement
        (:func:`otspec.otm.alpha_k_without_replacement`; ``method`` ``"lp"``
        and ``"lp-tuples"`` both give its LP over ordered distinct tuples).
    validate : bool, keyword-only
        ``False`` skips the checks of ``p`` and ``q`` (the escape for hot
        loops over inputs already known to be float64 distributions of equal
        length; invalid input then gives an undefined result). ``k`` and
        ``method`` are always checked, and the LP methods always validate.
    workers : int or None, keyword-only
        Threads for a batch in host memory (numpy, torch on the CPU): its
        rows are independent closed forms, and numpy's sort and the compiled
        kernels release the GIL. ``None`` (default): every available core once the batch
        has at least 2 rows and ``2**16`` entries in all; ``-1``:
        every core; ``1``: serial. The values are the same bit for bit
        whatever ``workers``. Ignored for a single distribution and for
        device (CUDA) arrays.

    Returns
    -------
    float or (len(k),) ndarray of float64, or an array of shape (...) or (..., len(k))
        :math:`\alpha_k(p, q)`. A 1-D numpy array or list gives a float (or
        a 1-D ndarray for a sequence ``k``). A batch ``(..., n)`` (``ndim >=
        2``) or any non-numpy array (a torch tensor, on CPU or CUDA) gives
        an array of the same library on the same device, in float64, of
        shape ``(...)`` (``(..., len(k))`` for a sequence ``k``): the
        per-row values, computed by one batched sort through the array API
        standard (array-api-compat). The exact method's absolute error is at most
        about :math:`4 n \varepsilon` (prefix sums in float64); the LP
        methods are accurate to the solver's feasibility tolerance (1e-9)
        and take 1-D numpy inputs only.

    Raises
    ------
    ValueError
        If ``p``/``q`` are not distributions of the same length, ``k < 1``,
        ``method`` is unknown, or an LP would be too large.
    TypeError
        If ``k`` is not an integer (or sequence of integers).
    otspec.SolverError
        If an LP method fails or its solution fails the feasibility re-check.

    See Also
    --------
    min_cut : the minimising set.
    otm_lp : the LP with its optimal plan as a verifier.

    Notes
    -----
    Proof sketch (docs, "Theory"): the acceptance-only LP is a bipartite
    max-flow from distinct-token sets ``A`` (capacity :math:`P(S(X) = A)`)
    to tokens (capacity :math:`q(y)`); a cut with tokens :math:`\Omega_0`
    on the source side costs :math:`1 - p(\Omega_0)^k + q(\Omega_0)`.
    This also shows that SpecTr's Lemma 3 upper bound is tight.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative
       Decoding via Optimal Transport", NeurIPS 2023, eq. (4), Lemma 3 eq. (9).

    Examples
    --------
    >>> import otspec
    >>> p, q = [0.75, 0.25], [0.25, 0.75]
    >>> round(float(otspec.alpha_k(p, q, 1)), 12)
    0.5
    >>> otspec.alpha_k(p, q, [1, 2, 3]).round(6).tolist()
    [0.5, 0.6875, 0.828125]

    A batch of positions (rows), here as a numpy array; a torch tensor in
    gives a torch tensor out, on its device:

    >>> import numpy as np
    >>> P = np.array([[0.75, 0.25], [0.5, 0.5]])
    >>> Q = np.array([[0.25, 0.75], [0.5, 0.5]])
    >>> otspec.alpha_k(P, Q, 2).round(6).tolist()
    [0.6875, 1.0]
    >>> otspec.alpha_k(P, Q, [1, 2]).shape
    (2, 2)
    """
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(unknown_name_message("method", method, _METHODS))
    normalize = validate_bool(normalize, "normalize")  # no truthiness: validate=0 skipped the checks of the laws
    validate = validate_bool(validate, "validate")
    if not validate_bool(replacement, "replacement"):
        return alpha_k_without_replacement(p, q, k, method="exact" if method == "exact" else "lp", normalize=normalize)
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)):
            raise TypeError(f"`workers` must be an int or None, got {type(workers).__name__}")
        if workers == 0 or workers < -1:
            raise ValueError(f"`workers` must be -1 or a positive int, got {workers}")
    if is_batched_input(p) or is_batched_input(q):
        if method != "exact":
            raise ValueError(f"`method` must be 'exact' for a batched or non-numpy input, got {method!r}")
        P, Q, xp = validate_batch_pair(p, q, normalize=normalize, validate=validate)
        ks, scalar = parse_ks(k)
        host = _host_view(P, Q, xp)
        if host is None:
            out = _exact_batched(P, Q, ks, xp)
        else:
            # arrays in host memory (numpy, torch on the CPU): the per-row closed form over the rows
            # (with numba the fused kernels of _alpha_kernel: a sort of int64 keys, then three passes)
            # is faster than the vectorised route here (no full-size temporaries) and gives the
            # per-row values bit for bit; the result goes back through DLPack, zero-copy
            P_, Q_ = host
            rows = P_.reshape(-1, P_.shape[-1])
            qrows = Q_.reshape(-1, Q_.shape[-1])
            vals = np.empty((rows.shape[0], len(ks)))

            def one(i):
                vals[i] = _exact(rows[i], qrows[i], ks)[0] if rows.shape[-1] > 1 else 1.0

            n_thr = _n_workers(workers, rows.shape[0], rows.size)
            if n_thr == 1:
                for i in range(rows.shape[0]):
                    one(i)
            else:
                with ThreadPoolExecutor(n_thr) as ex:
                    list(ex.map(one, range(rows.shape[0])))
            vals = vals.reshape(P_.shape[:-1] + (len(ks),))
            out = vals if isinstance(P, np.ndarray) else xp.from_dlpack(vals)
        return out[..., 0] if scalar else out
    if validate or normalize or method != "exact":
        p_, q_ = validate_pair(p, q, normalize=normalize)
    else:
        p_ = np.asarray(p, dtype=np.float64)
        q_ = np.asarray(q, dtype=np.float64)
    ks, scalar = parse_ks(k)
    if method == "exact":
        vals = _exact(p_, q_, ks)[0]
    else:
        solve = otm_lp if method == "lp" else otm_lp_tuples
        vals = np.empty(len(ks))
        for i, kk in enumerate(ks):
            vals[i] = solve(p_, q_, kk, raise_on_failure=True).alpha
    return float(vals[0]) if scalar else vals


#: Rows per chunk of a batched call in host memory: about 2**19 elements, so the temporaries stay in cache.
_CHUNK_ELEMENTS = 1 << 19
#: Rows per chunk of a batched call on an accelerator (CUDA...): about 2**24 elements, a memory bound only (the
#: chunk's dozen float64 temporaries take about 1.5 GB); a batch below it is one chunk, so every op is launched once.
_DEVICE_CHUNK_ELEMENTS = 1 << 24


def _chunk_elements(x) -> int:
    """Entries per chunk of a batched call on ``x``'s device: cache-sized on the host, memory-bound elsewhere."""
    return _CHUNK_ELEMENTS if str(_device(x)) == "cpu" else _DEVICE_CHUNK_ELEMENTS


def _exact_batched(P, Q, ks, xp):
    r""":math:`\alpha_k` of every row of ``(..., V)`` float64 arrays, shape ``(..., len(ks))``, in namespace ``xp``.

    The per-row closed form (:func:`_exact`) on blocks of rows at once: one
    batched sort by :math:`q/p`, prefix sums (``include_initial``: the empty
    prefix first), the suffix masses of ``p`` summed from the end, and the
    same two formulas for :math:`1 + Q_j - P_j^k` (repeated squaring where
    :math:`P_j \le 1/2`, ``-expm1(k log1p(-S_j))`` above). In host memory,
    rows are processed in chunks of about ``_CHUNK_ELEMENTS`` entries (memory
    traffic, not arithmetic, dominates at full vocabulary); on an accelerator
    a batch up to ``_DEVICE_CHUNK_ELEMENTS`` entries is one chunk (each op one
    launch for the whole batch) and nothing is read back to the host. Same
    array type and device as the input.
    """
    shape = tuple(P.shape[:-1])
    V = int(P.shape[-1])
    B = int(np.prod(shape)) if shape else 1
    P2 = xp.reshape(P, (B, V))
    Q2 = xp.reshape(Q, (B, V))
    step = max(1, _chunk_elements(P) // V)
    if B <= step:
        out = _exact_rows(P2, Q2, ks, xp)
    else:
        out = xp.concat([_exact_rows(P2[r0 : r0 + step, ...], Q2[r0 : r0 + step, ...], ks, xp)
                         for r0 in range(0, B, step)], axis=0)
    return xp.reshape(out, shape + (len(ks),))


#: Smallest batch (entries) that ``workers=None`` spreads over threads.
PARALLEL_MIN_SIZE = 1 << 16


def _n_workers(workers, rows: int, size: int) -> int:
    """Threads for ``rows`` independent rows of ``size`` entries in all."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    if workers is None:
        workers = cores if (rows >= 2 and size >= PARALLEL_MIN_SIZE) else 1
    elif workers == -1:
        workers = cores
    return max(1, min(int(workers), rows))


def _host_view(P, Q, xp):
    """``(P, Q)`` as numpy views when both live in host memory (numpy, or a CPU array via DLPack), else None."""
    import array_api_compat

    if array_api_compat.is_numpy_namespace(xp):
        return np.asarray(P), np.asarray(Q)
    if str(array_api_compat.device(P)) != "cpu":
        return None
    try:
        return np.from_dlpack(P), np.from_dlpack(Q)
    except (TypeError, BufferError, RuntimeError):  # a host array without DLPack export: vectorised route
        return None


def _device(x):
    import array_api_compat

    return array_api_compat.device(x)


def _exact_rows(P, Q, ks, xp):
    """The closed form on a (rows, V) block; returns (rows, len(ks)). No host read, 14 + 10 ops for one even ``k``
    whatever the block's size (each one kernel launch on a device)."""
    rows, V = int(P.shape[0]), int(P.shape[1])
    if V == 1:
        return xp.ones((rows, len(ks)), dtype=xp.float64, device=_device(P))
    # q/p, with p = 0 last (q > 0: +inf; q = 0: nan, which sorts after +inf and weighs nothing)
    with np.errstate(divide="ignore", invalid="ignore"):
        order = xp.argsort(Q / P, axis=-1, stable=False)
    po = take_along_last(P, order, xp)
    qo = take_along_last(Q, order, xp)
    del order
    # prefixes j = 1 .. V-1 (the empty and the full prefix both give exactly 1):
    # P_j, Q_j summed from the front, S_j = 1 - P_j summed from the back
    Pc = xp.cumulative_sum(po, axis=-1)[:, : V - 1]
    Qc = xp.clip(xp.cumulative_sum(qo, axis=-1)[:, : V - 1], None, 1.0)
    S = xp.flip(xp.cumulative_sum(xp.flip(po, axis=-1), axis=-1), axis=-1)[:, 1:]
    del po, qo
    # P_j <= 1/2: P_j**k by repeated squaring; above: 1 - P_j**k = -expm1(k log1p(-S_j)), S_j < 1/2. Both forms on
    # every column and the right one kept entry by entry (no host read of where the split falls). The per-row
    # route's min(., 1) of P and S changes neither a kept value nor the split, so it is left out here: P_j > 1 by
    # rounding only where P_j > 1/2 (its power not kept), S_j >= 1/2 only where P_j <= 1/2 (its log not kept; there
    # log1p(-S) is -inf at S = 1, NaN past it)
    low = Pc <= 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        log_s = xp.log1p(-S)
    del S
    one_q = 1.0 + Qc
    out = []
    for k in ks:
        lo = one_q - int_power(Pc, k) if k <= _UNDERFLOW_K else one_q
        hi = Qc - xp.expm1(log_s * float(k))
        # the empty and the full prefix give exactly 1: the clip's upper bound
        out.append(xp.clip(xp.min(xp.where(low, lo, hi), axis=-1), 0.0, 1.0))
    return xp.reshape(out[0], (rows, 1)) if len(out) == 1 else xp.stack(out, axis=-1)
