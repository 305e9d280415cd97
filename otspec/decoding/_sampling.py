r"""Temperature, top-k and top-p, applied identically to the draft and the target."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ._deps import require

torch = require("torch", "otspec.decoding")

__all__ = ["Sampling", "sample_rows"]


@dataclass(frozen=True)
class Sampling:
    r"""How logits become the next-token law, identically for draft and target.

    .. math::

        \pi(x) \propto \exp(\ell_x / T)\ \mathbb 1\{x \in \text{top-}k\}
        \quad\text{then, with top-}p\text{, restricted to the smallest head of mass} \ge p.

    Computed in float64. Top-k keeps every token whose logit is at least the
    ``k``-th largest (ties at the boundary are all kept, so the rule is a
    function of the logits alone); top-p keeps every token whose probability
    is at least that of the token where the descending cumulative mass first
    reaches ``top_p``. The target law that speculative decoding reproduces
    is the *processed* target law.

    Parameters
    ----------
    temperature : float
        ``T > 0`` (sampling is always asked for; greedy decoding is not offered).
    top_k : int or None
        Keep the ``top_k`` largest logits (``>= 1``), or all.
    top_p : float or None
        Nucleus mass in ``(0, 1]``, or no nucleus truncation.

    Raises
    ------
    ValueError, TypeError
        ``temperature <= 0`` or not finite, ``top_k < 1``, ``top_p`` outside ``(0, 1]``.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import Sampling
    >>> s = Sampling(temperature=1.0, top_k=2)
    >>> s.probs(torch.log(torch.tensor([0.5, 0.3, 0.2]))).round(decimals=6).tolist()
    [0.625, 0.375, 0.0]
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real):
            raise TypeError(f"`temperature` must be a real number, got {type(t).__name__}")
        if not (math.isfinite(float(t)) and float(t) > 0):
            raise ValueError(
                f"`temperature` must be a finite number > 0 when sampling (greedy decoding is not "
                f"offered), got {t!r}"
            )
        object.__setattr__(self, "temperature", float(t))
        k = self.top_k
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, numbers.Integral):
                raise TypeError(f"`top_k` must be a positive integer or None, got {type(k).__name__}")
            if k < 1:
                raise ValueError(f"`top_k` must be >= 1, got {k}")
            object.__setattr__(self, "top_k", int(k))
        p = self.top_p
        if p is not None:
            if isinstance(p, bool) or not isinstance(p, numbers.Real):
                raise TypeError(f"`top_p` must be a real number in (0, 1] or None, got {type(p).__name__}")
            if not (0.0 < float(p) <= 1.0):
                raise ValueError(f"`top_p` must lie in (0, 1], got {p!r}")
            object.__setattr__(self, "top_p", float(p))

    @property
    def truncated(self) -> bool:
        """Whether top-k or top-p can remove tokens."""
        return self.top_k is not None or (self.top_p is not None and self.top_p < 1.0)

    def probs(self, logits):
        r"""The processed law, float64, same shape as ``logits`` (last axis = vocabulary).

        Parameters
        ----------
        logits : torch.Tensor, shape ``(..., V)``

        Returns
        -------
        torch.Tensor of float64, shape ``(..., V)``, rows summing to 1.

        Raises
        ------
        ValueError
            If a row has no finite logit (no law can be formed).
        """
        x = logits.to(torch.float64) / self.temperature
        V = x.shape[-1]
        if self.top_k is not None and self.top_k < V:
            kth = torch.topk(x, self.top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, -math.inf)
        probs = torch.softmax(x, dim=-1)
        if self.top_p is not None and self.top_p < 1.0:
            sp, _ = torch.sort(probs, dim=-1, descending=True)
            cum = torch.cumsum(sp, dim=-1)
            m = torch.clamp((cum < self.top_p).sum(dim=-1, keepdim=True), max=V - 1)
            thresh = torch.gather(sp, -1, m)
            probs = torch.where(probs >= thresh, probs, torch.zeros_like(probs))
            probs = probs / probs.sum(dim=-1, keepdim=True)
        if not bool(torch.isfinite(probs).all()):
            raise ValueError("logits gave no valid law (a row with no finite logit, or NaN)")
        return probs


def sample_rows(P: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """One inverse-CDF draw per row of a ``(B, V)`` float64 law; exact, zero-mass entries never drawn."""
    P = np.atleast_2d(P)
    c = np.cumsum(P, axis=1)
    u = gen.random(P.shape[0]) * c[:, -1]
    idx = np.empty(P.shape[0], dtype=np.int64)
    for b in range(P.shape[0]):
        i = int(np.searchsorted(c[b], u[b], side="right"))
        i = min(i, P.shape[1] - 1)
        while P[b, i] <= 0 and i > 0:
            i -= 1
        idx[b] = i
    return idx
