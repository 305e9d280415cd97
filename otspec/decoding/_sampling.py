r"""Temperature (greedy at 0), top-k and top-p, applied identically to the draft and the target."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._registry import unknown_name_message, validate_name
from .._validation import finite_real, number_text
from ._deps import require

torch = require("torch", "otspec.decoding")

__all__ = ["DRAW_RULES", "MIN_TEMPERATURE", "TOP_P_RULES", "Sampling", "draw_rows", "sample_rows", "transformers_keep_mask"]

#: The errors of :meth:`Sampling.probs` on bad logits (:attr:`Sampling.invalid_law`).
NO_LAW = "logits gave no valid law (a row with no finite logit, or NaN)"
NO_GREEDY_LAW = "logits gave no valid greedy law (a row with NaN, +inf, or no finite logit)"
#: Smallest positive temperature: a float32 (or bfloat16) logit, below ``2**128`` in magnitude, divided by it stays a
#: finite float64 (below it every row of ``logits / T`` holds infinities and its softmax is NaN: no law).
MIN_TEMPERATURE = 2.0**-896
#: Nucleus boundary rules of :class:`Sampling` (``top_p_rule``).
TOP_P_RULES = ("ties", "transformers")


def sampling_args(temperature, top_k, top_p, *, greedy: bool = True) -> tuple[float, int | None, float | None]:
    """``(temperature, top_k, top_p)`` checked and normalised (a float, an int or None, a float or None), as
    :class:`Sampling` takes them: ``temperature`` 0 (greedy; refused with ``greedy=False``) or finite and at least
    :data:`MIN_TEMPERATURE`, ``top_k`` an integer >= 1, ``top_p`` in (0, 1]; a bool, text, an array or NaN is
    refused with a :class:`TypeError` / :class:`ValueError` naming the parameter."""
    t = temperature
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise TypeError(f"`temperature` must be a real number, got {type(t).__name__}")
    if not (finite_real(t) and float(t) >= 0):  # finite_real: 10**400 is no OverflowError
        raise ValueError(
            f"`temperature` must be a finite number >= 0 (0 = greedy decoding, > 0 = sampling), "
            f"got {number_text(t)}"
        )
    if float(t) == 0 and not greedy:
        raise ValueError("`temperature` must be > 0 here (transformers' temperature warper divides by it), got 0.0")
    if 0 < float(t) < MIN_TEMPERATURE:  # logits / T would overflow float64 (every row NaN: no law at all)
        raise ValueError(
            f"`temperature` must be 0 (greedy decoding) or at least MIN_TEMPERATURE = 2**-896 "
            f"({MIN_TEMPERATURE:.3g}: below it a float32 logit divided by it overflows float64), got {float(t)!r}"
        )
    k = top_k
    if k is not None:
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral):
            raise TypeError(f"`top_k` must be a positive integer or None, got {type(k).__name__}")
        if k < 1:
            raise ValueError(f"`top_k` must be >= 1, got {k}")
        k = int(k)
    p = top_p
    if p is not None:
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
            raise TypeError(f"`top_p` must be a real number in (0, 1] or None, got {type(p).__name__}")
        if not (0.0 < float(p) <= 1.0):
            raise ValueError(f"`top_p` must lie in (0, 1], got {p!r}")
        p = float(p)
    return float(t), k, p


@dataclass(frozen=True)
class Sampling:
    r"""How logits become the next-token law, identically for draft and target.

    .. math::

        \pi(x) \propto \exp(\ell_x / T)\ \mathbb 1\{x \in \text{top-}k\}
        \quad\text{then, with top-}p\text{, restricted to the smallest head of mass} \ge p,

    and at ``T = 0`` (greedy decoding) the one-hot law of the argmax,

    .. math::

        \pi(x) = \mathbb 1\{x = \min \operatorname{arg\,max}_y \ell_y\},

    ties broken by the smallest token id (the rule of ``torch.argmax`` and of
    transformers' ``generate(do_sample=False)``); top-k and top-p are then
    irrelevant (the argmax survives every truncation) and ignored.

    The law is computed in float64. Top-k keeps every token whose logit is at
    least the ``k``-th largest (ties at the boundary are all kept, as in
    transformers' ``TopKLogitsWarper``). Top-p has two rules, chosen by
    ``top_p_rule``:

    * ``"ties"`` (default): keep every token whose probability is at least
      that of the token where the descending cumulative mass first reaches
      ``top_p``; tokens tied with it are all kept, so the kept set is a
      function of the law alone.
    * ``"transformers"``: the kept set of ``model.generate(do_sample=True,
      temperature=T, top_k=..., top_p=...)``, computed with the same
      operations as transformers' warpers on float32 scores: ``scores =
      logits.float() / T``, then ``TopKLogitsWarper``, then
      ``TopPLogitsWarper`` (an ascending sort, the cumulative softmax, drop
      the entries with cumulative mass ``<= 1 - top_p``, keep the largest).
      Among tokens tied at the nucleus boundary it keeps those the sort puts
      last, i.e. some but not all of them. Use it to compare otspec's laws
      with transformers' sampling; note that ``generate`` applies
      ``top_k=50`` unless told otherwise (pass ``top_k=50`` here, or
      ``top_k=None`` to ``generate``).

    Both rules are applied identically to draft and target, so speculative
    decoding stays lossless under either; the law it reproduces is the
    *processed* target law.

    Parameters
    ----------
    temperature : float
        ``T > 0`` to sample, or ``T = 0`` for greedy decoding (the one-hot law
        of the argmax, smallest token id among ties).
    top_k : int or None
        Keep the ``top_k`` largest logits (``>= 1``), or all.
    top_p : float or None
        Nucleus mass in ``(0, 1]``, or no nucleus truncation (``1.0`` keeps every token).
    top_p_rule : {"ties", "transformers"}
        How the nucleus boundary is drawn (see above).

    Raises
    ------
    ValueError
        ``temperature < 0``, not finite or in ``(0, MIN_TEMPERATURE)``, ``top_k < 1``, ``top_p`` outside
        ``(0, 1]``, an unknown ``top_p_rule``.
    TypeError
        A parameter of the wrong type.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import Sampling
    >>> s = Sampling(temperature=1.0, top_k=2)
    >>> s.probs(torch.log(torch.tensor([0.5, 0.3, 0.2]))).round(decimals=6).tolist()
    [0.625, 0.375, 0.0]

    Two tokens tied at the nucleus boundary: ``"ties"`` keeps both,
    transformers keeps one of them.

    >>> logits = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    >>> Sampling(top_p=0.6).probs(logits).tolist()
    [0.5, 0.25, 0.25]
    >>> Sampling(top_p=0.6, top_p_rule="transformers").probs(logits).round(decimals=6).tolist()
    [0.666667, 0.0, 0.333333]

    Greedy: the one-hot law of the argmax, the smaller id among tied maxima.

    >>> Sampling(temperature=0).probs(torch.tensor([0.1, 2.0, 2.0, -1.0])).tolist()
    [0.0, 1.0, 0.0, 0.0]
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    top_p_rule: str = "ties"

    def __post_init__(self):
        t, k, p = sampling_args(self.temperature, self.top_k, self.top_p)
        object.__setattr__(self, "temperature", t)
        object.__setattr__(self, "top_k", k)
        object.__setattr__(self, "top_p", p)
        validate_name(self.top_p_rule, "top_p_rule", TOP_P_RULES)  # an array: no "truth value is ambiguous"

    @property
    def invalid_law(self) -> str:
        """The message of the error a law made from bad logits raises (:meth:`probs` with ``check=True``; a
        caller that checks later, :func:`bad_rows`, raises the same words)."""
        return NO_GREEDY_LAW if self.greedy else NO_LAW

    @property
    def greedy(self) -> bool:
        """Whether this is greedy decoding (``temperature == 0``): one-hot laws of the argmax."""
        return self.temperature == 0.0

    @property
    def truncated(self) -> bool:
        """Whether top-k or top-p can remove tokens (greedy laws are one-hot: always)."""
        return self.greedy or self.top_k is not None or (self.top_p is not None and self.top_p < 1.0)

    @property
    def changes_law(self) -> bool:
        """Whether the processed law can differ from the model's own (:meth:`own_law`): a temperature other than 1
        or a truncation."""
        return self.temperature != 1.0 or self.truncated

    @staticmethod
    def own_law(logits):
        r"""The model's own law, float64: :math:`\pi(x) \propto \exp(\ell_x)` (temperature 1, untruncated), the
        law by which EAGLE's and SGLang's drafters rank candidate tokens whatever the sampling.

        Parameters
        ----------
        logits : torch.Tensor, shape ``(..., V)``

        Returns
        -------
        torch.Tensor of float64, shape ``(..., V)``
        """
        return torch.softmax(logits.to(torch.float64), dim=-1)

    def probs(self, logits, *, check: bool = True):
        r"""The processed law, float64, same shape as ``logits`` (last axis = vocabulary).

        Parameters
        ----------
        logits : torch.Tensor, shape ``(..., V)``
        check : bool, keyword-only
            Check that every row is a law (one host synchronisation on a
            GPU). ``False`` returns at once; a row from a NaN or ``+inf``
            logit, or with no finite logit, is then NaN in every entry (also
            under top-k / top-p and greedy decoding), so the caller can test
            one entry per row later (:func:`bad_rows`).

        Returns
        -------
        torch.Tensor of float64, shape ``(..., V)``, rows summing to 1.

        Raises
        ------
        ValueError
            If ``check`` and a row has no finite logit (no law can be formed),
            or, when greedy, a NaN or a ``+inf`` logit (no well-defined argmax).
        """
        if self.greedy:
            return greedy_probs(logits, check=check)
        if not check and not self.truncated and self.temperature == 1.0:
            return torch.softmax(logits, dim=-1, dtype=torch.float64)  # the cast inside the kernel: one pass less
        x = logits.to(torch.float64) / self.temperature
        V = x.shape[-1]
        if self.top_p_rule == "transformers":
            keep = transformers_keep_mask(logits, self.temperature, self.top_k, self.top_p)
            probs = torch.softmax(x.masked_fill(~keep, -math.inf), dim=-1)
            if not check:  # NaN or +inf logits, which transformers' warpers would drop, mark the row
                return probs.masked_fill(~torch.isfinite(x.amax(dim=-1, keepdim=True)), math.nan)
            if not bool(torch.isfinite(probs).all()):
                raise ValueError(NO_LAW)
            return probs
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
        if check and not bool(torch.isfinite(probs).all()):
            raise ValueError(NO_LAW)
        return probs


def greedy_probs(logits, *, check: bool = True):
    r"""The one-hot law of the argmax of each row, float64; ties go to the smallest token id.

    .. math::

        \pi(x) = \mathbb 1\{x = \min \operatorname{arg\,max}_y \ell_y\}.

    ``torch.argmax`` returns the first maximal index, as does transformers'
    greedy search (``next_token_scores.argmax(-1)``), so this is the law of
    ``generate(do_sample=False)``.

    Parameters
    ----------
    logits : torch.Tensor, shape ``(..., V)``
    check : bool, keyword-only
        Refuse rows without a well-defined argmax (one host synchronisation);
        ``False`` marks them instead: such a row is NaN in every entry.

    Returns
    -------
    torch.Tensor of float64, shape ``(..., V)``, one 1 per row.

    Raises
    ------
    ValueError
        If ``check`` and a row contains NaN, contains ``+inf``, or has no finite
        logit; no vocabulary axis.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding._sampling import greedy_probs
    >>> greedy_probs(torch.tensor([[1.0, 3.0, 3.0], [0.0, -1.0, -float("inf")]])).tolist()
    [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    """
    x = logits.to(torch.float64)  # exact from float32 / bfloat16: the same argmax, ties included
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"`logits` must have a vocabulary axis, got shape {tuple(x.shape)}")
    if check:
        if bool(torch.isnan(x).any()) or not bool(torch.isfinite(x.max(dim=-1).values).all()):
            raise ValueError(NO_GREEDY_LAW)
    idx = torch.argmax(x, dim=-1, keepdim=True)
    out = torch.zeros_like(x).scatter_(-1, idx, 1.0)
    if not check:  # a row with NaN, +inf or no finite logit (amax propagates NaN): NaN throughout
        out = out.masked_fill(~torch.isfinite(x.amax(dim=-1, keepdim=True)), math.nan)
    return out


def transformers_keep_mask(logits, temperature: float, top_k: int | None, top_p: float | None):
    r"""The tokens ``generate(do_sample=True, ...)`` can sample: transformers' warpers, operation for operation.

    .. math::

        s = \mathrm{float32}(\ell) / T, \quad
        s \leftarrow \text{TopK}(s), \quad
        s \leftarrow \text{TopP}(s), \quad
        \text{keep} = \{x : s_x > -\infty\}.

    ``generate`` casts the last position's logits to float32 and applies
    ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``
    in this order (``min_tokens_to_keep = 1``); this function repeats those
    operations on the same dtype and device, so the kept set is the one
    transformers computes, ties at the boundary included. It needs torch
    only, not transformers.

    Parameters
    ----------
    logits : torch.Tensor, shape ``(..., V)``
        Raw logits (any float dtype).
    temperature : float
        ``T > 0``.
    top_k : int or None
        Keep the ``top_k`` largest scores (all ties at the ``k``-th kept).
    top_p : float or None
        Nucleus mass; ``None`` or ``1.0`` keeps every token.

    Returns
    -------
    torch.Tensor of bool, shape ``(..., V)``
        True for the tokens transformers keeps.

    Raises
    ------
    TypeError
        ``logits`` not a torch tensor of a real floating dtype; ``temperature``, ``top_k`` or ``top_p`` of the
        wrong type (a bool, text, an array).
    ValueError
        If ``logits`` has no vocabulary axis; ``temperature`` not finite and > 0, ``top_k < 1``, ``top_p``
        outside (0, 1].

    References
    ----------
    .. [1] Hugging Face transformers, ``generation/logits_process.py``:
       ``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``; the processor order
       of ``GenerationMixin._get_logits_processor``.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import transformers_keep_mask
    >>> transformers_keep_mask(torch.tensor([1.0, 0.5, 0.5, -3.0]), 1.0, None, 0.7).tolist()
    [True, False, True, False]
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():  # complex, int, bool, numpy: refused
        what = f"a tensor of dtype {logits.dtype}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"`logits` must be a torch tensor of a real floating dtype, got {what}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"`logits` must have a vocabulary axis, got shape {tuple(logits.shape)}")
    temperature, top_k, top_p = sampling_args(temperature, top_k, top_p, greedy=False)
    s = logits.to(torch.float32) / temperature
    if top_k is not None:
        k = min(int(top_k), s.shape[-1])
        s = s.masked_fill(s < torch.topk(s, k)[0][..., -1, None], -math.inf)
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(s, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False
        remove = remove.scatter(-1, sorted_indices, remove)
        s = s.masked_fill(remove, -math.inf)
    return torch.isfinite(s)


def on_device(t, device=None, dtype=None, *, non_blocking: bool = False):
    """The tensor ``t`` on ``device`` with ``dtype`` (None: as it is): ``t`` itself when it is already so, else
    ``t.to(...)``.

    A ``.to`` of a tensor already in place copies nothing but still costs a Python dispatch per call (hundreds per
    profiled position otherwise); a ``device`` without an index (``"cuda"``) means the current one of its type.

    Examples
    --------
    >>> import torch
    >>> t = torch.zeros(2, dtype=torch.float64)
    >>> on_device(t, "cpu", torch.float64) is t, on_device(t, dtype=torch.float32).dtype
    (True, torch.float32)
    """
    import torch

    here = t.device
    if device is not None:
        want = torch.device(device)
        index = want.index
        if index is None and want.type == "cuda" and here.type == "cuda":
            index = torch.cuda.current_device()
        if want.type != here.type or (index is not None and index != here.index):
            return t.to(device=device, dtype=dtype, non_blocking=non_blocking)
    if dtype is not None and t.dtype != dtype:
        return t.to(dtype=dtype, non_blocking=non_blocking)
    return t


def sample_rows(P: np.ndarray, gen: np.random.Generator, *, uniforms=None) -> np.ndarray:
    """One inverse-CDF draw per row of a ``(B, V)`` float64 law; exact, zero-mass entries never drawn.

    A torch tensor is drawn where it lives, with no host read: the same ``B`` uniforms of ``gen`` go in, the same
    rule (``u`` times the total searched in the running sums, a landing on a zero-mass entry stepped back to the
    last positive one), and an int64 tensor of ids on its device comes out; ``uniforms`` (a tensor of the ``B``
    uniforms there, drawn from ``gen`` beforehand: several draws' in one host-to-device copy) replaces them."""
    if not isinstance(P, np.ndarray) and hasattr(P, "device"):
        P = P if P.ndim == 2 else P[None]
        n, V = P.shape
        ar, zero = _index_row(V, P.device)
        if n > 1 and P.stride(0) == 0:  # one law broadcast to every row: one cumulative sum, searched by every row
            P = P[0]
            c = torch.cumsum(P, dim=0)
            tot = c[-1]
        else:
            c = torch.cumsum(P, dim=1)
            tot = c[:, -1]
        u = (torch.as_tensor(gen.random(n), device=P.device) if uniforms is None else uniforms) * tot
        # the first running sum above u (V when u reaches the total: every index is <= it, as V - 1 would be), then
        # the step back: the last positive entry at or before it, 0 if none (no clamp needed on either side)
        i = torch.searchsorted(c, u if c.ndim == 1 else u[:, None], right=True)
        return torch.where((P > 0) & (ar <= (i[:, None] if c.ndim == 1 else i)), ar, zero).amax(dim=1)
    P = np.atleast_2d(P)
    if P.shape[0] > 1 and P.strides[0] == 0:  # one law broadcast to every row (i.i.d. drafts): one cumulative sum
        c = np.broadcast_to(np.cumsum(P[0]), P.shape)
    else:
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


_INDEX_ROWS: dict = {}


def _index_row(V: int, device):
    """``arange(V)`` (int64) and a 0-d int64 zero on ``device``, made once per ``(V, device)`` and kept (read only):
    no op for them at each draw of :func:`sample_rows`."""
    key = (V, device)
    got = _INDEX_ROWS.get(key)
    if got is None:
        got = _INDEX_ROWS[key] = (torch.arange(V, device=device), torch.zeros((), dtype=torch.int64, device=device))
    return got


_CONSTANTS: dict = {}


def _scalar(v: float, dtype, device):
    """A 0-d tensor of ``v`` (``dtype``, on ``device``), made once and kept, read only: the operand of a
    ``torch.where`` that a Python number would make a fresh tensor of at every call (one op more each)."""
    key = ("scalar", v, dtype, device)
    got = _CONSTANTS.get(key)
    if got is None:
        got = _CONSTANTS[key] = torch.full((), v, dtype=dtype, device=device)
    return got


def _ones(shape: tuple, dtype, device):
    """A block of ones of ``shape``, made once per shape, dtype and device and kept: read only (never written in
    place, never returned to a caller that might)."""
    key = ("ones", shape, dtype, device)
    got = _CONSTANTS.get(key)
    if got is None:
        got = _CONSTANTS[key] = torch.ones(shape, dtype=dtype, device=device)
    return got


def _arange(start: int, end: int, step: int, device, dtype=torch.int64):
    """``torch.arange(start, end, step)`` (int64, or ``dtype``) on ``device``, made once and kept, read only."""
    key = ("arange", start, end, step, device, dtype)
    got = _CONSTANTS.get(key)
    if got is None:
        got = _CONSTANTS[key] = torch.arange(start, end, step, device=device, dtype=dtype)
    return got


def _law_block(block, shape: tuple, device, dtype=None):
    """A float64 block of laws of ``shape`` (or of ``dtype``), allocated once per decode and overwritten every
    iteration (every law of an iteration is read before the next one's are written; nothing keeps a view of it): a
    fresh block of ``8 V`` bytes a row cost the allocator's page faults, 1,000 of them per iteration at
    ``V = 128,256``."""
    dtype = torch.float64 if dtype is None else dtype
    if (block is None or tuple(block.shape) != shape or block.dtype != dtype
            or block.device != torch.device(device)):
        block = torch.empty(shape, dtype=dtype, device=device)
    return block


def _block(work, name: str, shape: tuple, device, dtype=None):
    """A block of ``shape`` (float64 unless ``dtype``) on ``device`` kept in the dict ``work`` under ``name`` across
    calls: a view of the first entries of one buffer per name and device, made again only when it is too small or
    of another dtype (a call's shapes vary: a tree's levels have their own numbers of rows); a fresh tensor when
    ``work`` is None. What a view holds is overwritten by the next call for the same ``name`` and device."""
    dtype = torch.float64 if dtype is None else dtype
    if work is None:
        return torch.empty(shape, dtype=dtype, device=device)
    view = work.get((name, shape, device, dtype))  # the view made for these before: no slicing again
    if view is not None:
        return view
    dev = torch.device(device)
    key = (name, dev.type, dev.index)  # one buffer per device: a draft and a target on two devices keep their own
    n = math.prod(shape)
    b = work.get(key)
    if b is None or b.numel() < n or b.dtype != dtype:  # views made before keep the buffer they were made of
        b = work[key] = torch.empty(n, dtype=dtype, device=dev)
    view = work[(name, shape, device, dtype)] = b[:n].view(shape)
    return view


def _laws_into(sampling: Sampling, logits, out):
    """``sampling.probs(logits, check=False)`` written into ``out`` (a view of a :func:`_law_block`) and returned:
    the plain law (temperature 1, untruncated) by the softmax writing straight into it -- the same values bit for
    bit, without a fresh ``8 V``-byte row (whose page faults cost twice the softmax on the CPU: 1.7 ms against
    0.56 ms a row at ``V = 128,256``) and its copy; any other law computed, then copied."""
    if not sampling.greedy and not sampling.truncated and sampling.temperature == 1.0:
        out.copy_(logits)  # the float64 logits in the block itself: no fresh row for the softmax's cast either
        return torch.softmax(out, dim=-1, out=out)
    return out.copy_(sampling.probs(logits, check=False))


#: Rules of :func:`draw_rows`: ``"race"`` (the exponential race of vLLM's rejection sampler) and ``"cdf"``
#: (the inverse of the running sums).
DRAW_RULES = ("race", "cdf")


def bad_rows(P):
    """Rows of a law tensor ``(..., V)`` made from bad logits (NaN in every entry, see :meth:`Sampling.probs`):
    a bool tensor ``(...)`` on the same device, read from the first entry of each row (no synchronisation)."""
    return torch.isnan(P[..., 0])


def bad_logit_rows(sampling: Sampling, logits):
    """The rows of ``logits`` (``(..., V)``) whose law :meth:`Sampling.probs` would mark bad (:func:`bad_rows`),
    without forming it: a NaN or ``+inf`` logit, or no finite one, after the temperature (a finite logit that
    overflows when divided by it counts, as in ``probs``). One pass over the logits, no float64 row: the check of
    rows whose law is never needed. A bool tensor ``(...)`` on the same device, no synchronisation."""
    top = logits.amax(dim=-1).to(torch.float64)  # amax keeps a NaN; the largest logit overflows first
    if not sampling.greedy and sampling.temperature != 1.0:
        top = top / sampling.temperature
    return ~torch.isfinite(top)


def draw_rows(W, gen, *, rule: str | None = None, out=None, ids=None):
    r"""One draw per row of non-negative weights ``W`` (``(B, V)``, any float tensor), where ``W`` lives.

    .. math::

        P(\text{row } b \text{ draws } i) = \frac{W_{b,i}}{\sum_j W_{b,j}},

    with no normalisation and no sort. Two exact rules, the same law:

    * ``"race"`` (default on CUDA): :math:`\arg\max_i W_{b,i} / E_{b,i}` with
      :math:`E_{b,i}` i.i.d. ``Exp(1)`` -- the smallest of independent
      exponential clocks of rates :math:`W_{b,i}` rings at ``i`` with
      probability :math:`W_{b,i} / \sum_j W_{b,j}` (the draw of vLLM's v1
      rejection sampler, ``vllm/v1/sample/rejection_sampler.py``,
      ``sample_recovered_tokens``: ``argmax(prob / q)`` with ``q`` exponential).
      One random number per entry: cheap on a GPU, slow on a CPU.
    * ``"cdf"`` (default elsewhere): the running sums ``c`` and one uniform
      ``u`` per row; the first ``i`` with :math:`c_i > u\,c_V`. A zero-weight
      entry never has :math:`c_i > c_{i-1}`, so it is never drawn; a uniform
      rounded up to the total falls back to the first ``i`` with
      :math:`c_i = c_V` (positive weight too).

    Both are exact up to the float64 rounding of the uniforms (``2**-53``).

    Parameters
    ----------
    W : torch.Tensor, shape ``(B, V)``
        Non-negative weights, every row with positive total.
    gen : torch.Generator
        On ``W``'s device.
    rule : {"race", "cdf"} or None, keyword-only
        None: ``"race"`` on CUDA, ``"cdf"`` elsewhere.
    out : torch.Tensor of float64, shape ``(B, V)``, optional, keyword-only
        A block on ``W``'s device that receives the running sums (``"cdf"``) or the exponentials and ratios
        (``"race"``) instead of a fresh one (the same draws: the same operations write there); not ``W``.
    ids : torch.Tensor of int64, shape ``(B,)``, optional, keyword-only
        Where the ids are written and returned (``"race"``: by the ``argmax`` itself, no copy after it), say a
        column of a block of drafts; the same draws.

    Returns
    -------
    torch.Tensor of int64, shape ``(B,)``, on ``W``'s device (no host synchronisation), ``ids`` if given. A row of
    NaN (bad logits, :func:`bad_rows`) still gives an id in ``[0, V)``, so the caller can check later.

    Raises
    ------
    ValueError
        An unknown ``rule``.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding._sampling import draw_rows
    >>> g = torch.Generator().manual_seed(0)
    >>> W = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    >>> draw_rows(W, g).tolist(), draw_rows(W, g, rule="race").tolist()
    ([1, 0], [1, 0])
    """
    if rule is None:
        rule = "race" if W.device.type == "cuda" else "cdf"
    if rule not in DRAW_RULES:
        raise ValueError(unknown_name_message("rule", rule, DRAW_RULES))
    if rule == "race":
        E = (torch.empty(W.shape, dtype=torch.float64, device=W.device) if out is None else out).exponential_(
            generator=gen)
        # E = 0 (a uniform of exactly 0) would make 0 / 0 a NaN that argmax takes: floor it at the smallest normal
        E.clamp_(min=torch.finfo(torch.float64).tiny)
        ratio = torch.div(W.to(torch.float64), E, out=E)
        return torch.argmax(ratio, dim=-1) if ids is None else torch.argmax(ratio, dim=-1, out=ids)
    c = torch.cumsum(W.to(torch.float64), dim=-1, out=out)
    tot = c[:, -1:].contiguous()
    u = torch.rand((W.shape[0], 1), dtype=torch.float64, device=W.device, generator=gen) * tot
    i = torch.searchsorted(c, u, right=True)
    top = torch.searchsorted(c, tot, right=False)  # the first entry reaching the total: positive weight
    got = torch.where(i < W.shape[-1], i, top)[:, 0].clamp_(max=W.shape[-1] - 1)  # a NaN row: an id still
    return got if ids is None else ids.copy_(got)
