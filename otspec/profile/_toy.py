r"""A tiny, picklable draft/target pair for examples, tests and distributed runs (no downloads)."""

from __future__ import annotations

import numpy as np

from .._validation import validate_positive_int, validate_probability, validate_seed
from ..decoding import CallableLM

__all__ = ["BigramLogits", "toy_pair", "MAX_TOY_VOCAB", "MIN_TOY_CLOSENESS"]

#: Largest ``vocab_size`` of :func:`toy_pair`: the pair is two ``V x V`` float64 tables (512 MiB each at the
#: limit, and one more of that size while they are drawn), checked before anything is allocated.
MAX_TOY_VOCAB = 8192
#: Smallest closeness of a toy draft: its logits are the target's plus ``(1 - c) / c`` times standard normals, which
#: overflow to infinite logits (no law) for a closeness near the smallest doubles.
MIN_TOY_CLOSENESS = 1e-300


class BigramLogits:
    r"""``ids (B, T) -> logits (B, T, V)`` of a bigram model: the logits of position ``t`` depend on ``ids[:, t]`` only.

    .. math::

        \ell_t = W[x_t], \qquad W \in \mathbb R^{V \times V}.

    Picklable (a plain table), so worker processes can rebuild the model.
    """

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float64)

    def __call__(self, ids):
        import torch

        return torch.as_tensor(self.table)[ids]


def toy_pair(vocab_size: int = 6, *, seed: int = 0, closeness: float = 0.5):
    r"""A bigram draft and target on ``vocab_size`` tokens, as :class:`otspec.decoding.CallableLM`.

    .. math::

        W_q \sim \mathcal N(0, 1)^{V \times V}, \qquad
        W_p = W_q + \frac{1 - c}{c}\, E, \ E \sim \mathcal N(0, 1)^{V \times V},

    so ``closeness`` ``c`` near 1 gives a draft close to the target.

    Parameters
    ----------
    vocab_size : int
        In ``[2, MAX_TOY_VOCAB]`` (8192).
    seed : int, keyword-only
        A non-negative integer (Python or numpy).
    closeness : float in [MIN_TOY_CLOSENESS, 1], keyword-only

    Returns
    -------
    draft, target : CallableLM

    Raises
    ------
    ValueError
        ``vocab_size`` outside ``[2, MAX_TOY_VOCAB]``, a negative ``seed`` or ``closeness`` outside
        ``[MIN_TOY_CLOSENESS, 1]``.
    TypeError
        ``vocab_size`` or ``seed`` not an integer, ``closeness`` not a real number.

    Examples
    --------
    >>> from otspec.profile import toy_pair
    >>> draft, target = toy_pair(4, seed=1)
    >>> draft.vocab_size, target.vocab_size
    (4, 4)
    """
    vocab_size = validate_positive_int(vocab_size, "vocab_size", minimum=2)
    if vocab_size > MAX_TOY_VOCAB:  # before the tables: 2**63 would reach numpy's own error, 10**5 eat 80 GB
        raise ValueError(f"`vocab_size` must be at most MAX_TOY_VOCAB = {MAX_TOY_VOCAB} (two V x V float64 "
                         f"tables), got {vocab_size}")
    seed = validate_seed(seed, "seed")
    validate_probability(closeness, "closeness", low_open=True)
    if closeness < MIN_TOY_CLOSENESS:  # (1 - c) / c would overflow the draft's logits to infinities (no law)
        raise ValueError(f"`closeness` must be at least MIN_TOY_CLOSENESS = {MIN_TOY_CLOSENESS:g}, got {closeness!r}")
    rng = np.random.default_rng(seed)
    wq = rng.standard_normal((vocab_size, vocab_size))
    wp = wq + (1.0 - closeness) / closeness * rng.standard_normal((vocab_size, vocab_size))
    return (CallableLM(BigramLogits(wp), vocab_size, name=f"toy-draft-V{vocab_size}-s{seed}-c{closeness:g}"),
            CallableLM(BigramLogits(wq), vocab_size, name=f"toy-target-V{vocab_size}-s{seed}"))
