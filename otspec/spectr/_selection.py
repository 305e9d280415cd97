r"""SpecTr's DraftSelection (Algorithm 3) with any token-level verifier, and one decoding step.

Notation: draft model :math:`\mathcal M_s` (``p`` at a position), target
model :math:`\mathcal M_b` (``q``).
"""

from __future__ import annotations

import numpy as np

from .._validation import as_rng
from .._verifier import sample_from
from ._common import next_dist, resolve_verifier, validate_branching, validate_models, validate_prefix
from ._drafts import DraftSet, prefix_tree_drafts

__all__ = ["draft_selection", "spectr_step"]


def _as_draft_set(drafts) -> DraftSet:
    if isinstance(drafts, DraftSet):
        return drafts
    try:
        return DraftSet(drafts, None)
    except (TypeError, ValueError) as exc:  # the caller's parameter is `drafts` (DraftSet names its `tokens`)
        raise type(exc)(str(exc).replace("`tokens`", "`drafts`", 1)) from None


def first_verifier(draft, target, ks, ctx, n, factory) -> None:
    """Build the verifier of the first position, ``k_1`` drafts from ``M_s(.|ctx)``, before any draft is drawn.

    Its laws do not depend on the drafts, so its size guard (the OTM LP's at a large ``k``, say) refuses before
    the drafting, whose time grows with ``K * L``; the factory memoises it for :func:`_select`. The verifiers of
    later positions depend on the drawn tokens (their contexts and the number of surviving nodes) and are built
    as DraftSelection reaches them.
    """
    factory(next_dist(draft, ctx, n, "draft"), next_dist(target, ctx, n, "target"), ks[0])


def _select(draft, target, ds: DraftSet, factory, ctx, n, gen) -> tuple[int, ...]:
    """Algorithm 3 on the tree nodes (validated inputs)."""
    tokens = ds.tokens
    alive = np.arange(ds.K)
    out: list[int] = []
    for d in range(ds.L):
        stride = ds.stride(d)
        # the draft tokens at this depth are the distinct depth-(d+1) nodes under the
        # surviving leaves: (#surviving nodes) x k_{d+1} i.i.d. draws from M_s(.|ctx)
        node_first_leaf = alive[::stride]
        x = tokens[node_first_leaf, d]
        p = next_dist(draft, ctx, n, "draft")
        q = next_dist(target, ctx, n, "target")
        v = factory(p, q, int(x.shape[0]))
        y = int(v.sample(tuple(int(t) for t in x), rng=gen))
        out.append(y)
        ctx = ctx + (y,)
        alive = alive[tokens[alive, d] == y]
        if alive.shape[0] == 0:
            return tuple(out)  # Y was a correction token: stop
    # every draft position matched: one extra token from M_b (Algorithm 3, line 5)
    out.append(int(sample_from(next_dist(target, ctx, n, "target"), gen)))
    return tuple(out)


def draft_selection(draft, target, drafts, *, verifier="lp", prefix=(), rng=None) -> tuple[int, ...]:
    r"""SpecTr's DraftSelection (Algorithm 3): decode tokens from a draft set with a token-level verifier.

    .. math::

        Y_t \sim \pi_t\big(\cdot \mid z_{1}(t), \dots, z_{|S_t|}(t)\big),
        \quad \pi_t \in \Pi\big(\mathcal M_s(\cdot \mid x^t Y^{t-1})^{\otimes |S_t|},\
        \mathcal M_b(\cdot \mid x^t Y^{t-1})\big),
        \quad S_{t+1} = \{z \in S_t : z(t) = Y_t\},

    stopping when :math:`S_{t+1} = \emptyset` (then :math:`Y_t` is the
    correction token) or after position ``L`` (then one extra token is drawn
    from :math:`\mathcal M_b`). The decoded continuation (1 to ``L + 1``
    tokens), completed by :math:`\mathcal M_b` to any fixed length, is
    distributed exactly as :math:`\mathcal M_b` (SpecTr Theorem 2 in the
    corrected form of the conference version's Theorem 3; see
    :func:`check_lossless`).

    For a prefix tree the drafts verified at position ``t`` are the tree
    *nodes* at depth ``t`` under the surviving nodes (:math:`m \cdot k_t`
    i.i.d. draws when ``m`` nodes survive), not the leaves with their
    repetitions: leaves that share a node share its token and are not
    independent, so a plan for :math:`\mathcal M_s^{\otimes |S|}` would not
    apply to them. For i.i.d. drafts (branching ``(K, 1, ..., 1)``) nodes and
    leaves coincide and this is Algorithm 3 verbatim.

    Parameters
    ----------
    draft : model
        The draft model :math:`\mathcal M_s` (``next_dist(prefix) -> (V,)``).
    target : model
        The target model :math:`\mathcal M_b`, same vocabulary.
    drafts : DraftSet or (K, L) array_like of int
        The draft set; a plain array is read as ``K`` i.i.d. sequences.
    verifier : {"lp", "optimal", "kseq", "multiround"}, callable or VerifierFactory, keyword-only
        The token-level plan at each position (see
        :func:`otspec.spectr.resolve_verifier`); a callable is
        ``(p, q, k) -> Verifier``.
    prefix : sequence of int, keyword-only
        The context :math:`x^t` the drafts continue.
    rng : numpy.random.Generator, int or None, keyword-only
        Source of randomness.

    Returns
    -------
    tuple of int
        The decoded tokens :math:`Y^\tau`, :math:`1 \le \tau \le L + 1`
        (accepted draft tokens, then a correction or bonus token).

    Raises
    ------
    ValueError, TypeError
        Models on different vocabularies, draft tokens outside the
        vocabulary, an unknown verifier name, or a verifier built for the
        wrong number of drafts.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, §7, Algorithm 3, Theorem 2; Appendix D.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import draft_selection
    >>> draft, target = MemorylessModel([1.0, 0.0]), MemorylessModel([1.0, 0.0])
    >>> draft_selection(draft, target, [[0, 0, 0]], verifier="lp", rng=0)
    (0, 0, 0, 0)
    """
    n = validate_models(draft, target)
    ds = _as_draft_set(drafts)
    if np.any(ds.tokens >= n):
        raise ValueError(f"`drafts` must hold token ids in [0, {n}), got maximum {int(ds.tokens.max())}")
    ctx = validate_prefix(prefix, n)
    factory = resolve_verifier(verifier)
    return _select(draft, target, ds, factory, ctx, n, as_rng(rng))


def spectr_step(draft, target, k, L, *, verifier="lp", branching=None, prefix=(), rng=None) -> tuple[int, ...]:
    r"""One SpecTr iteration: sample a draft set from :math:`\mathcal M_s`, then run DraftSelection.

    .. math::

        S \sim \text{i.i.d. sequences (eq. 7) or a prefix tree (Alg. 4)},
        \qquad Y^\tau = \mathrm{DraftSelection}(x^t, L, S).

    Parameters
    ----------
    draft, target : model
        Draft :math:`\mathcal M_s` and target :math:`\mathcal M_b` models.
    k : int
        Number of draft sequences, ``>= 1``.
    L : int
        Draft length, ``>= 1``.
    verifier : str, callable or VerifierFactory, keyword-only
        As in :func:`draft_selection`.
    branching : sequence of L int or None, keyword-only
        Prefix-tree branching with :math:`\prod k_i = K`; None for i.i.d. drafts.
    prefix : sequence of int, keyword-only
        The context.
    rng : numpy.random.Generator, int or None, keyword-only
        Source of randomness (drafts and verification).

    Returns
    -------
    tuple of int
        The decoded tokens, 1 to ``L + 1`` of them; one target call.

    Raises
    ------
    ValueError, TypeError
        ``K < 1``, ``L < 1``, a branching whose product is not ``K``, and
        the errors of :func:`draft_selection`. The first position's
        verifier (``k_1`` drafts) is built before any draft is drawn, so its
        size refusal (e.g. the OTM LP's at a large ``k``) comes at once.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
       Transport", arXiv:2310.15141, Algorithm 3 (DraftSelection), Algorithm 4 (draft sets via a prefix
       tree).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import spectr_step
    >>> m = MemorylessModel([0.5, 0.5])
    >>> len(spectr_step(m, m, 2, 3, rng=0))  # draft == target: all accepted, plus the bonus
    4
    """
    K = k  # SpecTr's letter for the number of draft sequences
    n = validate_models(draft, target)
    ks = validate_branching(K, L, branching)
    ctx = validate_prefix(prefix, n)
    factory = resolve_verifier(verifier)
    gen = as_rng(rng)
    first_verifier(draft, target, ks, ctx, n, factory)  # its size guard before the drafting
    ds = prefix_tree_drafts(draft, ks, prefix=ctx, rng=gen)
    return _select(draft, target, ds, factory, ctx, n, gen)
