r"""check_block_sampler: certify or refute the losslessness of any block verifier.

The harness draws a block :math:`X^L` from the draft model, hands it to the
user's ``step``, completes the returned tokens (the accepted prefix plus the
correction or bonus token: 1 to L + 1 tokens) with the target model up to
length L + 1, and tests the law of the completed sequence against the target
model's joint law:

.. math::

    X^L \sim M_p,\quad Y = \mathrm{step}(X^L, \mathrm{rng}),\quad
    Z = (Y, T) \text{ with } T \sim M_q(\cdot \mid Y),\qquad
    H_0:\ P(Z = z) = M_q(z)\ \ \forall z \in \Omega^{L+1},

losslessness in the form of SpecTr's Theorem 3 (Sun et al., "SpecTr: Fast
Speculative Decoding via Optimal Transport", NeurIPS 2023): a verifier is
valid when the output, continued by the target, follows the target.
With ``k > 1`` the step receives ``k`` i.i.d. draft blocks
:math:`X^{L,1}, \dots, X^{L,k} \sim M_p` instead of one (multi-draft block
verification, Sun et al., arXiv:2403.10444); the test is unchanged.

Notation: the draft model is ``p`` (``draft``), the target ``q`` (``target``).
"""

from __future__ import annotations

import numbers

import numpy as np

from .._validation import as_rng, validate_at_most, validate_bool, validate_positive_int
from ..models import MAX_ENUMERATION, conditional_tables, joint_from_tables, size_exceeds, size_text, validate_model_pair
from ._sampler import (
    MAX_HARNESS_DRAFTS,
    SamplerCheck,
    StepError,
    Violation,
    _call,
    _call_batch,
    _chunk,
    _coin_rngs,
    _describe,
    _finish,
    _inverse_cdf,
    _phases,
    _plan,
    _to_numpy,
    _validate_step,
)

__all__ = ["check_block_sampler"]


class _Tables:
    """Cumulative conditional tables, flattened by prefix: ``cum[i]`` has shape ``(V**i, V)``."""

    def __init__(self, tables):
        self.cum = []
        self.last = []
        for t in tables:
            V = t.shape[-1]
            flat = t.reshape(-1, V)
            self.cum.append(np.cumsum(flat, axis=1))
            pos = flat > 0
            self.last.append(V - 1 - np.argmax(pos[:, ::-1], axis=1))

    def extend(self, seqs: np.ndarray, idx: np.ndarray, start: int, stop: int, gen) -> None:
        """Fill ``seqs[:, start:stop]`` token by token; ``idx`` is the flat index of ``seqs[:, :start]``."""
        V = self.cum[0].shape[-1]
        for j in range(start, stop):
            tok = _inverse_cdf(self.cum[j][idx], self.last[j][idx], gen.random(idx.shape[0]))
            seqs[:, j] = tok
            idx *= V
            idx += tok

    def complete(self, seqs: np.ndarray, lengths: np.ndarray, gen) -> np.ndarray:
        """Complete each row's first ``lengths`` tokens to the full width, in place; return the C-order cells."""
        V, width = self.cum[0].shape[-1], seqs.shape[1]
        for m in range(1, width):  # outputs of length m
            short = np.flatnonzero(lengths == m)
            if short.size:
                part = seqs[short]
                idx = np.ravel_multi_index(part[:, :m].T, (V,) * m) if m > 1 else part[:, 0].copy()
                self.extend(part, idx, m, width, gen)
                seqs[short] = part
        return np.ravel_multi_index(seqs.T, (V,) * width)


def _output(out, L: int, V: int, shown, phase: str) -> tuple[int, ...]:
    """A non-batched block step's output: 1 to L + 1 token ids in [0, V)."""
    if isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
        raise StepError(
            f"`step` must return a sequence of 1 to L+1={L + 1} token ids, got {_describe(out)} "
            f"({type(out).__name__}) for block {shown} ({phase} phase)",
            drafts=shown, phase=phase,
        )
    arr = _to_numpy(out) if not isinstance(out, (list, tuple)) else None
    items = list(out) if arr is None else arr.reshape(-1).tolist() if arr.ndim == 1 else None
    if items is None or not 1 <= len(items) <= L + 1:
        n = len(items) if items is not None else f"shape {arr.shape}"
        raise StepError(
            f"`step` must return 1 to L+1={L + 1} token ids, got {n} for block {shown} ({phase} phase)",
            drafts=shown, phase=phase,
        )
    toks = []
    for t in items:
        if hasattr(t, "shape") and tuple(t.shape) == ():
            t = _to_numpy(t)[()]
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral) or not 0 <= int(t) < V:
            raise StepError(
                f"`step` returned {_describe(out)} for block {shown}: every entry must be a token id "
                f"in [0, {V}) ({phase} phase)",
                drafts=shown, phase=phase,
            )
        toks.append(int(t))
    return tuple(toks)


def _row(X: np.ndarray, i: int) -> tuple:
    """Row ``i`` of the drafts as handed to ``step``: a block of ints, or ``k`` blocks (tuples of ints)."""
    r = X[i].tolist()
    return tuple(tuple(b) for b in r) if X.ndim == 3 else tuple(r)


def _batch_outputs(out, X: np.ndarray, V: int, phase: str) -> tuple[np.ndarray, np.ndarray]:
    """A batched block step's outputs: ``(B, L + 1)`` array padded with -1, or B sequences."""
    B, L = X.shape[0], X.shape[-1]
    if isinstance(out, (list, tuple)) and len(out) == B and all(
        isinstance(o, (list, tuple)) or getattr(o, "ndim", 0) == 1 for o in out
    ):
        seqs = np.full((B, L + 1), -1, dtype=np.int64)
        for i, o in enumerate(out):
            t = _output(o, L, V, _row(X, i), phase)
            seqs[i, : len(t)] = t
    else:
        arr = _to_numpy(out)
        if arr.shape != (B, L + 1) or arr.dtype.kind not in "iu":
            raise StepError(
                f"batched `step` must return a ({B}, L+1={L + 1}) integer array padded with -1 (or {B} "
                f"token sequences) for blocks of shape {X.shape}, got {type(out).__name__} of shape "
                f"{arr.shape} and dtype {arr.dtype} ({phase} phase)",
                drafts=X, phase=phase,
            )
        seqs = arr.astype(np.int64)
    valid = seqs >= 0
    lengths = valid.sum(axis=1)
    bad = ((valid != (np.arange(L + 1)[None, :] < lengths[:, None])) | (seqs >= V)).any(axis=1) | (lengths < 1)
    if bad.any():
        i = int(np.argmax(bad))
        raise StepError(
            f"`step` returned {seqs[i].tolist()} for block {_row(X, i)} (row {i}): an "
            f"output is 1 to L+1={L + 1} token ids in [0, {V}) followed by -1 padding ({phase} phase)",
            drafts=_row(X, i), phase=phase,
        )
    return seqs, lengths


def check_block_sampler(step, draft, target, L, *, k=1, n_samples=None, tv=0.02, batched=False,
                        boundary_coins=False, alpha_fail=1e-4, max_samples=None, rng=None) -> SamplerCheck:
    r"""Test whether a block verifier ``step`` keeps the target model's law of L + 1 tokens.

    .. math::

        X^L \sim M_p,\quad Z = \big(\mathrm{step}(X^L),\ T \sim M_q(\cdot \mid \mathrm{step}(X^L))\big)
        \in \Omega^{L+1},\qquad H_0:\ Z \sim M_q,

    (with ``k > 1``: :math:`X^{L,1}, \dots, X^{L,k}` i.i.d. from :math:`M_p`
    handed to ``step`` together), tested by Pearson's :math:`\chi^2` over the :math:`V^{L+1}` sequences
    (sparse ones pooled) at false-failure rate ``alpha_fail``; an output of
    target probability zero fails outright. SpecTr's losslessness (Sun et al.,
    NeurIPS 2023, Theorem 3): continued by the target, the verifier's output
    must follow the target.

    Parameters
    ----------
    step : callable
        ``step(block, rng) -> tokens``: ``block`` is a tuple of ``L`` ints drawn
        from ``draft``; it returns the accepted prefix followed by the
        correction or bonus token (1 to L + 1 ints; a list, tuple, array or
        tensor). With ``batched=True``: ``block`` is a read-only ``(B, L)``
        int64 array and ``step`` returns a ``(B, L + 1)`` integer array padded
        with -1 after each output (or a list of B sequences).
    draft, target : otspec.models.Model
        Draft and target models on one vocabulary (``vocab_size``,
        ``next_dist(prefix)``).
    L : int
        Block length (>= 1).
    k : int, keyword-only
        Number of i.i.d. draft blocks per trial (>= 1, default 1, at most
        :data:`otspec.testing.MAX_HARNESS_DRAFTS`). With
        ``k > 1``, ``step(drafts, rng)`` receives a tuple of ``k`` blocks
        (tuples of ``L`` ints) drawn independently from ``draft`` -- the
        calling convention of
        :meth:`otspec.block.MultiDraftPlanVerifier.verify` -- or, with
        ``batched=True``, a read-only ``(B, k, L)`` int64 array; the output
        and the test are as for one block. ``k = 1`` is the one-block
        harness, draw for draw.
    n_samples, tv, batched, boundary_coins, alpha_fail, max_samples, rng : keyword-only
        As in :func:`~otspec.testing.check_sampler`.

    Returns
    -------
    SamplerCheck
        Cells are the :math:`V^{L+1}` sequences in C order (``law`` and
        ``target_law`` have that length).

    Raises
    ------
    TypeError, ValueError
        As in :func:`~otspec.testing.check_sampler`; also models that are
        not models, of different vocabularies, or ``V**(L+1)`` above
        :data:`otspec.models.MAX_ENUMERATION` (2e6) sequences.
    StepError
        ``step`` raised (with the block or blocks that triggered it) or returned
        something that is not 1 to L + 1 tokens in range.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, Theorem 3 (the decoded tokens completed by
       the target follow the target's joint law).

    Examples
    --------
    >>> from otspec.block import make_verifier
    >>> from otspec.models import random_table_model
    >>> from otspec.testing import check_block_sampler
    >>> draft, target = random_table_model(3, 3, rng=1), random_table_model(3, 3, rng=2)
    >>> v = make_verifier(draft, target, 2, "block")
    >>> res = check_block_sampler(lambda b, rng: v.verify(b, rng=rng).output, draft, target, 2,
    ...                           tv=0.1, rng=0)
    >>> res.passed, res.n_samples
    (True, 1876)
    """
    step = _validate_step(step)
    V = validate_model_pair(draft, target)
    L = validate_positive_int(L, "L")
    k = validate_at_most(validate_positive_int(k, "k"), "k", MAX_HARNESS_DRAFTS, "MAX_HARNESS_DRAFTS",
                         "test larger k on a verifier's own law (its exact acceptance) instead")
    batched = validate_bool(batched, "batched")
    boundary_coins = validate_bool(boundary_coins, "boundary_coins")
    if size_exceeds(V, L + 1, MAX_ENUMERATION):  # no big integer V**(L+1): L = 10**8 answered at once
        raise ValueError(
            f"check_block_sampler tests the law of V**(L+1) = {V}**{L + 1} = {size_text(V, L + 1)} sequences, above "
            f"the stated limit otspec.models.MAX_ENUMERATION={MAX_ENUMERATION}; lower `L` or the vocabulary"
        )
    cs = conditional_tables(draft, L, name="draft")
    cb = conditional_tables(target, L + 1, name="target")
    law = joint_from_tables(cb).reshape(-1)
    law.setflags(write=False)
    N, tv, alpha_fail = _plan(law, n_samples, tv, alpha_fail, "completed sequences'", max_samples, batched)
    gen = as_rng(rng)
    Ts, Tb = _Tables(cs), _Tables(cb)
    rngs = _coin_rngs(gen, boundary_coins)
    zero = law <= 0
    violation = None

    def run(n, harness_rng, step_rng, phase):
        nonlocal violation
        counts = np.zeros(law.shape[0], dtype=np.int64)
        done = 0
        chunk = _chunk(V * k)  # the inverse CDF compares (B * k, V) rows
        while done < n:
            B = min(chunk, n - done)
            X = np.empty((B * k, L), dtype=np.int64)  # k i.i.d. blocks per trial, trial-major
            Ts.extend(X, np.zeros(B * k, dtype=np.int64), 0, L, harness_rng)
            if k > 1:
                X = X.reshape(B, k, L)
            X.setflags(write=False)
            if batched:
                # (B, k, L) travels flattened to (B, k * L) so a failing row is bisected like one block
                call = step if k == 1 else lambda d, r: step(d.reshape(d.shape[0], k, L), r)
                out = _call_batch(call, X.reshape(B, k * L), step_rng, phase, lambda: step_rng.spawn(1)[0])
                seqs, lengths = _batch_outputs(out, X, V, phase)
            else:
                seqs = np.full((B, L + 1), -1, dtype=np.int64)
                lengths = np.empty(B, dtype=np.int64)
                for i in range(B):
                    b = _row(X, i)
                    t = _output(_call(step, b, step_rng, phase, b), L, V, b, phase)
                    seqs[i, : len(t)] = t
                    lengths[i] = len(t)
            cells = Tb.complete(seqs, lengths, harness_rng)  # with the target model
            if violation is None and zero[cells].any():
                i = int(np.argmax(zero[cells]))
                violation = Violation(phase, _row(X, i), tuple(int(v) for v in seqs[i, : lengths[i]]))
            counts += np.bincount(cells, minlength=law.shape[0])
            done += B
        return counts

    counts, outside_b = _phases(run, N, rngs, zero)
    return _finish(counts, law, n_samples=N, alpha_fail=alpha_fail, outside_b=outside_b,
                   n_boundary=N if boundary_coins else 0, violation=violation, what="completed sequences'",
                   shape=(V,) * (L + 1))
