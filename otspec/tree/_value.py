r"""Exact values of tree verifiers on small models: expected accepted tokens, output law, losslessness.

A draft process :math:`D` draws a realised tree :math:`T` from the draft
model :math:`M_s`; a tree verifier emits an accepted root path and one more
token. Averaged over :math:`T`,

.. math::

    \mathbb E[\tau] = \sum_T P_D(T)\, \mathbb E[\tau \mid T],

exact by enumeration of the realised trees (:func:`otspec.tree.enumerate_trees`)
for the sampled processes and from the one tree for the deterministic ones.
Lossless means: the emitted path and token, continued by the target
:math:`M_b` to depth ``max_depth + 1``, have the target's law.

Notation: ``p`` draft law, ``q`` target law at a node; :math:`Q(x_{1:d})` the
target's probability of a path.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._validation import validate_bool, validate_positive_int
from .._verifier import LOSSLESS_TOL, LosslessCheck, validate_tol
from ..models import MAX_ENUMERATION, check_enumeration, validate_model_pair, validate_sequence
from ._process import MAX_TREES, LawCache, _laws_of, as_tree_shape, enumerate_trees, validate_process
from ._verifiers import TreeVerifier, make_tree_verifier

__all__ = ["TreeCheck", "check_lossless", "output_law", "value"]


def _setup(shape, draft, target, process, verifier, prefix):
    V = validate_model_pair(draft, target)
    shape = as_tree_shape(shape, process)
    process = validate_process(process, shape)
    ctx = validate_sequence(prefix, V, "prefix")
    v = make_tree_verifier(verifier)
    _check_reach(draft, target, len(ctx), int(shape.max_depth))
    return V, process, ctx, v, shape


def _check_reach(draft, target, n_prefix: int, depth: int) -> None:
    """Models of bounded length (``max_len``) must reach the tree's leaves: the draft's laws up to depth
    ``depth - 1`` after the prefix, the target's at the leaves too (its next token), or the message names the
    prefix's length and the shape's depth rather than a longer ``prefix`` the caller never gave."""
    for model, name, need in ((draft, "draft", n_prefix + depth), (target, "target", n_prefix + depth + 1)):
        ml = getattr(model, "max_len", None)
        if isinstance(ml, numbers.Integral) and need > ml:
            raise ValueError(f"`{name}` generates sequences of at most max_len={int(ml)} tokens, but `prefix` (length "
                             f"{n_prefix}) and `shape` (depth {depth}) need {need}")


def _refuse_lossy(v: TreeVerifier, process: str, shape) -> None:
    if not v.lossless_for(process, shape):
        extra = ""
        if process in v.processes:
            extra = " on shapes whose siblings have ranks 0..m-1 (this shape skips a rank)"
        raise ValueError(
            f"`verifier`={v.name!r} is lossless only for the draft processes {v.processes}{extra}; got "
            f"process={process!r} (pass allow_lossy=True to measure it anyway)"
        )


def value(shape, draft, target, *, process, verifier, prefix=(), allow_lossy: bool = False,
          max_trees: int = MAX_TREES) -> float:
    r"""Exact expected number of accepted draft tokens of a tree verifier, averaged over the draft process.

    .. math::

        \mathbb E[\tau] = \sum_T P_D(T) \sum_{v \ne 0} P(\text{reach } v \mid T),

    one tree for the deterministic processes (``"topk"``, ``"eagle2"``; no
    enumeration, any vocabulary size), every realised tree otherwise
    (``"iid"``, ``"wor"``: small models only, see ``max_trees``). On a
    deterministic tree every lossless verifier gives at most
    :math:`\sum_{v \ne 0} Q(x_{1:d(v)})`, which ``"target-only"`` attains.

    Parameters
    ----------
    shape : TreeShape, sequence of rank paths or Eagle2Params
    draft, target : Model
        Draft :math:`M_s` and target :math:`M_b` models (``vocab_size``,
        ``next_dist(prefix)``), same vocabulary.
    process : {"iid", "wor", "topk", "eagle2"}, keyword-only
    verifier : str or TreeVerifier, keyword-only
        A tree verifier name (``verifier_names(kind="tree")``: ``"specinfer"``,
        ``"sequoia"``, ``"target-only"``, ``"spectr-tree"``) or an instance.
    prefix : sequence of int, keyword-only
        The context.
    allow_lossy : bool, keyword-only
        Measure a verifier on a process it is not lossless for (refused by default).
    max_trees : int, keyword-only
        Enumeration limit (:func:`otspec.tree.enumerate_trees`).

    Returns
    -------
    float

    Raises
    ------
    TypeError, ValueError
        Bad models, shape, process or verifier; a verifier not lossless for
        the process (the message lists the processes it accepts) unless
        ``allow_lossy``; an enumeration above ``max_trees``.

    References
    ----------
    .. [1] Miao et al., SpecInfer, arXiv:2305.09781, §4; Chen et al., Sequoia,
       arXiv:2402.12374, §3; Li et al., EAGLE-2, arXiv:2406.16858, §4.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import TreeShape, value
    >>> p, q = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])
    >>> value(TreeShape.chains(1, 2), p, q, process="iid", verifier="specinfer")  # 0.75 + 0.75**2
    1.3125
    >>> value(TreeShape([(0,), (1,)]), p, q, process="topk", verifier="target-only")  # q(0) + q(1)
    1.0
    """
    V, process, ctx, v, shape = _setup(shape, draft, target, process, verifier, prefix)
    if not validate_bool(allow_lossy, "allow_lossy"):
        _refuse_lossy(v, process, shape)
    max_trees = validate_positive_int(max_trees, "max_trees")
    trees = enumerate_trees(shape, draft, process=process, prefix=ctx, max_trees=max_trees)
    dl, tl = LawCache(draft, V, ctx, "draft"), LawCache(target, V, ctx, "target")
    terms = []
    for T, w in trees:
        P, Q = _laws_of(T, dl, tl)
        terms.append(w * v.expected_accepted(T, P, Q, validate=False))
    return float(math.fsum(terms))


def _max_depth(shape) -> int:
    return int(shape.max_depth)


def _completed_law(v, trees, dl, tl, V, D):
    """Law of (accepted path, emitted token) completed by the target to D + 1 tokens; E[tau] from the emissions."""
    mass = [np.zeros((V,) * (m + 1)) for m in range(D + 1)]
    acc_terms = []
    for T, w in trees:
        P, Q = _laws_of(T, dl, tl)
        E = v.emission(T, P, Q, validate=False)
        for a, s in enumerate(T.paths()):
            mass[len(s)][s] += w * E[a]
        acc_terms.append(w * float(T.depth @ E.sum(axis=1)))
    law = mass[0]
    for m in range(1, D + 1):
        law = law[..., None] * _conditionals(tl, V, m) + mass[m]
    return law, math.fsum(acc_terms)


def _enumerated(shape, draft, target, process, verifier, prefix, max_trees, max_sequences):
    """Validated inputs, every realised tree and the law caches, the size of the completed table checked first."""
    V, process, ctx, v, shape = _setup(shape, draft, target, process, verifier, prefix)
    max_sequences = validate_positive_int(max_sequences, "max_sequences")
    D = _max_depth(shape)
    check_enumeration(V, D + 1, max_sequences, what="completed sequences", length_name="max_depth + 1",
                      limit_name="max_sequences")
    trees = enumerate_trees(shape, draft, process=process, prefix=ctx, max_trees=max_trees)
    return v, trees, LawCache(draft, V, ctx, "draft"), LawCache(target, V, ctx, "target"), V, D


def _conditionals(tl, V, m):
    """``(V,) * (m + 1)`` table of the model's next-token laws after every ``m``-token path."""
    cond = np.empty((V,) * (m + 1))
    for s in np.ndindex(*(V,) * m):
        cond[s] = tl(tuple(int(x) for x in s))
    return cond


def _target_joint(tl, V, length):
    joint = np.ones(())
    for m in range(length):
        joint = joint[..., None] * _conditionals(tl, V, m)
    return joint


def output_law(shape, draft, target, *, process, verifier, prefix=(), max_trees: int = MAX_TREES,
               max_sequences: int = MAX_ENUMERATION) -> np.ndarray:
    r"""Exact law of the emitted tokens completed by the target to ``max_depth + 1`` tokens.

    .. math::

        R(z) = \sum_T P_D(T) \sum_{a} E_T[a, z_{d(a)+1}]\,
        \mathbb 1[z_{1:d(a)} = x_{1:d(a)}(a)]\,
        M_b(z_{d(a)+2:D+1} \mid z_{1:d(a)+1}),
        \qquad z \in \Omega^{D+1},

    :math:`E_T` the verifier's emission on the realised tree and ``D`` the
    largest depth. A lossless verifier gives :math:`R = M_b`.

    Parameters
    ----------
    shape, draft, target, process, verifier, prefix
        As in :func:`value` (any verifier/process pair is accepted here).
    max_trees : int, keyword-only
    max_sequences : int, keyword-only
        Refuse when ``V**(D + 1)`` exceeds it.

    Returns
    -------
    ndarray of float64, shape ``(V,) * (D + 1)``

    Raises
    ------
    TypeError, ValueError
        As :func:`value`; tables above ``max_sequences``.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.models import MemorylessModel, joint_law
    >>> from otspec.tree import TreeShape, output_law
    >>> p, q = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])
    >>> R = output_law(TreeShape([(0,), (1,)]), p, q, process="iid", verifier="specinfer")
    >>> bool(np.abs(R - joint_law(q, 2)).max() < 1e-15)
    True
    """
    return _completed_law(*_enumerated(shape, draft, target, process, verifier, prefix, max_trees,
                                       max_sequences))[0]


@dataclass(frozen=True, eq=False)
class TreeCheck(LosslessCheck):
    r"""Result of :func:`check_lossless` for a tree verifier (exact enumeration over realised trees).

    The core fields are those of :class:`otspec.LosslessCheck`: ``law`` is
    the emitted tokens' law completed by the target to ``max_depth + 1``
    tokens (shape ``(V,) * (max_depth + 1)``), ``target_law`` the target's
    joint law built from its conditionals alone, ``n_cases`` the number of
    realised trees enumerated.

    Attributes
    ----------
    acceptance : float
        :math:`\mathbb E[\tau]` from the enumerated emissions,
        :math:`\sum_T P(T) \sum_a d(a) \sum_y E_T[a, y]`.
    acceptance_error : float
        ``|acceptance - value(...)|``, the same number by the verifier's
        ``expected_accepted`` (an independent route through the code).
    verifier : str
    process : str
    claimed_lossless : bool
        Whether the verifier claims losslessness for this process and shape.
    """

    acceptance: float
    acceptance_error: float
    verifier: str
    process: str
    claimed_lossless: bool


def check_lossless(verifier, shape, draft, target, *, process, prefix=(), max_trees: int = MAX_TREES,
                   max_sequences: int = MAX_ENUMERATION, tol: float = LOSSLESS_TOL) -> TreeCheck:
    r"""Check exactly whether a tree verifier is lossless on a draft process.

    .. math::

        \max_{z \in \Omega^{D+1}} \big| R(z) - M_b(z \mid \text{prefix}) \big|,

    ``R`` the law of :func:`output_law`: every realised tree enumerated, the
    verifier's exact emission on each, the emitted path and token completed
    by the target. Any verifier and process may be checked (this is how a
    loss is shown: SpecInfer's rule on ``"wor"`` or ``"topk"`` trees).

    Parameters
    ----------
    verifier : str or TreeVerifier
    shape : TreeShape or Eagle2Params
    draft, target : Model
    process : {"iid", "wor", "topk", "eagle2"}, keyword-only
    prefix : sequence of int, keyword-only
    max_trees, max_sequences : int, keyword-only
        Enumeration limits.
    tol : float, keyword-only
        ``passed`` is ``max_error <= tol`` (default :data:`otspec.LOSSLESS_TOL`
        = 1e-9; exact enumerations here land near 1e-16, and the package's
        tests use 1e-12).

    Returns
    -------
    TreeCheck

    Raises
    ------
    TypeError, ValueError
        As :func:`output_law`.

    References
    ----------
    .. [1] Miao et al., SpecInfer, arXiv:2305.09781, §4 (Theorem 4.2: the
       multi-step rule preserves the target's law on i.i.d. token trees).

    Examples
    --------
    >>> from otspec.models import random_markov_model
    >>> from otspec.tree import TreeShape, check_lossless
    >>> d, t = random_markov_model(3, rng=2), random_markov_model(3, rng=12)
    >>> s = TreeShape([(0,), (1,), (0, 0)])
    >>> check_lossless("specinfer", s, d, t, process="iid").passed
    True
    >>> check_lossless("specinfer", s, d, t, process="wor").passed
    False
    """
    tol = validate_tol(tol)
    shape = as_tree_shape(shape, process)
    v, trees, dl, tl, V, D = _enumerated(shape, draft, target, process, verifier, prefix, max_trees, max_sequences)
    return check_enumerated(v, trees, dl, tl, V, D, tol=tol, process=process, shape=shape)


def check_enumerated(v, trees, dl, tl, V: int, D: int, *, tol: float, process: str, shape) -> TreeCheck:
    """The :class:`TreeCheck` of verifier ``v`` on already enumerated ``(tree, probability)`` pairs (the laws
    through the caches ``dl``, ``tl``): the completed law against the target's, and the two routes to E[tau]."""
    law, acceptance = _completed_law(v, trees, dl, tl, V, D)
    ref = _target_joint(tl, V, D + 1)
    direct = math.fsum(w * v.expected_accepted(T, *_laws_of(T, dl, tl), validate=False) for T, w in trees)
    max_error = float(np.max(np.abs(law - ref)))
    return TreeCheck(
        passed=bool(max_error <= tol), max_error=max_error, law=law, target_law=ref, method="enumeration",
        n_cases=len(trees), acceptance=acceptance, acceptance_error=abs(acceptance - direct),
        verifier=v.name, process=process, claimed_lossless=bool(v.lossless_for(process, shape)),
    )
