r"""Batched inputs from any array library, through the array API standard (array-api-compat).

Per-position quantities (:func:`otspec.alpha_k`, the functions of
:mod:`otspec.multidraft` named ``batched_*``) accept a batch of laws of shape
``(..., V)`` as numpy arrays or torch tensors (CPU or CUDA) and return their
results in the same array type, on the same device. The namespace comes from
:func:`array_api_compat.array_namespace`; nothing here knows about torch.
Computation is in float64 (float32 and integer inputs are converted; the
returned array is float64).

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import _validation_kernel as _LK
from ._validation import NEGLIGIBLE, SIMPLEX_TOL, first_bad_row, number_text, validate_bool, validate_k

__all__ = ["namespace", "is_batched_input", "validate_batch_pair", "parse_ks", "int_power", "take_along_last",
           "copy_of", "to_host"]

#: Largest number of elements of one batched input (each of ``p``, ``q``): a
#: few float64 temporaries of this size are allocated (about 1 GB at the limit).
MAX_BATCH_ELEMENTS = 2**27


def namespace(*arrays):
    """The array-API namespace shared by ``arrays`` (TypeError naming the mismatch otherwise)."""
    import array_api_compat

    return array_api_compat.array_namespace(*arrays)


def copy_of(x, xp):
    """A copy of the array ``x`` of namespace ``xp``, which may be the ``numpy`` module itself (numpy 1.26's
    ``asarray`` takes no ``copy=``: ``np.array`` copies on every numpy; a tensor keeps its one copy op)."""
    return np.array(x, copy=True) if xp is np else xp.asarray(x, copy=True)


def to_host(x) -> np.ndarray:
    """``x`` as a numpy array in host memory: itself for numpy, a zero-copy view of a CPU tensor, a copy of a
    device array (a tensor that requires grad detached first)."""
    if isinstance(x, np.ndarray):
        return x
    import array_api_compat

    if array_api_compat.is_torch_array(x):
        return x.detach().cpu().numpy()
    return np.asarray(array_api_compat.to_device(x, "cpu"))


def is_batched_input(x) -> bool:
    """Whether ``x`` goes through the batched path: a non-numpy array (torch, ...) or an ndarray with ``ndim >= 2``."""
    if isinstance(x, np.ndarray):
        return x.ndim >= 2
    if isinstance(x, (list, tuple, str, bytes, numbers.Number)) or x is None:
        return False
    import array_api_compat

    return array_api_compat.is_array_api_obj(x)


def _as_float64(x, name: str, xp):
    dt = x.dtype
    if xp.isdtype(dt, "complex floating"):
        raise TypeError(f"`{name}` must be real-valued, got a complex array of dtype {dt}")
    if xp.isdtype(dt, "bool") or not xp.isdtype(dt, ("real floating", "integral")):
        raise TypeError(f"`{name}` must hold real numbers, got dtype {dt}")
    if isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.dtype.itemsize > 8:
        with np.errstate(over="raise"):  # float128 beyond the float64 range: refused, not inf with a warning
            try:
                return x.astype(np.float64)
            except FloatingPointError as exc:
                raise ValueError(f"`{name}` must be finite, got entries beyond the float64 range") from exc
    return xp.astype(x, xp.float64, copy=False)  # never written to: no copy needed


def _row(bad) -> str:
    """The first flagged row of a batch, as text (``(2,)`` or ``(0, 3)``), whatever the array library."""
    if not isinstance(bad, np.ndarray) and hasattr(bad, "cpu"):  # a torch tensor, on any device
        bad = bad.cpu()
    return str(first_bad_row(np.asarray(bad)))


def validate_batch_pair(p, q, *, normalize: bool = False, validate: bool = True):
    r"""Check a batch of (draft ``p``, target ``q``) laws of shape ``(..., V)``; return float64 copies and the namespace.

    Every row of ``p`` and of ``q`` must be finite, non-negative and sum to 1
    within ``SIMPLEX_TOL`` (or, with ``normalize=True``, have a positive
    total, then rescaled). Rows of a lower-precision input (float32,
    float16) need only sum to 1 within ``16 sqrt(V)`` machine epsilons of
    their dtype and are renormalised in float64. ``p`` and ``q`` must come from the same array
    library (numpy, torch or cupy), have the same shape and sit on the same device. As on the 1-D route,
    ``-0.0`` and subnormal entries of validated rows are read as exactly 0.
    """
    normalize = validate_bool(normalize, "normalize")  # no truthiness: validate=0 or None skipped every check
    validate = validate_bool(validate, "validate")
    import array_api_compat

    for name, x in (("p", p), ("q", q)):
        if not array_api_compat.is_array_api_obj(x):
            raise TypeError(f"`{name}` must be an array (numpy, torch, ...) for a batched call, got {type(x).__name__}")
    try:
        xp = array_api_compat.array_namespace(p, q)
    except TypeError as exc:
        raise TypeError(
            f"`p` and `q` must come from the same array library, got {type(p).__name__} and {type(q).__name__}"
        ) from exc
    if not any(check(xp) for check in (array_api_compat.is_numpy_namespace, array_api_compat.is_torch_namespace,
                                       array_api_compat.is_cupy_namespace)):
        # the batched routines use numpy, torch or cupy functions beyond the standard (dask, jax, ... are refused
        # here with a clear error rather than deep inside): such arrays can be passed as numpy arrays
        raise TypeError(f"`p` and `q` must be numpy arrays, torch tensors or cupy arrays for a batched call, got "
                        f"{type(p).__module__}.{type(p).__name__} (convert it with numpy.asarray)")
    if tuple(p.shape) != tuple(q.shape):
        raise ValueError(f"`p` and `q` must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    if p.ndim < 1 or p.shape[-1] < 1:
        raise ValueError(f"`p` must have a non-empty last (vocabulary) axis, got shape {tuple(p.shape)}")
    size = int(np.prod(p.shape))
    if size > MAX_BATCH_ELEMENTS:
        raise ValueError(f"`p` has {size} elements; at most {MAX_BATCH_ELEMENTS} are accepted per batched call")
    dev_p, dev_q = array_api_compat.device(p), array_api_compat.device(q)
    if dev_p != dev_q:
        raise ValueError(f"`p` and `q` must be on the same device, got {dev_p} and {dev_q}")
    # lower-precision input (float32, float16) carries its own rounding in every
    # row sum: accept rows within 16 sqrt(V) eps of that dtype, then renormalise
    # them in float64 (documented in every batched entry point)
    low_precision = any(xp.isdtype(x.dtype, "real floating") and x.dtype != xp.float64 for x in (p, q))
    tol = SIMPLEX_TOL
    if low_precision:
        # the namespace's own finfo: numpy's has no torch.bfloat16 ("not inexact"), and an integer partner of a
        # float32 array is no float type at all
        eps = max(float(xp.finfo(x.dtype).eps) for x in (p, q)
                  if xp.isdtype(x.dtype, "real floating") and x.dtype != xp.float64)
        tol = max(tol, 16.0 * float(np.sqrt(p.shape[-1])) * eps)
    P = _as_float64(p, "p", xp)
    Q = _as_float64(q, "q", xp)
    if not (validate or normalize):
        return P, Q, xp
    # device arrays (torch, cupy): every check in one host read where they all pass; numpy's reads are free
    totals = None if array_api_compat.is_numpy_namespace(xp) or size == 0 else _usual_totals(P, Q, xp, normalize, tol)
    if totals is not None:  # every check passes and nothing is flushed: the checks below, in one host read
        if normalize or low_precision:
            P, Q = P / totals[0], Q / totals[1]
        return P, Q, xp
    laws = []
    for name, X in (("p", P), ("q", Q)):
        bad = ~xp.isfinite(X)
        if bool(xp.any(bad)):
            raise ValueError(f"`{name}` must be finite, got {int(xp.sum(xp.astype(bad, xp.int64)))} non-finite "
                             f"entries, the first in row {_row(xp.any(bad, axis=-1))}")
        if bool(xp.any(X < 0)):
            raise ValueError(f"`{name}` must be non-negative, got minimum {number_text(float(xp.min(X)))} "
                             f"(first negative entry in row {_row(xp.any(X < 0, axis=-1))})")
        # -0.0 and subnormal entries as exactly 0, as the 1-D route flushes them (otspec._validation.NEGLIGIBLE):
        # a -0.0 turned a ratio q / p into -inf and a subnormal one into an overflow; only laws that hold one are
        # copied. Before the total of a law to normalize, as on the 1-D route: a row of subnormals has total 0
        # (refused; it was divided by 0)
        flushed = xp.where(X < NEGLIGIBLE, xp.zeros_like(X), X) if _has_tiny(X, xp) else X
        laws.append(flushed)
        if normalize:
            tot = xp.sum(flushed, axis=-1, keepdims=True)
            if bool(xp.any(tot <= 0)):
                raise ValueError(f"`{name}` must have a positive total in every row to be normalized, "
                                 f"got row {_row(tot[..., 0] <= 0)} with total 0")
        else:
            err = xp.abs(xp.sum(X, axis=-1, keepdims=True) - 1.0)
            if bool(xp.any(err > tol)):
                raise ValueError(
                    f"every row of `{name}` must sum to 1 within {tol:.3g}, got row {_row(err[..., 0] > tol)} off "
                    f"by {float(xp.max(err)):.3g} (pass normalize=True to rescale)"
                )
    P, Q = laws
    if normalize or low_precision:
        P = P / xp.sum(P, axis=-1, keepdims=True)
        Q = Q / xp.sum(Q, axis=-1, keepdims=True)
    return P, Q, xp


def _usual_totals(P, Q, xp, normalize: bool, tol: float):
    """The row totals ``(sum(P, axis=-1, keepdims=True), sum(Q, ...))`` where the checks of
    :func:`validate_batch_pair` all pass and no entry is to be flushed, else None (the caller then runs the
    checks one by one, for their messages, and flushes).

    A few reductions per law and **one** host read of their results (a synchronisation on a device), instead of
    a read per check. Per law ``X`` (non-empty):
    ``m = min(where(X > 0, X, 1 / X))`` is at least the smallest normal double exactly when no entry is
    negative, ``-0.0`` (``1 / -0.0 = -inf``), subnormal, NaN or ``-inf`` (``1 / -inf = -0.0``); a ``+inf`` entry
    makes its row's total infinite. Without ``normalize`` the second statistic is ``max |total - 1|`` (within
    ``tol``; NaN or inf fails), with it the totals' ``min`` (positive) and ``max`` (finite). NaN propagates
    through every reduction here and fails every comparison, so any doubt falls back to the full checks.
    """
    stats, totals = [], []
    for X in (P, Q):
        with np.errstate(divide="ignore", invalid="ignore"):
            stats.append(xp.min(xp.where(X > 0, X, xp.divide(1.0, X))))  # divide: one op (1.0 / X: two on torch)
        tot = xp.sum(X, axis=-1, keepdims=True)
        totals.append(tot)
        if normalize:
            stats += [xp.min(tot), xp.max(tot)]
        else:
            stats.append(xp.max(xp.abs(tot - 1.0)))
    got = xp.stack(stats).tolist()  # the one host read
    if normalize:
        ok = all(m >= NEGLIGIBLE and lo > 0 and hi < math.inf for m, lo, hi in (got[:3], got[3:]))
    else:
        ok = all(m >= NEGLIGIBLE and err <= tol for m, err in (got[:2], got[2:]))
    return totals if ok else None


def _has_tiny(X, xp) -> bool:
    """Whether ``X`` (finite, non-negative) holds a ``-0.0`` or a subnormal entry: one compiled read for a
    C-contiguous numpy array (:func:`otspec._validation_kernel.law_check_sum`, NaN exactly there), else in ``xp``."""
    if _LK.JIT and isinstance(X, np.ndarray) and X.flags.c_contiguous and X.dtype == np.float64:
        flat = X.reshape(-1)
        return math.isnan(_LK.law_check_sum(flat, flat.view(np.int64)))
    return bool(xp.any(xp.signbit(X) | ((X > 0) & (X < NEGLIGIBLE))))


def parse_ks(k) -> tuple[list[int], bool]:
    """``k`` as a list of Python ints (any size: no int64 overflow) and whether it was a scalar."""
    if isinstance(k, numbers.Number) or (isinstance(k, np.ndarray) and k.ndim == 0):
        return [validate_k(k.item() if isinstance(k, np.ndarray) else k)], True
    if isinstance(k, (str, bytes)):
        raise TypeError(f"`k` must be an integer or a sequence of integers, got {type(k).__name__}")
    try:
        items = list(k)
    except TypeError as exc:
        raise TypeError(f"`k` must be an integer or a sequence of integers, got {type(k).__name__}") from exc
    if not items:
        raise ValueError("`k` must be a positive integer or a non-empty sequence of them, got an empty sequence")
    return [validate_k(v.item() if isinstance(v, np.ndarray) else v) for v in items], False


def take_along_last(x, idx, xp):
    """``xp.take_along_axis(x, idx, axis=-1)`` for non-negative indices ``idx`` of ``x``'s shape: one op on torch
    tensors (``gather``; array-api-compat's wrapper adds three for negative indices), the same values."""
    import array_api_compat

    if array_api_compat.is_torch_array(x):
        return x.gather(-1, idx)
    return xp.take_along_axis(x, idx, axis=-1)


def int_power(x, k: int):
    """``x**k`` for a positive integer ``k`` by repeated squaring (a few ulp; works on any array type). A new array,
    never ``x`` itself; ``x`` is copied only for an odd ``k`` (a power of two returns its last square)."""
    result = None
    base = x
    while k:
        if k & 1:
            result = (base * 1.0 if base is x else base) if result is None else result * base
        k >>= 1
        if k:
            base = base * base
    return result
