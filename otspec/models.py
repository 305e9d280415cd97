r"""Small autoregressive sources that the package can enumerate exactly.

A *model* over a vocabulary :math:`\Omega = \{0, \dots, V-1\}` is anything
with an integer attribute ``vocab_size`` and a method
``next_dist(prefix: tuple[int, ...]) -> (V,) ndarray`` giving the conditional
law :math:`M(\cdot \mid x^{i})` of the next token after ``prefix``. This is a
:class:`typing.Protocol` (duck typing): users and tests can bring their own.
The joint probability of a sequence is the product of its conditionals,

.. math::

    M(x^\ell) = \prod_{j=1}^{\ell} M(x_j \mid x^{j-1}).

Shipped sources:

* :class:`TableModel` -- explicit conditional tables, one per prefix length
  (:func:`random_table_model` draws them from a Dirichlet law);
* :class:`MemorylessModel` -- the same distribution at every step
  (Sun et al.'s (arXiv:2403.10444) Bernoulli sources :math:`\mathrm{Ber}(p)`, :math:`\mathrm{Ber}(q)`);
* :class:`MarkovModel` -- Markov chains of order ``m``
  (:func:`random_markov_model`).

Helpers: :func:`sequence_probability` (exact joint probability),
:func:`joint_law` (the whole table :math:`M(x^\ell)` over
:math:`\Omega^\ell`), :func:`conditional_tables` (every conditional up to a
length, validated), :func:`validate_model` and :func:`validate_model_pair`.

Notation: the *draft* model is :math:`M_s` (the paper's "small" model, the
package's ``p``) and the *target* model is :math:`M_b` (the "big" model, the
package's ``q``).
"""

from __future__ import annotations

import itertools
import math
import numbers
import weakref
from typing import Protocol, runtime_checkable

import numpy as np

from ._validation import (
    SIMPLEX_TOL,
    _float_input,
    as_rng,
    flush_negligible,
    law_in_place,
    law_into,
    law_total_accepts,
    number_text,
    sequence_like,
    simplex_tolerance,
    validate_distribution,
    validate_positive_int,
)
from ._validation_kernel import INF_BITS, TINY_BITS

__all__ = [
    "Model",
    "TableModel",
    "MemorylessModel",
    "MarkovModel",
    "random_table_model",
    "random_markov_model",
    "random_memoryless_model",
    "sequence_probability",
    "joint_law",
    "joint_from_tables",
    "conditional_tables",
    "validate_model",
    "validate_model_pair",
    "validate_sequence",
    "MAX_ENUMERATION",
    "MAX_AXES",
    "MAX_LENGTH",
    "check_enumeration",
    "next_law",
    "check_length",
    "size_exceeds",
]

#: Default largest number of table entries (``V**length``) that the exact
#: enumeration helpers build before refusing with a ValueError.
MAX_ENUMERATION = 2_000_000

#: Largest sequence length of an exact table: tables have one array axis per
#: token (shape ``(V,) * length``), and numpy arrays have at most 32 axes on every
#: supported version. Binding only for ``V = 1`` (``2**32`` entries exceed every
#: enumeration limit first).
MAX_AXES = 32

#: Largest block / sequence length ``L`` accepted by the routines that loop over
#: positions (samplers, per-position recursions): one model call per position.
MAX_LENGTH = 100_000


def size_exceeds(V: int, length: int, limit: int) -> bool:
    """Whether ``V**length > limit``, without building the big integer ``V**length``.

    ``V**(10**18)`` as a Python int never finishes; a logarithm decides every
    case that is far from the limit and the exact power is only formed when it
    is at most about ``2 * limit``.

    Parameters
    ----------
    V : int
        Vocabulary size (>= 1).
    length : int
        Sequence length (>= 0).
    limit : int
        The stated limit.

    Returns
    -------
    bool

    Raises
    ------
    TypeError, ValueError
        ``V``, ``length`` or ``limit`` not an integer (bool, float, text, None), ``V < 1``, ``length < 0`` or
        ``limit < 0``.

    Examples
    --------
    >>> from otspec.models import size_exceeds
    >>> size_exceeds(2, 10**18, 2_000_000), size_exceeds(2, 20, 2_000_000)
    (True, False)
    """
    V = validate_positive_int(V, "V")  # a float, text or 0-d array reached math.log2 or `<=` with numpy's error
    length = validate_positive_int(length, "length", minimum=0)
    limit = validate_positive_int(limit, "limit", minimum=0)
    if V <= 1:
        return 1 > limit
    if limit == 0:
        return True  # V**length >= 1 > 0 (log2(0) is a domain error)
    if length * math.log2(V) > math.log2(limit) + 1.0:
        return True
    return V**length > limit


def size_text(V: int, length: int) -> str:
    """``V**length`` for a message: the exact integer when small, else its order of magnitude."""
    if V <= 1 or length * math.log10(V) <= 18:
        return str(V**length)
    return f"about 10**{length * math.log10(V):.4g}"


def check_enumeration(V: int, length: int, limit: int, *, what: str = "sequences",
                      length_name: str = "L", limit_name: str = "max_entries") -> None:
    """Refuse (ValueError) an exact enumeration of ``V**length`` items above ``limit``.

    Called before any allocation or model call; the message names the
    parameter and the limit.

    Parameters
    ----------
    V : int
        Vocabulary size.
    length : int
        Number of tokens enumerated (one array axis each).
    limit : int
        The stated limit on ``V**length``.
    what : str, keyword-only
        What is enumerated, for the message.
    length_name, limit_name : str, keyword-only
        Parameter names for the message.

    Returns
    -------
    None
        Nothing: the enumeration is within the limits when it returns.

    Raises
    ------
    ValueError
        ``V**length > limit``, or ``length > MAX_AXES``.

    Examples
    --------
    >>> from otspec.models import check_enumeration
    >>> check_enumeration(2, 10, 2_000_000)  # 1024 sequences: fine
    >>> try:
    ...     check_enumeration(2, 10**18, 2_000_000)
    ... except ValueError as exc:
    ...     print(str(exc)[:40])
    exact enumeration of V**`L` = 2**1000000
    """
    ln = length_name if "`" in length_name else f"`{length_name}`"
    V = validate_positive_int(V, "V")  # each named as the caller names it, before size_exceeds checks them again
    length = validate_positive_int(length, length_name.strip("`"), minimum=0)
    limit = validate_positive_int(limit, limit_name, minimum=0)
    if size_exceeds(V, length, limit):
        raise ValueError(
            f"exact enumeration of V**{ln} = {V}**{length} = {size_text(V, length)} {what} "
            f"exceeds the stated limit `{limit_name}`={limit}"
        )
    if length > MAX_AXES:
        raise ValueError(
            f"exact enumeration builds tables with one array axis per token: {ln}={length} "
            f"exceeds the limit of {MAX_AXES} axes"
        )


def check_length(L: int, name: str = "L", limit: int = MAX_LENGTH) -> int:
    """Refuse (ValueError) a sequence length above :data:`MAX_LENGTH` for per-position loops.

    Parameters
    ----------
    L : int
        A validated positive length.
    name : str
        Parameter name for the message.
    limit : int
        The limit (default :data:`MAX_LENGTH`).

    Returns
    -------
    int
        ``L``.

    Raises
    ------
    ValueError
        ``L > limit``.

    Examples
    --------
    >>> from otspec.models import check_length
    >>> check_length(8)
    8
    """
    L = validate_positive_int(L, name, minimum=0)  # no NaN, bool, text or float passed through unchecked
    limit = validate_positive_int(limit, "limit", minimum=0)  # limit=None or an array: no comparison error
    if L > limit:
        raise ValueError(
            f"`{name}` must be at most {limit} (one model call per position), got {L}"
        )
    return L


@runtime_checkable
class Model(Protocol):
    """An autoregressive source: ``vocab_size`` and ``next_dist(prefix)``.

    Attributes
    ----------
    vocab_size : int
        Size :math:`V` of the vocabulary; tokens are ``0 .. V-1``.

    Methods
    -------
    next_dist(prefix)
        ``prefix`` is a tuple of token ids; returns the ``(V,)`` conditional
        law of the next token (non-negative, summing to 1).

    Notes
    -----
    Optional declaration: a model whose class (or instance) has
    ``fresh_laws = True`` (the bool itself) promises that no array its
    ``next_dist`` returned is ever written again, by it or by anything that
    shares its memory (a new array per call, or read-only tables). The exact
    routines may then read the returned laws where they are, each checked in
    one read, instead of copying each (:func:`next_law` with
    ``in_place=True``; :func:`otspec.tree.bound`). A model that reuses a
    buffer (one array overwritten by the next call, views of a ring of rows)
    must not declare it; without the declaration every law is copied when
    read, which is always right. Breaking the promise is the model's bug: the
    bound may then read another law. Shipped models that declare it:
    :class:`TableModel`, :class:`MemorylessModel`, :class:`MarkovModel`
    (read-only tables) and :func:`otspec.decoding.as_model` (a new array per
    call).
    """

    vocab_size: int

    def next_dist(self, prefix: tuple[int, ...]) -> np.ndarray:  # pragma: no cover - protocol
        ...


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------


def _validate_table_rows(table, name: str, tol: float = SIMPLEX_TOL) -> np.ndarray:
    """Return a read-only float64 copy of ``table`` whose last axis holds distributions.

    As :func:`otspec._validation.validate_distribution` row by row: subnormal
    entries become 0, float32 rows are accepted within their precision and
    rescaled to sum to 1 in float64.
    """
    arr, eps = _float_input(table, name, "an array_like of floats", booleans=False)  # the laws' rule: no booleans
    if arr.ndim == 0 or arr.size == 0:
        raise ValueError(f"`{name}` must be a non-empty array of distributions, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"`{name}` must be finite, got {int(np.sum(~np.isfinite(arr)))} non-finite entries")
    if np.any(arr < 0):
        at = np.unravel_index(int(np.argmin(arr)), arr.shape)
        raise ValueError(f"`{name}` must be non-negative, got minimum {number_text(arr.min())} "
                         f"at prefix {tuple(int(i) for i in at[:-1])}, token {int(at[-1])}")
    flush_negligible(arr)
    sums = arr.sum(axis=-1)
    err = np.abs(sums - 1.0)
    tol_ = simplex_tolerance(tol, arr.shape[-1], eps)
    if np.any(err > tol_):
        worst = np.unravel_index(int(np.argmax(err)), err.shape)
        raise ValueError(
            f"every row of `{name}` must sum to 1 within {tol_:g}, got {float(sums[worst])!r} "
            f"at prefix {tuple(int(i) for i in worst)}"
        )
    if eps:
        arr /= sums[..., None]
    arr.setflags(write=False)
    return arr


def validate_model(model, name: str = "model") -> int:
    """Check that ``model`` follows the :class:`Model` protocol; return its vocabulary size.

    Parameters
    ----------
    model : Model
        Object with an integer ``vocab_size`` >= 1 and a callable ``next_dist``.
    name : str
        Parameter name used in error messages.

    Returns
    -------
    int
        ``model.vocab_size``.

    Raises
    ------
    TypeError
        If ``vocab_size`` or ``next_dist`` is missing or of the wrong type.
    ValueError
        If ``vocab_size`` < 1.

    Examples
    --------
    >>> from otspec.models import MemorylessModel, validate_model
    >>> validate_model(MemorylessModel([0.5, 0.5]))
    2
    """
    if not hasattr(model, "vocab_size") or not callable(getattr(model, "next_dist", None)):
        raise TypeError(
            f"`{name}` must be a model with a `vocab_size` attribute and a `next_dist(prefix)` "
            f"method, got {type(model).__name__}"
            + (f": a decoding model gives logits, not laws; pass otspec.decoding.as_model({name}, context=prompt)"
               if callable(getattr(model, "logits", None)) and callable(getattr(model, "new_state", None)) else "")
        )
    v = model.vocab_size
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"`{name}.vocab_size` must be an integer, got {type(v).__name__}")
    if int(v) < 1:
        raise ValueError(f"`{name}.vocab_size` must be >= 1, got {int(v)}")
    return int(v)


def validate_model_pair(draft, target) -> int:
    """Check a (draft, target) pair of models on the same vocabulary; return ``V``.

    Parameters
    ----------
    draft, target : Model
        Draft :math:`M_s` (``p``) and target :math:`M_b` (``q``).

    Returns
    -------
    int
        The shared vocabulary size ``V``.

    Raises
    ------
    TypeError
        If either is not a model (see :func:`validate_model`).
    ValueError
        If the vocabulary sizes differ.

    Examples
    --------
    >>> from otspec.models import MemorylessModel, validate_model_pair
    >>> validate_model_pair(MemorylessModel([0.5, 0.5]), MemorylessModel([0.2, 0.8]))
    2
    """
    vs = validate_model(draft, "draft")
    vb = validate_model(target, "target")
    if vs != vb:
        raise ValueError(
            f"`draft` and `target` must share one vocabulary, got vocab_size {vs} (draft) "
            f"and {vb} (target)"
        )
    return vs


def validate_sequence(seq, vocab_size: int, name: str = "seq") -> tuple[int, ...]:
    """Return ``seq`` as a tuple of token ids in ``[0, vocab_size)``.

    Parameters
    ----------
    seq : sequence of int
        Token ids.
    vocab_size : int
        ``V``.
    name : str
        Parameter name for error messages.

    Returns
    -------
    tuple of int
        The ids.

    Raises
    ------
    TypeError
        A string, ``None`` or non-integer ids.
    ValueError
        An id outside ``[0, V)``.

    Examples
    --------
    >>> from otspec.models import validate_sequence
    >>> validate_sequence([1, 0], 2)
    (1, 0)
    """
    if isinstance(seq, (str, bytes)) or seq is None:
        raise TypeError(f"`{name}` must be a sequence of token ids, got {type(seq).__name__}")
    vocab_size = validate_positive_int(vocab_size, "vocab_size")  # vocab_size=None: a comparison error per token
    try:
        items = list(seq)
    except TypeError as exc:
        raise TypeError(f"`{name}` must be a sequence of token ids, got {type(seq).__name__}") from exc
    out = []
    for t in items:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"`{name}` must hold integer token ids, got {type(t).__name__}")
        t = int(t)
        if not 0 <= t < vocab_size:
            raise ValueError(f"`{name}` must hold token ids in [0, {vocab_size}), got {t}")
        out.append(t)
    return tuple(out)


#: otspec's own models (of the exact classes :class:`TableModel`, :class:`MemorylessModel`, :class:`MarkovModel`)
#: whose tables passed :func:`_rows_in_place` when the model was made: model -> ``{id: table}`` (the tables held here
#: too, so that no other array can take one of their ids while the model lives). Filled only by those constructors
#: (:func:`_mark_checked`); read by :func:`checked_tables`.
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rows_in_place(*tables) -> bool:
    """Whether every row (last axis) of every table is a law that :func:`otspec._validation.law_in_place` accepts
    as it is: each entry ``+0.0`` or a positive normal finite double (the bit test of
    :func:`otspec._validation_kernel.law_check_sum`), and the row's total ``t`` (numpy's sum: any order of the
    additions is within ``gamma_{n-1}`` of the exact total, which the margin of
    :func:`otspec._validation.law_total_accepts` covers) accepted. Such a row is the law that
    :func:`validate_distribution` returns for it, to the bit, and no check of it can refuse it."""
    for t in tables:
        if not (type(t) is np.ndarray and t.dtype == np.float64 and t.flags.c_contiguous and t.ndim >= 1 and t.size):
            return False
        b = t.reshape(-1).view(np.int64)
        if not ((b == 0) | ((b >= TINY_BITS) & (b < INF_BITS))).all():
            return False
        n = t.shape[-1]
        if not all(law_total_accepts(x, n) for x in t.sum(axis=-1).reshape(-1).tolist()):
            return False
    return True


def _mark_checked(model, *tables) -> None:
    """Record that every law ``model`` (an instance of exactly one of otspec's table models, not of a subclass,
    whose ``next_dist`` may differ) returns from ``tables`` (read-only arrays it holds) was checked once, here:
    where :func:`_rows_in_place` holds."""
    if type(model) in (TableModel, MemorylessModel, MarkovModel) and _rows_in_place(*tables):
        _CHECKED[model] = {id(t): t for t in tables}


def checked_tables(model):
    """The tables of ``model`` whose every row was checked when otspec made it (:func:`_mark_checked`), as
    ``{id: table}``, or None (any other model: a user's, a subclass, tables that did not pass). A law ``row`` that ``model``
    returned was checked there where ``id(row)`` or ``id(row.base)`` is one of them: it is the law that
    :func:`next_law` returns for it (``in_place=True``), to the bit, and no check of it can refuse it. Writing into
    those tables (read-only; numpy allows it only after ``setflags(write=True)`` on their owner) breaks the
    model, as breaking :class:`Model`'s ``fresh_laws`` promise does."""
    if type(model) not in (TableModel, MemorylessModel, MarkovModel):
        return None
    return _CHECKED.get(model)


def next_law(model, prefix: tuple[int, ...], V: int, name: str, *, out: np.ndarray | None = None,
             in_place: bool = False) -> np.ndarray:
    """``model.next_dist(prefix)`` checked: shape ``(V,)`` and a distribution (read-only float64 copy).

    Every sampler and exact routine calls models through this, so a model
    whose conditional is not a law (rows summing to 1.4, NaN, wrong length)
    is refused on first use, in O(V) per call.

    Parameters
    ----------
    model : Model
    prefix : sequence of int
        The context.
    V : int
        The model's vocabulary size.
    name : str
        Parameter name for messages (``"draft"``, ``"target"``).
    out : (V,) ndarray of float64, optional
        Where to write the checked copy (a writable C-contiguous row, e.g. of a block that a cache fills row by
        row); the result is then a read-only view of it.
    in_place : bool, keyword-only
        For a model that declares ``fresh_laws`` (see :class:`Model`), whose arrays nothing writes again: a law
        that surely passes with no entry to flush is returned as the model's own array (read-only; a read-only
        view where it is writable), checked in one read and not copied
        (:func:`otspec._validation.law_in_place`); every other law is copied and checked as without it. The
        caller must read the result before anything may write the model's array.

    Returns
    -------
    (V,) ndarray of float64, read-only

    Raises
    ------
    ValueError
        A conditional of another shape, or not a distribution (see
        :func:`otspec._validation.validate_distribution`).

    Examples
    --------
    >>> from otspec.models import MemorylessModel, next_law
    >>> next_law(MemorylessModel([0.25, 0.75]), (1, 0), 2, "draft").tolist()
    [0.25, 0.75]
    """
    try:
        prefix = tuple(prefix)
    except TypeError:
        raise TypeError(f"`prefix` must be a sequence of token ids, got {type(prefix).__name__}") from None
    next_dist = getattr(model, "next_dist", None)  # no AttributeError from deep inside for what is no model
    if next_dist is None:
        raise TypeError(f"`{name}` must be a model with vocab_size and next_dist(prefix), got {type(model).__name__}")
    if type(V) is not int:  # a bool, float, text or array: refused before a shape comparison reads it
        V = validate_positive_int(V, "V")
    row = next_dist(prefix)
    if in_place and type(row) is np.ndarray and row.shape == (V,) and (law := law_in_place(row)) is not None:
        return law                      # checked in one read, not copied (the model's arrays are never rewritten)
    if type(row) is np.ndarray and row.shape == (V,) and (law := law_into(row, out)) is not None:
        return law                      # the common case: checked and copied in one read, no message built
    if np.shape(row) != (V,):
        raise ValueError(
            f"`{name}.next_dist({prefix})` must have shape ({V},) (vocab_size={V}), got {np.shape(row)}"
        )
    return validate_distribution(row, f"{name}.next_dist({prefix})", out=out, normalizable=False)


# ---------------------------------------------------------------------------
# shipped models
# ---------------------------------------------------------------------------


class TableModel:
    r"""Explicit conditional tables, one per prefix length.

    .. math::

        M(x_{\ell+1} = y \mid x^{\ell}) = T_\ell[x_1, \dots, x_\ell, y],
        \qquad \ell = 0, \dots, \text{max\_len} - 1.

    Parameters
    ----------
    tables : sequence of array_like of float
        ``tables[l]`` has shape ``(V,) * (l + 1)``: its last axis is the law
        of the next token after the prefix given by the first ``l`` indices.
        Every row must be a distribution (within ``SIMPLEX_TOL``).

    Attributes
    ----------
    vocab_size : int
    max_len : int
        Longest sequence the model can generate (``len(tables)``); asking
        ``next_dist`` for a longer prefix raises ValueError.
    tables : tuple of read-only ndarray

    Raises
    ------
    ValueError
        Empty ``tables``, wrong shapes, or rows that are not distributions.

    Examples
    --------
    >>> from otspec.models import TableModel
    >>> m = TableModel([[0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]]])
    >>> m.next_dist((1,)).tolist()
    [0.2, 0.8]
    """

    def __init__(self, tables):
        if isinstance(tables, np.ndarray) or not sequence_like(tables) or len(tables) == 0:  # a dict: KeyError 0
            raise ValueError(
                "`tables` must be a non-empty sequence of arrays, tables[l] of shape (V,)*(l+1)"
            )
        first = _validate_table_rows(tables[0], "tables[0]")
        if first.ndim != 1:
            raise ValueError(f"`tables[0]` must have shape (V,), got {first.shape}")
        V = first.shape[0]
        out = [first]
        for ell in range(1, len(tables)):
            t = _validate_table_rows(tables[ell], f"tables[{ell}]")
            if t.shape != (V,) * (ell + 1):
                raise ValueError(
                    f"`tables[{ell}]` must have shape {(V,) * (ell + 1)}, got {t.shape}"
                )
            out.append(t)
        self.tables = tuple(out)
        self.vocab_size = int(V)
        self.max_len = len(out)
        _mark_checked(self, *self.tables)

    #: Every law returned is a read-only view of the tables, which nothing writes (see :class:`Model`).
    fresh_laws = True

    def next_dist(self, prefix: tuple[int, ...]) -> np.ndarray:
        """Conditional law of the next token after ``prefix`` (read-only view)."""
        prefix = tuple(prefix)
        if len(prefix) >= self.max_len:
            raise ValueError(
                f"`prefix` must be shorter than max_len={self.max_len} for this TableModel, "
                f"got length {len(prefix)}"
            )
        return self.tables[len(prefix)][prefix]

    def __repr__(self) -> str:
        return f"TableModel(vocab_size={self.vocab_size}, max_len={self.max_len})"


class MemorylessModel:
    r"""A memoryless (i.i.d.) source: :math:`M(\cdot \mid x^\ell) = d` for every prefix.

    Parameters
    ----------
    dist : (V,) array_like of float
        The per-step distribution.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> MemorylessModel([0.25, 0.75]).next_dist((0, 1, 1)).tolist()
    [0.25, 0.75]
    """

    max_len = None  # unbounded
    #: The law returned is the read-only ``dist``, which nothing writes (see :class:`Model`).
    fresh_laws = True

    def __init__(self, dist):
        self.dist = validate_distribution(dist, "dist", normalizable=False)
        self.vocab_size = int(self.dist.shape[0])
        _mark_checked(self, self.dist)

    def next_dist(self, prefix: tuple[int, ...]) -> np.ndarray:
        """The per-step distribution (whatever the prefix)."""
        return self.dist

    def __repr__(self) -> str:
        return f"MemorylessModel({np.array2string(self.dist, precision=4, separator=', ')})"


class MarkovModel:
    r"""A Markov chain of order ``m``: the next token depends on the last ``m`` tokens.

    .. math::

        M(x_{\ell+1} = y \mid x^\ell) =
        \begin{cases}
            T[x_{\ell-m+1}, \dots, x_\ell, y] & \ell \ge m, \\
            I_\ell[x_1, \dots, x_\ell, y] & \ell < m.
        \end{cases}

    Parameters
    ----------
    transition : array_like of float, shape ``(V,) * (m + 1)``
        Transition table; its last axis holds distributions. ``m = ndim - 1``
        (``m = 0`` is a memoryless source).
    initial : sequence of m array_like, optional
        ``initial[l]`` (shape ``(V,) * (l + 1)``) is the conditional law of
        token ``l + 1`` for the first ``m`` tokens, as in :class:`TableModel`.
        Default: the uniform law for each of the first ``m`` tokens.

    Attributes
    ----------
    vocab_size, order : int
    transition : read-only ndarray
    initial : tuple of read-only ndarray

    Examples
    --------
    >>> from otspec.models import MarkovModel
    >>> m = MarkovModel([[0.9, 0.1], [0.3, 0.7]], initial=[[1.0, 0.0]])
    >>> m.next_dist(()).tolist(), m.next_dist((0, 1)).tolist()
    ([1.0, 0.0], [0.3, 0.7])
    """

    max_len = None  # unbounded
    #: Every law returned is a read-only view of the tables, which nothing writes (see :class:`Model`).
    fresh_laws = True

    def __init__(self, transition, *, initial=None):
        T = _validate_table_rows(transition, "transition")
        V = T.shape[-1]
        if T.shape != (V,) * T.ndim:
            raise ValueError(f"`transition` must have shape (V,)*(m+1), got {T.shape}")
        m = T.ndim - 1
        if initial is None:
            init = []
            for ell in range(m):
                u = np.full((V,) * (ell + 1), 1.0 / V)
                u.setflags(write=False)
                init.append(u)
        else:
            if not sequence_like(initial):  # a 0-d array: len() raised
                raise TypeError(f"`initial` must be a sequence of m={m} tables or None, got {type(initial).__name__}")
            if len(initial) != m:
                raise ValueError(f"`initial` must hold m={m} tables, got {len(initial)}")
            init = []
            for ell, t in enumerate(initial):
                t = _validate_table_rows(t, f"initial[{ell}]")
                if t.shape != (V,) * (ell + 1):
                    raise ValueError(f"`initial[{ell}]` must have shape {(V,) * (ell + 1)}, got {t.shape}")
                init.append(t)
        self.transition = T
        self.initial = tuple(init)
        self.order = int(m)
        self.vocab_size = int(V)
        _mark_checked(self, self.transition, *self.initial)

    def next_dist(self, prefix: tuple[int, ...]) -> np.ndarray:
        """Conditional law of the next token after ``prefix``."""
        prefix = tuple(prefix)
        if len(prefix) < self.order:
            return self.initial[len(prefix)][prefix]
        if self.order == 0:
            return self.transition
        return self.transition[prefix[len(prefix) - self.order:]]

    def __repr__(self) -> str:
        return f"MarkovModel(vocab_size={self.vocab_size}, order={self.order})"


# ---------------------------------------------------------------------------
# random constructors
# ---------------------------------------------------------------------------


def _concentration(c) -> float:
    if isinstance(c, bool) or not isinstance(c, numbers.Real):
        raise TypeError(f"`concentration` must be a positive real number, got {type(c).__name__}")
    c = float(c)
    if not (np.isfinite(c) and c > 0):
        raise ValueError(f"`concentration` must be a positive finite number, got {c!r}")
    return c


def _dirichlet(gen: np.random.Generator, V: int, shape: tuple[int, ...], c: float) -> np.ndarray:
    # Dirichlet(c, ..., c) rows by normalised gammas; tiny concentrations can
    # underflow every gamma of a row to 0, which we resample as a point mass.
    g = gen.gamma(c, size=shape + (V,))
    s = g.sum(axis=-1, keepdims=True)
    bad = (s[..., 0] <= 0)
    if np.any(bad):
        idx = gen.integers(V, size=int(bad.sum()))
        rows = np.zeros((int(bad.sum()), V))
        rows[np.arange(rows.shape[0]), idx] = 1.0
        g[bad] = rows
        s = g.sum(axis=-1, keepdims=True)
    return g / s


def _restrict_support(gen: np.random.Generator, rows: np.ndarray, support: int) -> np.ndarray:
    """Keep ``support`` uniformly chosen tokens of every row (exact zeros elsewhere), renormalised."""
    V = rows.shape[-1]
    if support >= V:
        return rows
    keys = gen.random(rows.shape)
    keep = np.argsort(keys, axis=-1)[..., :support]
    out = np.zeros_like(rows)
    np.put_along_axis(out, keep, np.take_along_axis(rows, keep, axis=-1), axis=-1)
    s = out.sum(axis=-1, keepdims=True)
    # a row whose kept gammas all underflowed: a point mass on its first kept token
    empty = s[..., 0] <= 0
    if np.any(empty):
        first = keep[empty][:, 0]
        out[empty] = np.eye(V)[first]
        s = out.sum(axis=-1, keepdims=True)
    return out / s


def random_table_model(V: int, max_len: int, *, concentration: float = 1.0, support: int | None = None,
                       rng=None) -> TableModel:
    r"""A :class:`TableModel` whose every conditional is drawn from :math:`\mathrm{Dir}(c\,\mathbf 1_V)`.

    With ``support=s`` each conditional is a Dirichlet draw on ``s`` tokens
    chosen uniformly at random (exact zeros elsewhere): support-limited models,
    on which a verifier's handling of zero-probability tokens is tested (the
    boundary-coin phase of :func:`otspec.testing.check_block_sampler` can only
    fail where the target has zeros).

    Parameters
    ----------
    V : int
        Vocabulary size (>= 1).
    max_len : int
        Longest sequence the model generates (>= 1); it has
        :math:`\sum_{\ell < \text{max\_len}} V^\ell` conditionals.
    concentration : float, keyword-only
        Dirichlet concentration :math:`c > 0`: small values give peaked
        conditionals (near point masses), large values near-uniform ones.
    support : int or None, keyword-only
        Tokens of positive probability per conditional, in ``[1, V]``; None: all ``V``.
    rng : numpy.random.Generator, int or None, keyword-only

    Returns
    -------
    TableModel
        ``max_len`` conditional tables, each row drawn independently.

    Raises
    ------
    ValueError
        ``V`` or ``max_len`` < 1, ``concentration`` <= 0, ``support`` outside
        ``[1, V]``, or more than ``MAX_ENUMERATION`` table entries.

    Examples
    --------
    >>> from otspec.models import random_table_model
    >>> m = random_table_model(3, 2, concentration=0.5, rng=0)
    >>> m.vocab_size, m.max_len, m.tables[1].shape
    (3, 2, (3, 3))
    >>> sparse = random_table_model(4, 2, support=2, rng=0)
    >>> [int(n) for n in (sparse.tables[1] > 0).sum(axis=-1).ravel()]
    [2, 2, 2, 2]
    """
    V = validate_positive_int(V, "V")
    max_len = validate_positive_int(max_len, "max_len")
    c = _concentration(concentration)
    s = V if support is None else validate_positive_int(support, "support")
    if s > V:
        raise ValueError(f"`support` must lie in [1, V={V}], got {s}")
    check_enumeration(V, max_len, MAX_ENUMERATION, what="table entries", length_name="max_len",
                      limit_name="MAX_ENUMERATION")
    gen = as_rng(rng)
    return TableModel([_restrict_support(gen, _dirichlet(gen, V, (V,) * ell, c), s) for ell in range(max_len)])


def random_markov_model(V: int, order: int = 1, *, concentration: float = 1.0, rng=None) -> MarkovModel:
    r"""A :class:`MarkovModel` of the given order with Dirichlet transition and initial tables.

    Parameters
    ----------
    V : int
        Vocabulary size (>= 1).
    order : int
        Markov order ``m`` (>= 0).
    concentration : float, keyword-only
        Dirichlet concentration :math:`c > 0` of every row.
    rng : numpy.random.Generator, int or None, keyword-only

    Returns
    -------
    MarkovModel
        Initial tables and the order-``m`` transition tensor of shape ``(V,) * (m + 1)``.

    Raises
    ------
    ValueError
        ``V < 1``, ``order < 0``, ``concentration <= 0``.
    TypeError
        A bad ``rng``.

    Examples
    --------
    >>> from otspec.models import random_markov_model
    >>> m = random_markov_model(2, 2, rng=1)
    >>> m.order, m.transition.shape
    (2, (2, 2, 2))
    """
    V = validate_positive_int(V, "V")
    order = validate_positive_int(order, "order", minimum=0)
    c = _concentration(concentration)
    check_enumeration(V, order + 1, MAX_ENUMERATION, what="transition entries", length_name="(`order`+1)",
                      limit_name="MAX_ENUMERATION")
    gen = as_rng(rng)
    initial = [_dirichlet(gen, V, (V,) * ell, c) for ell in range(order)]
    return MarkovModel(_dirichlet(gen, V, (V,) * order, c), initial=initial)


def random_memoryless_model(V: int, *, concentration: float = 1.0, rng=None) -> MemorylessModel:
    r"""A :class:`MemorylessModel` with a :math:`\mathrm{Dir}(c\,\mathbf 1_V)` distribution.

    Parameters
    ----------
    V : int
        Vocabulary size (>= 1).
    concentration : float, keyword-only
        Dirichlet concentration :math:`c > 0`.
    rng : numpy.random.Generator, int or None, keyword-only
        Source of randomness.

    Returns
    -------
    MemorylessModel
        The same law :math:`\sim \mathrm{Dir}(c\,\mathbf 1_V)` at every position.

    Raises
    ------
    ValueError
        ``V < 1``, ``V > MAX_ENUMERATION`` (2,000,000, the limit of the
        other random models' tables; checked before any allocation) or
        ``concentration <= 0``.
    TypeError
        A bad ``rng``.

    Examples
    --------
    >>> from otspec.models import random_memoryless_model
    >>> random_memoryless_model(4, rng=0).vocab_size
    4
    """
    V = validate_positive_int(V, "V")
    if V > MAX_ENUMERATION:  # before the allocation (a huge V hung in the Dirichlet draw or failed inside numpy)
        raise ValueError(f"`V`={V} probabilities exceed the stated limit `MAX_ENUMERATION`={MAX_ENUMERATION} "
                         f"of the random models' tables")
    c = _concentration(concentration)
    return MemorylessModel(_dirichlet(as_rng(rng), V, (), c))


# ---------------------------------------------------------------------------
# exact joint probabilities
# ---------------------------------------------------------------------------


def sequence_probability(model, seq) -> float:
    r"""Exact joint probability :math:`M(x^\ell) = \prod_{j} M(x_j \mid x^{j-1})`.

    Parameters
    ----------
    model : Model
    seq : sequence of int
        Token ids in ``[0, V)``; the empty sequence has probability 1.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Ids outside ``[0, V)`` or conditionals that are not distributions.
    TypeError
        ``model`` not a model, ``seq`` not a sequence of int.

    Examples
    --------
    >>> from otspec.models import MemorylessModel, sequence_probability
    >>> sequence_probability(MemorylessModel([0.25, 0.75]), (1, 1, 0))
    0.140625
    """
    V = validate_model(model, "model")
    seq = validate_sequence(seq, V, "seq")
    prob = 1.0
    for j in range(len(seq)):
        prob *= float(next_law(model, seq[:j], V, "model")[seq[j]])
    return prob


def _check_length(model, length: int, name: str) -> None:
    ml = getattr(model, "max_len", None)
    if ml is not None and length > ml:
        raise ValueError(
            f"`{name}` generates sequences of at most max_len={ml} tokens, but length {length} is needed"
        )


def conditional_tables(model, length: int, *, name: str = "model", max_entries: int = MAX_ENUMERATION,
                       length_name: str = "length"):
    r"""Every conditional of ``model`` for prefixes shorter than ``length``, validated.

    Parameters
    ----------
    model : Model
    length : int
        Number of tokens (>= 1): prefixes of length ``0 .. length - 1`` are queried.
    name : str, keyword-only
        Name used in error messages.
    max_entries : int, keyword-only
        Refuse (ValueError, before any call to ``next_dist``) when
        ``V**length`` exceeds it.
    length_name : str, keyword-only
        The caller's name of ``length`` in error messages (``"L"`` for a block length).

    Returns
    -------
    list of read-only ndarray
        ``out[l]`` of shape ``(V,) * (l + 1)``: ``out[l][x^l] = M(. | x^l)``
        (the format of :class:`TableModel`).

    Raises
    ------
    ValueError
        Too many entries, a row that is not a distribution, or a model whose
        ``max_len`` is shorter than ``length``.

    Examples
    --------
    >>> from otspec.models import MemorylessModel, conditional_tables
    >>> [t.shape for t in conditional_tables(MemorylessModel([0.5, 0.5]), 3)]
    [(2,), (2, 2), (2, 2, 2)]
    """
    V = validate_model(model, name)
    length = validate_positive_int(length, length_name)
    max_entries = validate_positive_int(max_entries, "max_entries")
    check_enumeration(V, length, max_entries, length_name=length_name)
    _check_length(model, length, name)
    out = []
    for ell in range(length):
        t = np.empty((V,) * ell + (V,))
        for prefix in itertools.product(range(V), repeat=ell):
            t[prefix] = next_law(model, prefix, V, name)
        t.setflags(write=False)
        out.append(t)
    return out


def joint_law(model, length: int, *, max_entries: int = MAX_ENUMERATION) -> np.ndarray:
    r"""The joint law :math:`M(x^\ell)` of the first ``length`` tokens as a ``(V,) * length`` array.

    Parameters
    ----------
    model : Model
    length : int
        Number of tokens (>= 1).
    max_entries : int, keyword-only
        Refuse when ``V**length`` exceeds it.

    Returns
    -------
    ndarray of float64, shape ``(V,) * length``
        Sums to 1.

    Raises
    ------
    ValueError
        ``length < 1``, ``V**length`` above ``max_entries``, or conditionals that
        are not distributions.
    TypeError
        ``model`` not a model.

    Examples
    --------
    >>> from otspec.models import MemorylessModel, joint_law
    >>> joint_law(MemorylessModel([0.25, 0.75]), 2).tolist()
    [[0.0625, 0.1875], [0.1875, 0.5625]]
    """
    tabs = conditional_tables(model, length, name="model", max_entries=max_entries)
    return joint_from_tables(tabs)


def joint_from_tables(tables) -> np.ndarray:
    r"""Joint law of ``len(tables)`` tokens from conditional tables (TableModel format).

    Parameters
    ----------
    tables : sequence of array_like of float
        ``tables[l]`` of shape ``(V,) * (l + 1)``: the law of token ``l + 1``
        given the first ``l`` (the format of :class:`TableModel` and of
        :func:`conditional_tables`).

    Returns
    -------
    ndarray of float64, shape ``(V,) * len(tables)``
        :math:`M(x_1, \dots, x_m) = \prod_l T_l[x_1, \dots, x_{l+1}]`.

    Raises
    ------
    TypeError
        ``tables`` not a non-empty sequence of real arrays.
    ValueError
        A table not of shape ``(V,) * (l + 1)``, or with a negative or non-finite entry.

    Examples
    --------
    >>> from otspec.models import joint_from_tables
    >>> joint_from_tables([[0.5, 0.5], [[1.0, 0.0], [0.25, 0.75]]]).tolist()
    [[0.5, 0.0], [0.125, 0.375]]
    """
    if not sequence_like(tables) or len(tables) == 0:  # a 0-d array: len() raised; a dict: its keys were read
        raise TypeError(f"`tables` must be a non-empty sequence of conditional tables, got {type(tables).__name__}")
    # the entries as given (no flush, no rescale: the joint of validated tables to the bit), checked for type,
    # shape, finiteness and sign: a NaN, a complex or a text entry is refused, not multiplied through
    tabs = [_float_input(t, f"tables[{ell}]", "an array_like of floats")[0] for ell, t in enumerate(tables)]
    V = tabs[0].shape[-1] if tabs[0].ndim else 0
    for ell, t in enumerate(tabs):
        if V == 0 or t.shape != (V,) * (ell + 1):
            raise ValueError(f"`tables[{ell}]` must have shape (V,) * {ell + 1} with V >= 1, got {t.shape}")
        if not (np.all(np.isfinite(t)) and t.min() >= 0):
            raise ValueError(f"`tables[{ell}]` must hold finite non-negative probabilities")
    J = tabs[0].copy()
    for ell in range(1, len(tabs)):
        J = J[..., None] * tabs[ell]
    return J
