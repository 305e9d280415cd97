r"""A tiny, picklable draft/target pair for examples, tests and distributed runs (no downloads)."""

from __future__ import annotations

import numpy as np

from ..decoding import CallableLM

__all__ = ["BigramLogits", "toy_pair"]


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
    seed : int, keyword-only
    closeness : float in (0, 1], keyword-only

    Returns
    -------
    draft, target : CallableLM

    Raises
    ------
    ValueError
        ``vocab_size < 2`` or ``closeness`` outside ``(0, 1]``.

    Examples
    --------
    >>> from otspec.profile import toy_pair
    >>> draft, target = toy_pair(4, seed=1)
    >>> draft.vocab_size, target.vocab_size
    (4, 4)
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"`vocab_size` must be an integer >= 2, got {vocab_size!r}")
    if not 0.0 < float(closeness) <= 1.0:
        raise ValueError(f"`closeness` must lie in (0, 1], got {closeness!r}")
    rng = np.random.default_rng(seed)
    wq = rng.standard_normal((vocab_size, vocab_size))
    wp = wq + (1.0 - closeness) / closeness * rng.standard_normal((vocab_size, vocab_size))
    return (CallableLM(BigramLogits(wp), vocab_size, name=f"toy-draft-V{vocab_size}-s{seed}-c{closeness:g}"),
            CallableLM(BigramLogits(wq), vocab_size, name=f"toy-target-V{vocab_size}-s{seed}"))
