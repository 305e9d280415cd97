r"""The processed next-token law of logits under temperature, top-k and top-p, in float64 numpy.

An independent route to the law an engine should sample from (used by the
strategies and by tests of engines such as transformers' ``generate``).
"""

from __future__ import annotations

import numbers

import numpy as np

from .._validation import _float_input, finite_real, first_bad_entry

__all__ = ["processed_law"]


def processed_law(logits, *, temperature=1.0, top_k=None, top_p=None) -> np.ndarray:
    r"""The law of the next token from ``logits`` after temperature, then top-k, then top-p.

    .. math::

        \pi(x) \propto \exp(\ell_x / T)\ \mathbb 1\{\ell_x \ge \ell_{(k)}\}
        \ \mathbb 1\{\textstyle\sum_{y:\ \pi_0(y) > \pi_0(x)} \pi_0(y) < p_{\rm top}\},

    with :math:`\ell_{(k)}` the ``k``-th largest logit (ties at the boundary all
    kept) and :math:`\pi_0` the law after temperature and top-k: top-p keeps
    every token whose strictly-more-likely tokens hold less than ``top_p`` of
    the mass (the smallest head of mass at least ``top_p``, with ties at its
    boundary kept). The order is that of Hugging Face transformers' warpers
    (temperature, top-k, top-p) and of :class:`otspec.decoding.Sampling`.

    Parameters
    ----------
    logits : (V,) array_like of float
        Finite logits or ``-inf`` (masked tokens); at least one finite. A list,
        any numpy array or a torch tensor (read into a float64 copy).
    temperature : float, keyword-only
        :math:`T \ge 0`; ``0`` is greedy decoding: the law is the point mass on
        the largest logit (ties to the smallest token id, as ``torch.argmax``
        and transformers' ``generate(do_sample=False)``), and top-k, top-p
        change nothing.
    top_k : int or None, keyword-only
    top_p : float or None, keyword-only
        In (0, 1].

    Returns
    -------
    (V,) ndarray of float64
        Read-only.

    Raises
    ------
    ValueError, TypeError
        Bad logits or parameters (named in the message).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.testing import processed_law
    >>> processed_law(np.log([0.5, 0.3, 0.2]), top_k=2).round(6).tolist()
    [0.625, 0.375, 0.0]
    >>> processed_law(np.log([0.5, 0.3, 0.2]), top_p=0.6).round(6).tolist()
    [0.625, 0.375, 0.0]
    >>> processed_law(np.log([0.4, 0.4, 0.2]), temperature=0).tolist()
    [1.0, 0.0, 0.0]
    """
    x, _ = _float_input(logits, "logits", "a 1-D array_like of floats", booleans=False)  # a float64 copy
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"`logits` must be a non-empty 1-D array, got shape {x.shape}")
    if np.any(np.isnan(x)) or np.any(x == np.inf):
        raise ValueError("`logits` must be finite or -inf, with at least one finite entry, got "
                         f"{first_bad_entry(x, np.isnan(x) | (x == np.inf))}")
    if not np.any(np.isfinite(x)):
        raise ValueError(f"`logits` must be finite or -inf, with at least one finite entry, got all {x.size} -inf")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (
        finite_real(temperature) and temperature >= 0  # 2**64: np.isfinite's TypeError on the object array
    ):
        raise ValueError(f"`temperature` must be a finite number >= 0 (0 is greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"`top_k` must be a positive integer or None, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
        raise ValueError(f"`top_p` must lie in (0, 1] or be None, got {top_p!r}")
    if temperature == 0:
        law = np.zeros(x.size)
        law[int(np.argmax(x))] = 1.0  # the first maximum: ties to the smallest id
        law.setflags(write=False)
        return law
    with np.errstate(over="ignore"):
        z = x / float(temperature)
    if not np.all(np.isfinite(z) | np.isneginf(x)):
        # a small temperature overflowed a finite logit (to +-inf): the same law from the shifted logits, whose
        # maximum is 0; (x - max) / T <= 0 elsewhere, an overflow there is -inf, a probability of 0 as it is
        with np.errstate(over="ignore"):
            z = (x - x.max()) / float(temperature)
    if top_k is not None and top_k < z.size:
        kth = np.sort(z)[::-1][int(top_k) - 1]
        z[z < kth] = -np.inf
    with np.errstate(over="ignore"):  # finite logits more than 1.8e308 apart: the gap is -inf, a weight of 0 as it is
        w = np.exp(z - z.max())
    law = w / w.sum()
    if top_p is not None and top_p < 1:
        order = np.argsort(-law, kind="stable")
        s = law[order]
        before = np.concatenate(([0.0], np.cumsum(s)[:-1]))
        # mass held by tokens strictly more likely than each token (ties share the smallest)
        vals, first = np.unique(-s, return_index=True)
        strictly = before[first][np.searchsorted(vals, -s)]
        keep = np.zeros(law.size, dtype=bool)
        keep[order] = strictly < top_p
        law = np.where(keep, law, 0.0)
        law = law / law.sum()
    law.setflags(write=False)
    return law
