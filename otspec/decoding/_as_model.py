r"""A decoding model as an :mod:`otspec.models` model: the exact tree and block functions on real models.

The decoding loop's models (:class:`~otspec.decoding.LanguageModel`:
:class:`~otspec.decoding.HFCausalLM`, :class:`~otspec.decoding.CallableLM`)
give logits for a batch of token rows; the exact functions of
:mod:`otspec.tree` (:func:`~otspec.tree.value`, :func:`~otspec.tree.optimum`,
:func:`~otspec.tree.sample_tree`, ...) and of :mod:`otspec.models` take a
*model*: ``vocab_size`` and ``next_dist(prefix)``, the next-token law after a
prefix. :func:`as_model` is the one adapter between the two protocols.
"""

from __future__ import annotations

import numpy as np

from .._validation import sequence_like
from ..models import validate_sequence
from ._models import next_token_logits, validate_language_model, validate_prompt
from ._sampling import Sampling

__all__ = ["LanguageModelLaws", "as_model"]


class LanguageModelLaws:
    r"""The next-token laws of a decoding model after a fixed context (see :func:`as_model`).

    .. math::

        \texttt{next\_dist}(x_{1:d}) = \pi\big(\ell(c, x_{1:d})\big),

    with :math:`c` the context, :math:`\ell` the model's logits after :math:`(c, x_{1:d})` and :math:`\pi`
    the sampling's law (temperature 1, untruncated, by default), float64.

    Attributes
    ----------
    lm : LanguageModel
    context : tuple of int
    sampling : Sampling
    vocab_size : int
    """

    #: Each law returned is a new array (the host copy of the sampling's new law tensor), which nothing writes
    #: again (:class:`otspec.models.Model`): the exact routines may read it where it is.
    fresh_laws = True

    def __init__(self, lm, context, sampling):
        self.lm, self.context, self.sampling = lm, context, sampling
        self.vocab_size = lm.vocab_size

    def next_dist(self, prefix) -> np.ndarray:
        """The law of the next token after ``context + prefix``: ``(V,)`` float64 (one forward call)."""
        ids = self.context + validate_sequence(prefix, self.vocab_size, "prefix")
        if not ids:
            raise ValueError("a decoding model gives a law only after at least one token: pass `context` to "
                             "as_model (e.g. the prompt, or its BOS id) or a non-empty `prefix`")
        logits = next_token_logits(self.lm, [list(ids)])
        return self.sampling.probs(logits)[0].detach().to("cpu").numpy()

    def __repr__(self) -> str:
        return (f"as_model({getattr(self.lm, 'name', type(self.lm).__name__)!s}, context of {len(self.context)} "
                f"tokens, {self.sampling!r})")


def as_model(lm, *, context=(), sampling=None) -> LanguageModelLaws:
    r"""A decoding model as an :mod:`otspec.models` model (``vocab_size``, ``next_dist(prefix)``), after ``context``.

    .. math::

        M(\cdot \mid x_{1:d}) = \pi\big(\ell(c, x_{1:d})\big),

    the law the decoding loop computes from the model's logits :math:`\ell`
    after the context :math:`c` and the prefix, so that every exact function
    of :mod:`otspec.tree` (and of :mod:`otspec.models`) runs on real models:
    ``value(shape, as_model(draft, context=c), as_model(target, context=c), ...)``.

    Parameters
    ----------
    lm : LanguageModel
        :class:`HFCausalLM`, :class:`CallableLM` or any
        :class:`~otspec.decoding.LanguageModel`.
    context : sequence of int, keyword-only
        Token ids every prefix continues (the prompt); a decoding model needs
        at least one token before it gives a law, so an empty context takes
        non-empty prefixes only.
    sampling : Sampling or None, keyword-only
        How logits become the law (:class:`Sampling`); None: the model's own
        law (temperature 1, untruncated), the one EAGLE's and Medusa's
        drafters rank by. For a decode with another sampling, pass the same
        :class:`Sampling` here, so that the laws are those its verifier sees.

    Returns
    -------
    LanguageModelLaws
        ``vocab_size`` and ``next_dist(prefix)``: one forward call of the
        whole context and prefix per law (the functions of :mod:`otspec.tree`
        memoise the laws of one call by path).

    Raises
    ------
    TypeError
        ``lm`` not a LanguageModel, ``context`` not token ids, ``sampling`` not a Sampling.
    ValueError
        A context token outside the vocabulary.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM, as_model
    >>> from otspec.tree import TreeShape, value
    >>> lm = CallableLM(lambda ids: torch.zeros(ids.shape + (4,)), vocab_size=4)  # uniform over 4 tokens
    >>> m = as_model(lm, context=[0])
    >>> m.next_dist((1, 2)).tolist()
    [0.25, 0.25, 0.25, 0.25]
    >>> value(TreeShape.branching(2), m, m, process="topk", verifier="target-only")  # q of the two children
    0.5
    """
    validate_language_model(lm, "lm")
    empty = sequence_like(context) and len(context) == 0  # a 0-d array: validate_prompt refuses it (no len() error)
    ctx = () if empty else tuple(validate_prompt(context, lm.vocab_size, "context"))
    if sampling is None:
        sampling = Sampling()
    elif not isinstance(sampling, Sampling):
        raise TypeError(f"`sampling` must be an otspec.decoding.Sampling or None, got {type(sampling).__name__}")
    return LanguageModelLaws(lm, ctx, sampling)
