"""Input validation shared by every public entry point.

Each helper returns a clean, read-only float64 *copy* (inputs are never
mutated or aliased) or raises :class:`ValueError` / :class:`TypeError` whose
message names the parameter, says what was expected and what came.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from . import _validation_kernel as _LK

__all__ = [
    "SIMPLEX_TOL",
    "validate_distribution",
    "as_float_array",
    "as_array",
    "law_into",
    "law_in_place",
    "law_total_accepts",
    "validate_pair",
    "validate_k",
    "validate_ks",
    "validate_drafts",
    "validate_probability",
    "validate_positive_int",
    "as_rng",
    "validate_seed",
    "TORCH_SEEDS",
    "NEGLIGIBLE",
    "flush_negligible",
    "simplex_tolerance",
    "number_text",
    "finite_real",
    "sequence_like",
    "first_bad_row",
    "first_bad_entry",
    "validate_bool",
    "validate_at_most",
    "validate_size",
    "validate_count_of",
]

#: Tolerance on ``|sum(p) - 1|`` accepted for a probability vector.
SIMPLEX_TOL = 1e-9

#: Positive entries below this (the subnormal doubles, below the smallest normal
#: double 2.2e-308) are flushed to exactly 0 on input: they carry less than
#: ``n * 2.3e-308`` of mass, far below :data:`SIMPLEX_TOL`, and their reciprocals
#: overflow, which turned ratios such as ``p / q`` into ``inf`` and sums into NaN.
#: After the flush every positive entry ``x`` has a finite ``1 / x``, so the result
#: is the result of the same problem with those entries at exactly zero.
NEGLIGIBLE = float(np.finfo(np.float64).tiny)


def number_text(x) -> str:
    """A number as plain text for messages: ``-0.1`` for ``np.float64(-0.1)``, ``3`` for ``np.int64(3)``."""
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, numbers.Integral):
        return str(int(x))
    if isinstance(x, numbers.Real) or (isinstance(x, np.ndarray) and x.ndim == 0):
        return repr(float(x))
    return repr(x)


def finite_real(x) -> bool:
    """Whether the real number ``x`` (any :class:`numbers.Real`: a Python int past int64 too, where
    ``np.isfinite`` raises a TypeError) is finite as a float64; an int beyond the float64 range is not."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def sequence_like(x) -> bool:
    """Whether ``x`` is read as a sequence of items (a list, a tuple, an array or tensor of at least one axis):
    ``len(x)`` answers and ``x`` is neither text, ``None`` nor a mapping. A 0-d array or tensor has ``__len__``
    but ``len`` raises on it (so do ``iter`` and indexing): not a sequence; a dict's ``x[0]`` is a lookup by key."""
    if x is None or isinstance(x, (str, bytes, Mapping)) or getattr(x, "ndim", None) == 0:
        return False
    try:
        len(x)
    except TypeError:
        return False
    return True


def first_bad_row(bad) -> tuple[int, ...]:
    """Index of the first row of a batch (all axes but the last) flagged in ``bad`` (shape ``(..., V)`` or ``(...)``)."""
    b = np.asarray(bad)
    if b.ndim == 0:
        return ()
    flat = int(np.argmax(b.reshape(-1)))
    return tuple(int(i) for i in np.unravel_index(flat, b.shape))


def first_bad_entry(x, bad) -> str:
    """The first entry of ``x`` flagged in ``bad`` (same shape), as text for a message: ``"-0.5 at index 1"``,
    ``"nan at index (0, 2)"``; ``x`` of shape ``(0,)`` or nothing flagged: ``"no such entry"``."""
    a, b = np.asarray(x), np.asarray(bad)
    if not b.any():
        return "no such entry"
    idx = first_bad_row(b)
    where = idx[0] if len(idx) == 1 else idx
    return f"{number_text(a[idx] if idx else a[()])} at index {where}"


def bool_entry(x) -> tuple[int, ...] | None:
    """The index of the first bool (or ``np.bool_``) entry of a list or tuple, nested or not; None if it has none.

    ``np.asarray`` reads ``[True, 5]`` as the integers ``[1, 5]`` and ``[0.5, False]`` as the floats
    ``[0.5, 0.0]``: the dtype no longer shows the boolean, so arguments that refuse booleans look at the entries.
    One pass over the entries' types (in C) where there is no bool and no nesting.
    """
    kinds = set(map(type, x))
    if bool in kinds or np.bool_ in kinds:
        return next((i,) for i, v in enumerate(x) if isinstance(v, (bool, np.bool_)))
    if kinds & {list, tuple, np.ndarray}:
        for i, v in enumerate(x):
            if isinstance(v, np.ndarray) and v.dtype.kind == "b":
                return (i,)
            sub = bool_entry(v) if isinstance(v, (list, tuple)) else None
            if sub is not None:
                return (i,) + sub
    return None


def _refuse_booleans(src, raw: np.ndarray, name: str, must: str) -> None:
    """TypeError "`name` must <must>, got ..." if the array ``raw`` read from ``src`` is boolean or ``src`` (a list
    or tuple) holds a bool entry."""
    if raw.dtype.kind == "b":
        raise TypeError(f"`{name}` must {must}, got dtype {raw.dtype}")
    if isinstance(src, (list, tuple)) and raw.dtype.kind in "iufO" and (at := bool_entry(src)) is not None:
        entry = src
        for i in at:
            entry = entry[i]
        raise TypeError(f"`{name}` must {must}, got the bool {entry!r} at index {at[0] if len(at) == 1 else at}")


def _tensor_numpy(x, name: str, what: str) -> tuple[np.ndarray, float]:
    """A torch tensor (or another object with ``detach`` and ``cpu``) as a numpy array on the host, and the machine
    epsilon of a float type numpy does not have (bfloat16: read as float32, its own epsilon 2**-8 kept for the
    simplex tolerance; 0.0 otherwise). A tensor without data (on the ``meta`` device) or of a dtype numpy cannot
    take raises a :class:`TypeError` naming ``name`` (not torch's NotImplementedError or numpy's TypeError)."""
    try:
        t = x.detach().cpu()
        eps = 0.0
        if str(getattr(t, "dtype", "")) == "torch.bfloat16":
            t, eps = t.float(), 2.0**-8  # exact: every bfloat16 is a float32
        return t.numpy(), eps
    except (TypeError, RuntimeError, NotImplementedError) as exc:
        raise TypeError(f"`{name}` must be {what}, got a tensor that numpy cannot read ({exc})") from None


def _float_input(x, name: str, what: str, *, booleans: bool = True) -> tuple[np.ndarray, float]:
    """``x`` as a fresh float64 array and the machine epsilon of its own float type.

    Lower-precision floats (float32, float16, torch/array-API tensors of those
    dtypes) are accepted and computed in float64; their epsilon widens the
    simplex tolerance (see :func:`simplex_tolerance`). With ``booleans=False`` (laws) an array of booleans is
    refused with the batched route's TypeError (:func:`otspec._array.validate_batch_pair`): a one-hot of
    booleans is no probability vector.
    """
    if type(x) is np.ndarray and x.dtype == np.float64:  # the common case: only the copy
        return np.array(x, copy=True), 0.0
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"`{name}` must be {what}, got {type(x).__name__}")
    src, eps_ = x, 0.0
    if not isinstance(x, (np.ndarray, list, tuple)) and hasattr(x, "detach") and hasattr(x, "cpu"):
        src, eps_ = _tensor_numpy(x, name, what)  # a torch tensor: read it without keeping a reference
    if np.ma.isMaskedArray(src) and np.ma.is_masked(src):  # np.asarray would drop the mask and read the hidden values
        raise ValueError(f"`{name}` must have no masked entries, got a masked array with "
                         f"{int(np.ma.count_masked(src))} masked")
    try:
        raw = np.asarray(src)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`{name}` must be {what}, got {type(x).__name__}") from exc
    if np.iscomplexobj(raw):
        raise TypeError(f"`{name}` must be real-valued, got a complex array")
    if raw.dtype.kind in "USVMm":  # text, raw bytes or dates: numpy would parse "0.5" or count days silently
        raise TypeError(f"`{name}` must be {what}, got an array of dtype {raw.dtype}")
    if not booleans:  # the batched route's rule: one rule for laws on every route (also [0.5, False])
        _refuse_booleans(src, raw, name, "hold real numbers")
    try:
        with np.errstate(over="raise"):  # float128 beyond the float64 range: refused, not turned into inf with a warning
            arr = np.array(raw, dtype=np.float64, copy=True)
    except FloatingPointError as exc:
        raise ValueError(f"`{name}` must be finite, got entries beyond the float64 range") from exc
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"`{name}` must be {what}, got {type(x).__name__}") from exc
    eps = float(np.finfo(raw.dtype).eps) if raw.dtype.kind == "f" and raw.dtype.itemsize < 8 else 0.0
    return arr, max(eps, eps_)


def as_float_array(x, name: str, what: str = "an array_like of floats", *, booleans: bool = True) -> np.ndarray:
    """``x`` as a fresh float64 array of any shape, read the way :func:`validate_distribution` reads it.

    Lists, tuples, numpy arrays of any real dtype and layout, torch tensors (also with ``requires_grad``) and
    other array-likes are accepted; text, complex, object arrays that are not numbers, ragged nesting, ``None``
    and masked arrays with masked entries raise :class:`TypeError` / :class:`ValueError` naming ``name``.
    Values are not checked (see :func:`validate_distribution`). With ``booleans=False`` a boolean array or a
    list holding a bool (``[0.5, True]``) is refused with a :class:`TypeError` (a bool is no real number).
    """
    return _float_input(x, name, what, booleans=booleans)[0]


def as_array(x, name: str, what: str) -> np.ndarray:
    """``x`` as a numpy array of its own dtype (not copied where it already is one), for integer arguments
    (token ids, counts, draft lengths): torch tensors read without their graph; ``None``, text, ragged nesting,
    booleans (a boolean array, or a bool entry of a list such as ``[True, 5]``) and masked arrays with masked
    entries raise :class:`TypeError` / :class:`ValueError` naming ``name``."""
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"`{name}` must be {what}, got {type(x).__name__}")
    if np.ma.isMaskedArray(x) and np.ma.is_masked(x):
        raise ValueError(f"`{name}` must have no masked entries, got a masked array with {int(np.ma.count_masked(x))} "
                         "masked")
    if not isinstance(x, (np.ndarray, list, tuple)) and hasattr(x, "detach") and hasattr(x, "cpu"):
        x = _tensor_numpy(x, name, what)[0]
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`{name}` must be {what}, got {type(x).__name__}") from exc
    _refuse_booleans(x, arr, name, f"be {what}")  # a bool is no count, token id or length (also [True, 5])
    return arr


def simplex_tolerance(tol: float, n: int, eps: float) -> float:
    """The tolerance on a row sum: ``tol``, widened to ``n * eps`` for lower-precision inputs.

    A float32 distribution of ``n`` entries can only sum to 1 within about
    ``n * 6e-8``; such inputs are accepted within that and rescaled to sum to 1
    in float64.
    """
    return max(tol, 2.0 * n * eps) if eps else tol


def flush_negligible(arr: np.ndarray) -> np.ndarray:
    """Set the positive entries below :data:`NEGLIGIBLE` to 0, in place; return ``arr``."""
    arr[(arr > 0) & (arr < NEGLIGIBLE)] = 0.0
    return arr


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


#: The unit roundoff of float64 (``2**-53``): a sum of ``n`` non-negative doubles in any order is within
#: ``gamma_{n-1} = (n - 1) u / (1 - (n - 1) u)`` of the exact sum, relative (Higham, "Accuracy and Stability of
#: Numerical Algorithms", 2nd ed., §4.2: the bound holds for every order of the additions).
_UNIT_ROUNDOFF = 2.0 ** -53


def law_into(x, out: np.ndarray | None = None, tol: float = SIMPLEX_TOL) -> np.ndarray | None:
    """:func:`validate_distribution` ``(x, name, tol=tol, out=out)`` where it surely accepts ``x``, in one compiled
    read of ``x`` (:func:`otspec._validation_kernel.law_copy_sum`: the flushed copy and its total); None where the
    full check must decide (then ``out`` may hold part of the copy).

    The common case only: ``x`` a float64 ndarray of one non-empty axis, ``out`` (None: a fresh array) as
    :func:`validate_distribution` takes it, of ``x``'s length and apart from it, numba installed. The total is
    summed in vector lanes, not by numpy's pairwise sum, so it decides only where numpy's total would decide the
    same: both are within ``gamma_{n-1} S`` of the exact total ``S`` of the ``n`` non-negative entries, so
    ``|t - 1| + 2 gamma t / (1 - gamma) <= tol`` (``t`` the lanes' total; ``4 n u t`` taken for the second term)
    means numpy's total is within ``tol`` of 1. Every other row (an entry NaN, negative or infinite, a total
    near or past the tolerance, any other input) returns None, and :func:`validate_distribution` decides and words
    it as before. The result is the one :func:`validate_distribution` returns, to the bit (the same flushed copy,
    read-only: ``out`` itself where it owns its data, else a view of it).
    """
    if not (_LK.JIT and type(x) is np.ndarray and x.dtype == np.float64 and x.ndim == 1 and x.shape[0]):
        return None
    n = x.shape[0]
    if out is None:
        out = np.empty(n)
    elif not (type(out) is np.ndarray and out.dtype == np.float64 and out.shape == x.shape and
              out.flags.c_contiguous and out.flags.writeable) or np.may_share_memory(out, x):
        return None
    t = _LK.law_copy_sum(x, out)
    if not abs(t - 1.0) + 4.0 * n * _UNIT_ROUNDOFF * t <= tol:      # NaN (a bad entry) and inf refused here too
        return None
    return _readonly(out if out.base is None else out.view())


def law_in_place(x, tol: float = SIMPLEX_TOL) -> np.ndarray | None:
    """:func:`validate_distribution` ``(x, name, tol=tol)`` without its copy, where it surely accepts ``x`` and its
    flushed copy would be ``x`` to the bit: ``x`` itself where it is read-only, else a read-only view of it (``x``
    is not changed), after one compiled read that writes nothing (:func:`otspec._validation_kernel.law_check_sum`);
    None where a copy or the full check must decide.

    For arrays that nothing writes again (a model that declares ``fresh_laws``, :class:`otspec.models.Model`):
    the result shares ``x``'s memory. Accepted as :func:`law_into` accepts (``|t - 1| + 4 n u t <= tol``, ``t``
    the lanes' total) a C-contiguous float64 ``x`` of one non-empty axis, numba installed, whose every entry is
    ``+0.0`` or a positive normal finite double (nothing to flush); every other ``x`` (an entry subnormal, ``-0.0``,
    negative, NaN or infinite; another layout or type) returns None, and the copying route decides and words it
    as before. Where both accept, the two results are equal to the bit.
    """
    if not (_LK.JIT and type(x) is np.ndarray and x.dtype == np.float64 and x.ndim == 1 and x.shape[0] and
            x.flags.c_contiguous):
        return None
    n = x.shape[0]
    t = _LK.law_check_sum(x, x.view(np.int64))
    if not abs(t - 1.0) + 4.0 * n * _UNIT_ROUNDOFF * t <= tol:      # NaN (an entry to flush or refuse) too
        return None
    if not x.flags.writeable:
        return x
    return _readonly(x.view())


def law_total_accepts(t: float, n: int, tol: float = SIMPLEX_TOL) -> bool:
    """Whether a total ``t`` of the ``n`` entries of a row, summed in any order, where every entry is ``+0.0`` or a
    positive normal finite double (NaN otherwise), passes :func:`law_in_place`'s test ``|t - 1| + 4 n u t <= tol``:
    then :func:`law_in_place` would accept the row (its own total, another order, is within ``gamma_{n-1}`` of the
    same exact total, so numpy's total is within ``tol`` of 1 either way) and :func:`validate_distribution`'s result
    is the row itself to the bit. The check of a row summed in another pass (the bound's row kernels,
    :func:`otspec.tree._bound_kernels.check_block`); False (NaN too): the row is checked apart."""
    return bool(abs(t - 1.0) + 4.0 * n * _UNIT_ROUNDOFF * t <= tol)


def validate_distribution(
    x, name: str, *, normalize: bool = False, tol: float = SIMPLEX_TOL, out: np.ndarray | None = None,
    flush: bool = True, normalizable: bool = True,
) -> np.ndarray:
    """Return ``x`` as a read-only float64 copy after checking it is a distribution.

    ``x`` must be 1-D, non-empty, finite, non-negative and sum to 1 within
    ``tol``; with ``normalize=True`` any positive total is rescaled to 1.
    Booleans (a one-hot ``x == x.max()``) are refused with a TypeError naming ``name``, as on the batched
    route (:func:`otspec._array.validate_batch_pair`).
    Subnormal entries (below :data:`NEGLIGIBLE`) become exactly 0. Float32
    (or float16) input is accepted within ``max(tol, 2 n eps)`` of 1 and
    rescaled to sum to 1 in float64.

    ``normalizable=False``: the caller takes no ``normalize`` option, so a total off 1 is not answered with the hint
    to pass one.

    With ``out`` (a writable C-contiguous 1-D float64 array of the result's length that does not overlap ``x``,
    e.g. a row of a block that a cache fills row by row) the copy is written there and a read-only view of
    ``out`` is returned; on an error ``out`` may hold part of the copy.

    With ``flush=False`` subnormal entries (and ``-0.0``) are kept as given: for functions whose value is defined
    on the raw entries (:func:`otspec.lossy.kl_divergence`); the checks are the same.

    With numba, a float64 row that surely passes (``normalize=False``) is copied and accepted in one read
    (:func:`law_into`); every other row gets the passes below, numpy's sum of the flushed copy deciding as before.
    """
    if out is not None and not (type(out) is np.ndarray and out.dtype == np.float64 and out.ndim == 1 and
                                out.flags.c_contiguous and out.flags.writeable):
        got = (f"a{'' if out.flags.writeable else ' read-only'}{'' if out.flags.c_contiguous else ' strided'} "
               f"{out.ndim}-D {out.dtype} ndarray" if type(out) is np.ndarray else type(out).__name__)
        raise TypeError(f"`out` must be a writable C-contiguous 1-D float64 ndarray, got {got}")
    if flush and _LK.JIT and type(x) is np.ndarray and x.dtype == np.float64 and x.ndim == 1 and x.size:
        if not normalize and (got := law_into(x, out, tol)) is not None:
            return got                  # accepted in one read (the total in vector lanes, surely within `tol`)
        # the common case in one compiled pass (the copy, the flush, the count of bad entries), then numpy's sum of
        # the flushed copy: the total below as before (a row with bad entries takes the passes below, for the message)
        if out is None:
            arr = np.empty(x.shape[0])
        elif out.shape != x.shape or np.shares_memory(out, x):
            raise ValueError(f"`out` must be a row of {x.shape[0]} entries that does not overlap `{name}`")
        else:
            arr = out
        if not _LK.law_copy(x, arr):
            return _total_checked(arr, float(arr.sum()), 0.0, name, normalize, tol, normalizable)
    if out is not None:
        got = validate_distribution(x, name, normalize=normalize, tol=tol, flush=flush)
        if out.shape != got.shape or np.shares_memory(out, x):
            raise ValueError(f"`out` must be a row of {got.shape[0]} entries that does not overlap `{name}`")
        out[...] = got
        return _readonly(out.view())
    arr, eps = _float_input(x, name, "a 1-D array_like of floats", booleans=False)
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got an array of shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"`{name}` must be non-empty, got length 0")
    # one pass each (the minimum first: no sum over a NaN or -inf); the messages below say which entries
    if not (arr.min() >= 0 and math.isfinite(total := float(arr.sum()))):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"`{name}` must be finite, got {int(np.sum(~np.isfinite(arr)))} non-finite entries")
        if np.any(arr < 0):
            raise ValueError(f"`{name}` must be non-negative, got minimum {number_text(arr.min())} "
                             f"at index {int(np.argmin(arr))}")
    small = arr < NEGLIGIBLE  # flush_negligible on a non-negative array; the total is re-summed only if it changed
    if flush and small.any():
        arr[small] = 0.0
        total = float(arr.sum())
    return _total_checked(arr, total, eps, name, normalize, tol, normalizable)


def _total_checked(arr: np.ndarray, total: float, eps: float, name: str, normalize: bool, tol: float,
                   normalizable: bool = True) -> np.ndarray:
    """The end of :func:`validate_distribution`: ``arr`` (finite, non-negative, flushed; ``total`` its numpy sum)
    rescaled or checked against the simplex tolerance, returned read-only; the hint to pass ``normalize=True`` only
    where the caller takes it (``normalizable``)."""
    tol_ = simplex_tolerance(tol, arr.shape[0], eps)
    if normalize:
        if not total > 0:
            raise ValueError(f"`{name}` must have a positive total to be normalized, got {total!r}")
        arr /= total
    elif abs(total - 1.0) > tol_:
        raise ValueError(
            f"`{name}` must sum to 1 within {tol_:g}, got {total!r}"
            + (" (pass normalize=True to rescale)" if normalizable else "")
        )
    elif eps:
        arr /= total  # lower-precision input: computed in float64 on the simplex
    return _readonly(arr if arr.base is None else arr.view())


def validate_pair(p, q, *, normalize: bool = False, normalizable: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (draft ``p``, target ``q``) pair on the same vocabulary."""
    normalize = validate_bool(normalize, "normalize")  # no truthiness ("no", 0, None)
    p_ = validate_distribution(p, "p", normalize=normalize, normalizable=normalizable)
    q_ = validate_distribution(q, "q", normalize=normalize, normalizable=normalizable)
    if p_.shape != q_.shape:
        raise ValueError(
            f"`p` and `q` must have the same length, got {p_.shape[0]} and {q_.shape[0]}"
        )
    return p_, q_


def validate_positive_int(k, name: str, *, minimum: int = 1) -> int:
    """Return ``k`` as a Python int, checking it is an integer ``>= minimum``."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        if isinstance(k, (float, np.floating)) and float(k).is_integer():
            raise TypeError(f"`{name}` must be an integer, got the float {k!r}")
        raise TypeError(f"`{name}` must be an integer, got {type(k).__name__}")
    k = int(k)
    if k < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {k}")
    return k


def validate_k(k) -> int:
    """Number of drafts: a positive integer."""
    return validate_positive_int(k, "k")


def validate_ks(k) -> tuple[np.ndarray, bool]:
    """Accept an int or a non-empty sequence of ints; return (array, is_scalar)."""
    if isinstance(k, numbers.Number):
        return np.array([validate_k(k)], dtype=np.int64), True
    if isinstance(k, np.ndarray) and k.ndim == 0:
        return np.array([validate_k(k.item())], dtype=np.int64), True
    if isinstance(k, (Sequence, np.ndarray)) and not isinstance(k, (str, bytes)):
        ks = [validate_k(v) for v in k]
        if not ks:
            raise ValueError("`k` must be a positive integer or a non-empty sequence of them, got an empty sequence")
        return np.array(ks, dtype=np.int64), False
    raise TypeError(f"`k` must be an integer or a sequence of integers, got {type(k).__name__}")


def validate_drafts(drafts, k: int, n: int) -> tuple[int, ...]:
    """Check ``drafts`` is a length-``k`` sequence of token ids in ``[0, n)``."""
    if type(drafts) in (tuple, list) and len(drafts) == k and all(type(v) is int and 0 <= v < n for v in drafts):
        return tuple(drafts)  # the common case (Python ints, bools excluded), checked without numpy
    if isinstance(drafts, numbers.Integral) and not isinstance(drafts, bool):
        drafts = (drafts,)
    arr = as_array(drafts, "drafts", f"a sequence of {k} token ids")
    if arr.ndim != 1 or arr.shape[0] != k:
        raise ValueError(f"`drafts` must be a sequence of k={k} token ids, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(np.mod(arr, 1) == 0):
            raise TypeError("`drafts` must hold integer token ids, got floats")
        raise TypeError(f"`drafts` must hold integer token ids, got dtype {arr.dtype}")
    if np.any(arr < 0) or np.any(arr >= n):
        raise ValueError(f"`drafts` must be token ids in [0, {n}), got {arr.tolist()}")
    return tuple(int(v) for v in arr)


def validate_probability(x, name: str, *, low_open: bool = False, high_open: bool = False) -> float:
    """A real number in [0, 1] (ends optionally open)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {type(x).__name__}")
    v = float(x)
    lo_ok = v > 0 if low_open else v >= 0
    hi_ok = v < 1 if high_open else v <= 1
    if not (np.isfinite(v) and lo_ok and hi_ok):
        lo = "(0" if low_open else "[0"
        hi = "1)" if high_open else "1]"
        raise ValueError(f"`{name}` must lie in {lo}, {hi}, got {number_text(x)}")
    return v


#: The seeds a ``torch.Generator`` takes (``manual_seed``): below ``2**64``.
TORCH_SEEDS = 2**64


def validate_seed(seed, name: str = "rng", *, below: int | None = None) -> int:
    """A seed of any integral type (Python or numpy integers), as a non-negative Python int; with ``below`` (e.g.
    :data:`TORCH_SEEDS` for a torch generator) a seed ``>= below`` is refused naming ``name``."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer seed, got {type(seed).__name__}")
    seed = int(seed)  # np.int64(3) -> 3: a numpy integer is the same seed as the int
    if seed < 0:
        raise ValueError(f"`{name}` must be a non-negative integer seed, got {seed}")
    if below is not None and seed >= below:
        raise ValueError(f"`{name}` must be an integer seed below {below:,}, got {seed:,}")
    return seed


def as_rng(rng, name: str = "rng") -> np.random.Generator:
    """``rng``: ``np.random.Generator | int | None`` through ``np.random.default_rng``.

    Integer seeds of any integral type (``int``, ``np.int64``, ...) are accepted
    and must be non-negative; a Generator (or a subclass of it) is used as is.
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, np.random.SeedSequence):
        return np.random.default_rng(rng)
    if isinstance(rng, (bool, np.bool_)) or not isinstance(rng, numbers.Integral):
        raise TypeError(
            f"`{name}` must be a numpy Generator, a non-negative int seed or None, got {type(rng).__name__}"
        )
    return np.random.default_rng(validate_seed(rng, name))


def validate_bool(x, name: str, *, allow_none: bool = False) -> bool | None:
    """``x`` as a Python bool: ``bool`` and ``numpy.bool_`` accepted (``None`` too with ``allow_none=True``, returned
    as is); anything else (``1``, ``"yes"``, ``None``) raises :class:`TypeError` naming ``name`` -- no truthiness."""
    if allow_none and x is None:
        return None
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool{' or None' if allow_none else ''}, got {type(x).__name__} {x!r}")
    return bool(x)


def validate_at_most(n: int, name: str, cap: int, cap_name: str, hint: str) -> int:
    """``n`` (an int already checked) if ``n <= cap``; else a :class:`ValueError` naming ``name``, the value received,
    the cap (the module constant ``cap_name``) and how to get more (``hint``, e.g. "call in chunks") -- raised
    before any work, so a size that would run for hours or allocate beyond memory is refused at once. A ``name``
    that already holds backticks (an expression of parameters: ``"len(`bs`) * len(`ks`)"``) is written as is."""
    if n > cap:
        what = name if "`" in name else f"`{name}`"
        raise ValueError(f"{what} must be at most {cap_name} = {cap:,}, got {n:,}; {hint}")
    return n


def validate_size(n, name: str, *, cap: int, cap_name: str, hint: str, minimum: int = 1) -> int:
    """A size parameter (a count of samples, points, tokens): :func:`validate_positive_int` (``>= minimum``; no
    bool, float or text) and :func:`validate_at_most` ``cap``, as a Python int."""
    return validate_at_most(validate_positive_int(n, name, minimum=minimum), name, cap, cap_name, hint)


def validate_count_of(values, name: str, *, cap: int, cap_name: str, hint: str) -> list:
    """The items of a finite iterable (a grid, a list of ``k``) as a list, refused with a :class:`ValueError` naming
    ``name`` when it has more than ``cap`` items -- counted without materialising more than ``cap + 1`` of them (a
    ``range(10**12)`` is refused at once); text, ``None`` and non-iterables raise a :class:`TypeError`."""
    if isinstance(values, (str, bytes)) or values is None:
        raise TypeError(f"`{name}` must be a sequence, got {type(values).__name__}")
    try:
        size = len(values)
    except TypeError:
        size = None
    if size is not None and size > cap:
        raise ValueError(f"`{name}` must have at most {cap_name} = {cap:,} items, got {size:,}; {hint}")
    try:
        items = list(itertools.islice(iter(values), cap + 1))
    except TypeError as exc:
        raise TypeError(f"`{name}` must be a sequence, got {type(values).__name__}") from exc
    if len(items) > cap:
        raise ValueError(f"`{name}` must have at most {cap_name} = {cap:,} items, got more; {hint}")
    return items
