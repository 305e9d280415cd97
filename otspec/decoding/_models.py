r"""Language models for the decoder: a small protocol and two adapters.

A :class:`LanguageModel` gives next-token logits for a batch of equal-length
continuations of one shared, already-processed context. The context lives
in an opaque *state* (a KV cache where the backend has one), so a decoding
step only pays for the new tokens:

* ``new_state()`` -- an empty state (nothing processed, batch 1);
  ``new_state(pad=[a_1, ..., a_b])`` -- an empty state of ``b`` left-padded
  rows: the first ``a_r`` tokens given to row ``r`` are padding, never seen
  by the model (prompts of unequal lengths in one batch; optional: a model supports it
  when its ``new_state`` takes the keyword ``pad``);
* ``logits(state, input_ids)`` -- append ``input_ids`` (``(B, t)`` int64) to
  every row of the state and return the logits at those ``t`` positions,
  ``(B, t, V)``; a state of batch 1 is broadcast to ``B`` rows first, and a
  state of batch ``b`` dividing ``B`` has each row repeated ``B / b`` times in
  place (rows ``r B/b, ..., (r + 1) B/b - 1`` continue row ``r``, as
  ``torch.repeat_interleave``): ``b`` contexts of equal length, ``B / b``
  continuations each;
* ``select(state, row, length)`` -- keep one row, truncated to its first
  ``length`` tokens (used after verification: the chosen draft, its
  accepted prefix); ``row`` may also be a sequence of row indices, kept in
  that order (one row per context of a batch of contexts).

Lengths and columns count padding: every row of a state has ``length``
columns, row ``r``'s first ``a_r`` of them padding, so the rows of a
left-padded batch stay aligned on their last token.

:class:`HFCausalLM` wraps any Hugging Face causal LM (``model(input_ids,
cache=...)``, or ``past_key_values=...`` before transformers 5.x renamed
it) on any torch device; :class:`CallableLM` wraps a
plain function ``ids -> logits`` without a cache (tests, toy models).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ._deps import require

torch = require("torch", "otspec.decoding")

__all__ = ["LanguageModel", "HFCausalLM", "CallableLM", "next_token_logits", "validate_language_model"]


@runtime_checkable
class LanguageModel(Protocol):
    """Next-token logits for a batch of continuations of one shared context (see the module docstring)."""

    @property
    def vocab_size(self) -> int:  # pragma: no cover - protocol
        """Number of logits per position (``V``)."""

    @property
    def device(self) -> Any:  # pragma: no cover - protocol
        """The torch device the logits live on."""

    def new_state(self) -> Any:  # pragma: no cover - protocol
        """An empty state: nothing processed, batch 1. Optionally ``new_state(pad=...)``: an empty state of
        ``len(pad)`` left-padded rows (see the module docstring)."""

    def logits(self, state: Any, input_ids: Any) -> Any:  # pragma: no cover - protocol
        """Append ``input_ids`` ``(B, t)`` to the state (its ``b`` rows repeated ``B / b`` times each); return
        logits ``(B, t, V)``."""

    def select(self, state: Any, row: int | Sequence[int], length: int) -> None:  # pragma: no cover - protocol
        """Keep row ``row`` (or the rows of a sequence ``row``, in order), truncated to the first ``length`` tokens."""


def validate_language_model(lm, name: str) -> int:
    """Check ``lm`` implements :class:`LanguageModel`; return its vocabulary size."""
    if not isinstance(lm, LanguageModel):
        raise TypeError(
            f"`{name}` must implement otspec.decoding.LanguageModel (vocab_size, device, new_state, "
            f"logits, select); wrap a Hugging Face model with HFCausalLM, got {type(lm).__name__}"
        )
    v = lm.vocab_size
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"`{name}.vocab_size` must be a positive integer, got {v!r}")
    return int(v)


def _kept_rows(row, batch: int) -> list[int]:
    """The rows ``select`` keeps: ``[row]`` for an int, the list for a sequence (each in ``[0, batch)``)."""
    if isinstance(row, numbers.Integral) and not isinstance(row, bool):
        if not 0 <= row < batch:
            raise ValueError(f"`row` must lie in [0, {batch}), got {row}")
        return [int(row)]
    rows = row.tolist() if hasattr(row, "tolist") else row
    try:
        rows = list(rows)
    except TypeError:
        raise TypeError(f"`row` must be an int or a sequence of ints, got {type(row).__name__}") from None
    if not rows or not all(isinstance(r, numbers.Integral) and not isinstance(r, bool) and 0 <= r < batch
                           for r in rows):
        raise ValueError(f"`row` must be a non-empty sequence of ints in [0, {batch}), got {rows!r}")
    return [int(r) for r in rows]


def supports_padding(lm) -> bool:
    """Whether ``lm.new_state`` takes the keyword ``pad`` (left-padded batches of prompts of unequal lengths)."""
    try:
        return "pad" in inspect.signature(lm.new_state).parameters
    except (TypeError, ValueError):  # pragma: no cover - a new_state without a signature
        return False


def _pad_rows(pad) -> list[int]:
    """The padding of each row of a new state, as a list of non-negative ints (``pad`` of ``new_state``)."""
    rows = pad.tolist() if hasattr(pad, "tolist") else pad
    if isinstance(rows, (str, bytes)) or isinstance(rows, numbers.Number):
        raise TypeError(f"`pad` must be a sequence of ints (one per row), got {type(pad).__name__}")
    try:
        rows = list(rows)
    except TypeError:
        raise TypeError(f"`pad` must be a sequence of ints (one per row), got {type(pad).__name__}") from None
    if not rows or not all(isinstance(a, numbers.Integral) and not isinstance(a, bool) and a >= 0 for a in rows):
        raise ValueError(f"`pad` must be a non-empty sequence of ints >= 0 (one per row), got {rows!r}")
    return [int(a) for a in rows]


def _check_padded_call(pad, length: int, t: int) -> None:
    """A call on a left-padded state must leave every row at least one real token (the first call: ``t > max(pad)``)."""
    if pad is not None and length + t <= int(pad.max()):
        raise ValueError(f"`input_ids` must reach past every row's padding: a state of {length} columns padded by "
                         f"up to {int(pad.max())} tokens needs t > {int(pad.max()) - length} new columns, got t = {t}")


def _kept_pad(pad, rows: list[int], length: int):
    """The padding of the rows ``select`` keeps, truncated to ``length`` columns (``None``: no padding left)."""
    if pad is None:
        return None
    kept = pad[torch.tensor(rows, device=pad.device)].clamp(max=length)
    return kept if bool(kept.any()) else None


def _repeats(batch: int, B: int) -> int:
    """How many times each of ``batch`` state rows repeats to make ``B`` rows (``batch`` must divide ``B``)."""
    if B % batch:
        raise ValueError(f"a state of batch {batch} cannot be extended with {B} rows (a multiple of {batch})")
    return B // batch


class _HFState:
    __slots__ = ("cache", "length", "batch", "pad")

    def __init__(self):
        self.cache = None
        self.length = 0
        self.batch = 1
        self.pad = None  # (batch,) int64: leading padding columns of each row, or None (no row padded)


def _new_cache():
    """An empty ``DynamicCache`` (passed explicitly: transformers 4.x returns legacy tuples otherwise)."""
    try:
        from transformers import DynamicCache
    except ImportError:  # pragma: no cover - a custom torch LM without transformers
        return None
    return DynamicCache()


def _cache_keyword(model) -> str:
    """The keyword of ``model.forward`` that takes the KV cache: ``"cache"`` (transformers 5.x, where
    ``past_key_values`` is deprecated and warns at every call) or ``"past_key_values"`` (4.x and
    models that only know that name). Read from the signature, not from a version string."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


class HFCausalLM:
    r"""Adapter of a Hugging Face causal language model, with its KV cache, on any torch device.

    .. math::

        \text{logits}(x_{1:T})_t = \log M(\cdot \mid x_{1:t}) + \text{const},

    computed incrementally: the state holds the model's KV cache (a
    ``DynamicCache``) and each call feeds only the new tokens. The cache is
    passed as ``cache=`` when ``model.forward`` takes that keyword
    (transformers 5.x, where ``past_key_values`` is deprecated) and as
    ``past_key_values=`` otherwise (transformers 4.45 on), read from the
    forward's signature, so no call warns or prints. Rows are broadcast with the
    cache's ``batch_repeat_interleave``, chosen with
    ``batch_select_indices`` and truncated with ``crop`` (all present from
    transformers 4.45 on).

    A left-padded state (``new_state(pad=a)``, row ``r`` padded by ``a_r``
    columns) is run as transformers runs left-padded generation: every call
    passes the 2-D ``attention_mask`` of the cache and the new tokens,
    :math:`m_{r,c} = [c \ge a_r]`, and ``position_ids``
    :math:`c - a_r` (clamped at 0 on the padding), the ``cumsum - 1`` of the
    mask that ``generate`` builds, so a real token's logits are those of its
    row alone, up to float32 rounding of the batched kernels. The padding
    follows the rows through repetition, ``select`` and truncation; once no
    kept row is padded, calls pass no mask (the unpadded path).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM (``AutoModelForCausalLM``); it is put in eval mode.
    name : str, optional
        A label for reports.

    Attributes
    ----------
    model : transformers.PreTrainedModel
    vocab_size : int
        Width of the output logits (may exceed the tokenizer's vocabulary).
    device : torch.device
        Device of the model's parameters; inputs are moved there.
    n_calls : int
        Forward calls made so far.

    Examples
    --------
    >>> import torch, transformers
    >>> from otspec.decoding import HFCausalLM
    >>> cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    >>> _ = torch.manual_seed(0)
    >>> lm = HFCausalLM(transformers.LlamaForCausalLM(cfg))
    >>> state = lm.new_state()
    >>> tuple(lm.logits(state, torch.tensor([[1, 2, 3]])).shape)
    (1, 3, 8)

    Prompts ``[5]`` and ``[3, 1, 5]`` in one left-padded batch (row 0 padded by 2):

    >>> both = lm.logits(lm.new_state(pad=[2, 0]), torch.tensor([[0, 0, 5], [3, 1, 5]]))
    >>> alone = lm.logits(lm.new_state(), torch.tensor([[5]]))
    >>> torch.allclose(both[0, -1], alone[0, -1], rtol=0, atol=1e-6)
    True
    """

    def __init__(self, model, *, name: str | None = None):
        if not isinstance(model, torch.nn.Module) or not callable(getattr(model, "forward", None)):
            raise TypeError(f"`model` must be a torch causal LM module, got {type(model).__name__}")
        self.model = model.eval()
        emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if emb is not None and getattr(emb, "weight", None) is not None:
            v = int(emb.weight.shape[0])
        else:
            v = int(model.config.vocab_size)
        self._vocab = v
        self.name = name or type(model).__name__
        self.n_calls = 0
        self._cache_kw = _cache_keyword(model)

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def device(self):
        return next(self.model.parameters()).device

    def new_state(self, pad=None) -> _HFState:
        r"""An empty state: batch 1, or ``len(pad)`` left-padded rows.

        .. math::

            m_{r,c} = [\,c \ge a_r\,], \qquad
            \text{pos}_{r,c} = \max(c - a_r, 0), \qquad c = 0, 1, \dots

        for row ``r`` padded by ``a_r`` columns: the first ``a_r`` tokens fed to
        the row are padding (any ids; masked out of every attention), and its
        real tokens take positions ``0, 1, ...``. The logits returned at
        padding columns are meaningless.

        Parameters
        ----------
        pad : sequence of int >= 0, optional
            Leading padding columns of each row (``None``: an unpadded state of
            batch 1). The first :meth:`logits` call must feed ``t > max(pad)``
            columns and a multiple of ``len(pad)`` rows.

        Returns
        -------
        state
            Opaque; pass it to :meth:`logits` and :meth:`select`.

        Raises
        ------
        TypeError, ValueError
            ``pad`` not a non-empty sequence of non-negative ints.

        Examples
        --------
        The class example ends with a padded batch against a prompt alone.
        """
        state = _HFState()
        if pad is not None:
            rows = _pad_rows(pad)
            state.batch = len(rows)
            if any(rows):
                state.pad = torch.tensor(rows, dtype=torch.long, device=self.device)
        return state

    @torch.inference_mode()
    def logits(self, state: _HFState, input_ids):
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise ValueError(f"`input_ids` must have shape (B, t) with t >= 1, got {tuple(ids.shape)}")
        B, t = int(ids.shape[0]), int(ids.shape[1])
        _check_padded_call(state.pad, state.length, t)
        if state.batch != B:
            reps = _repeats(state.batch, B)
            if state.cache is not None and state.length > 0:
                state.cache.batch_repeat_interleave(reps)
            if state.pad is not None:
                state.pad = state.pad.repeat_interleave(reps)
        if state.cache is None:
            state.cache = _new_cache()
        kw = {self._cache_kw: state.cache}
        if state.pad is not None:  # as generate() with left padding: the 2-D mask of cache + new tokens
            cols = torch.arange(state.length + t, device=self.device)
            kw["attention_mask"] = (cols[None, :] >= state.pad[:, None]).long()
            kw["position_ids"] = (cols[None, state.length:] - state.pad[:, None]).clamp(min=0)
        out = self.model(input_ids=ids, use_cache=True, **kw)
        self.n_calls += 1
        state.cache = getattr(out, self._cache_kw)  # out.cache (5.x) or out.past_key_values (4.x)
        state.length += int(ids.shape[1])
        state.batch = B
        return out.logits

    @torch.inference_mode()
    def select(self, state: _HFState, row: int | Sequence[int], length: int) -> None:
        rows = _kept_rows(row, state.batch)
        if not 0 <= length <= state.length:
            raise ValueError(f"`length` must lie in [0, {state.length}], got {length}")
        if state.cache is None:
            state.batch, state.length, state.pad = 1, 0, None
            return
        state.pad = _kept_pad(state.pad, rows, length)
        if rows != list(range(state.batch)):
            state.cache.batch_select_indices(torch.tensor(rows, device=self.device))
            state.batch = len(rows)
        if length < state.length:
            if length == 0:
                state.cache, state.length = None, 0
                return
            # negative: remove that many tokens (transformers >= 4.45 and 5.x agree on this form)
            state.cache.crop(length - state.length)
        state.length = length

    def __repr__(self) -> str:
        return f"HFCausalLM({self.name}, vocab_size={self.vocab_size}, device={self.device})"


class _SeqState:
    __slots__ = ("ids", "pad")

    def __init__(self):
        self.ids = None
        self.pad = None  # (batch,) int64: leading padding columns of each row, or None (no row padded)

    @property
    def length(self) -> int:
        return 0 if self.ids is None else int(self.ids.shape[1])


class CallableLM:
    r"""A cache-free language model from a function ``ids (B, T) -> logits (B, T, V)``.

    Each call recomputes the whole sequence (:math:`O(T)` per token), which
    is fine for toy models and tests; the state is the token tensor itself.
    In a left-padded state (``new_state(pad=a)``) ``fn`` never sees padding:
    the rows of each distinct padding ``a`` are computed by one call
    ``fn(ids[rows, a:])`` on their real tokens, so a batch of prompts of
    unequal lengths gives exactly the logits of each prompt alone whenever
    ``fn`` computes its rows independently; the logits at padding columns
    are 0.

    Parameters
    ----------
    fn : callable
        ``fn(ids)`` with ``ids`` an int64 tensor ``(B, T)`` returns float logits
        ``(B, T, V)``; position ``t`` must depend on ``ids[:, :t+1]`` only.
    vocab_size : int
        ``V``.
    device : str or torch.device, optional
        Where ``ids`` are placed (default CPU).

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM
    >>> lm = CallableLM(lambda ids: torch.zeros(ids.shape + (3,)), vocab_size=3)
    >>> tuple(lm.logits(lm.new_state(), torch.tensor([[0, 1]])).shape)
    (1, 2, 3)
    """

    def __init__(self, fn: Callable, vocab_size: int, *, device="cpu", name: str | None = None):
        if not callable(fn):
            raise TypeError(f"`fn` must be callable, got {type(fn).__name__}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 1:
            raise ValueError(f"`vocab_size` must be a positive integer, got {vocab_size!r}")
        self.fn = fn
        self._vocab = int(vocab_size)
        self._device = torch.device(device)
        self.name = name or "CallableLM"
        self.n_calls = 0

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def device(self):
        return self._device

    def new_state(self, pad=None) -> _SeqState:
        r"""An empty state: batch 1, or ``len(pad)`` left-padded rows.

        .. math::

            \text{logits}_{r, c} = \text{fn}(x_{r,\, a_r:})_{c - a_r}, \quad c \ge a_r,
            \qquad \text{logits}_{r, c} = 0, \quad c < a_r,

        for row ``r`` padded by ``a_r`` columns: ``fn`` sees only the row's real
        tokens (rows sharing a padding are computed in one call). ``pad``, the
        returned state and the errors are those of :meth:`HFCausalLM.new_state`.

        Examples
        --------
        >>> import torch
        >>> from otspec.decoding import CallableLM
        >>> lm = CallableLM(lambda ids: ids.cumsum(1)[..., None].double(), vocab_size=1)  # running sum
        >>> lm.logits(lm.new_state(pad=[2, 0]), torch.tensor([[9, 9, 5], [3, 1, 5]]))[..., 0].tolist()
        [[0.0, 0.0, 5.0], [3.0, 4.0, 9.0]]
        """
        state = _SeqState()
        if pad is not None:
            state.pad = torch.tensor(_pad_rows(pad), dtype=torch.long, device=self._device)
        return state

    def logits(self, state: _SeqState, input_ids):
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self._device)
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise ValueError(f"`input_ids` must have shape (B, t) with t >= 1, got {tuple(ids.shape)}")
        B, t = int(ids.shape[0]), int(ids.shape[1])
        pad = state.pad
        if pad is not None:
            _check_padded_call(pad, state.length, t)
            if pad.shape[0] != B:
                pad = pad.repeat_interleave(_repeats(int(pad.shape[0]), B))
        if state.ids is None:
            full = ids
        else:
            prev = state.ids
            if prev.shape[0] != B:
                reps = _repeats(int(prev.shape[0]), B)
                prev = prev.expand(B, -1) if prev.shape[0] == 1 else prev.repeat_interleave(reps, dim=0)
            full = torch.cat([prev, ids], dim=1)
        with torch.inference_mode():
            out = self.fn(full) if pad is None or not bool(pad.any()) else self._padded(full, pad)
        self.n_calls += 1
        if tuple(out.shape) != (B, full.shape[1], self._vocab):
            raise ValueError(
                f"`fn` must return logits of shape {(B, int(full.shape[1]), self._vocab)}, got {tuple(out.shape)}"
            )
        state.ids = full
        state.pad = pad
        return out[:, -t:]

    def _padded(self, full, pad):
        """``fn`` on each row's real tokens: one call per distinct padding, 0 at the padding columns."""
        B, T = int(full.shape[0]), int(full.shape[1])
        out = None
        for a in torch.unique(pad).tolist():
            rows = torch.nonzero(pad == a).flatten()
            got = self.fn(full[rows, a:])
            if tuple(got.shape) != (rows.numel(), T - a, self._vocab):
                raise ValueError(f"`fn` must return logits of shape {(rows.numel(), T - a, self._vocab)}, "
                                 f"got {tuple(got.shape)}")
            if out is None:
                out = got.new_zeros((B, T, self._vocab))
            out[rows, a:] = got
        return out

    def select(self, state: _SeqState, row: int | Sequence[int], length: int) -> None:
        if state.ids is None:
            return
        rows = _kept_rows(row, int(state.ids.shape[0]))
        if not 0 <= length <= state.length:
            raise ValueError(f"`length` must lie in [0, {state.length}], got {length}")
        state.pad = _kept_pad(state.pad, rows, length)
        if length == 0:
            state.ids = None
        elif len(rows) == 1:
            state.ids = state.ids[rows[0] : rows[0] + 1, :length]
        else:
            state.ids = state.ids[torch.tensor(rows, device=state.ids.device), :length]

    def __repr__(self) -> str:
        return f"CallableLM({self.name}, vocab_size={self.vocab_size})"


def next_token_logits(lm: LanguageModel, prefixes: Sequence[Sequence[int]]):
    r"""Next-token logits after each of a batch of prefixes, one forward call per distinct length.

    .. math::

        \ell_b = \text{logits}(x^{(b)})_{T_b}, \qquad b = 1, \dots, B.

    Parameters
    ----------
    lm : LanguageModel
    prefixes : sequence of non-empty sequences of int
        Token ids; prefixes of equal length are scored in one batched call.

    Returns
    -------
    torch.Tensor
        ``(B, V)`` logits on ``lm.device`` (float, as the model returns them).

    Raises
    ------
    ValueError
        If ``prefixes`` is empty or holds an empty prefix or an out-of-range id.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM, next_token_logits
    >>> lm = CallableLM(lambda ids: torch.nn.functional.one_hot(ids, 4).float(), vocab_size=4)
    >>> next_token_logits(lm, [[0, 2], [1]]).tolist()
    [[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    """
    V = validate_language_model(lm, "lm")
    rows = [validate_prompt(p, V, "prefixes") for p in prefixes]
    if not rows:
        raise ValueError("`prefixes` must hold at least one prefix, got none")
    out = [None] * len(rows)
    by_len: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_len.setdefault(len(r), []).append(i)
    for _, idx in sorted(by_len.items()):
        ids = torch.tensor([rows[i] for i in idx], dtype=torch.long, device=lm.device)
        logits = lm.logits(lm.new_state(), ids)[:, -1]
        for j, i in enumerate(idx):
            out[i] = logits[j]
    return torch.stack(out)


def validate_prompt(prompt, V: int, name: str = "prompt") -> list[int]:
    r"""Token ids of a prompt as a list of int, from whatever a tokenizer returned.

    .. math::

        \text{prompt} \mapsto (x_1, \dots, x_T), \qquad x_t \in \{0, \dots, V - 1\},\ T \ge 1.

    Accepted: a sequence of int (``tokenizer.encode(text)``), a 1-D tensor or
    array, a batch of one row (shape ``(1, T)``, e.g. ``return_tensors="pt"``),
    or a mapping with ``"input_ids"`` (the ``BatchEncoding`` of
    ``tokenizer(text)`` or of ``tokenizer.apply_chat_template(...,
    add_generation_prompt=True)`` in transformers 5).

    Parameters
    ----------
    prompt : sequence of int, tensor, array, BatchEncoding or dict
        The prompt's token ids.
    V : int
        Vocabulary size; every id must lie in ``[0, V)``.
    name : str
        Parameter name used in error messages.

    Returns
    -------
    list of int
        The ids, in order.

    Raises
    ------
    TypeError
        Text instead of ids, a mapping without ``"input_ids"``, non-integer
        ids; the message names what was received.
    ValueError
        An empty prompt, a batch of more than one row, an id outside ``[0, V)``.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding._models import validate_prompt
    >>> validate_prompt({"input_ids": torch.tensor([[3, 1, 4]]), "attention_mask": torch.ones(1, 3)}, 8)
    [3, 1, 4]
    >>> validate_prompt("Hello", 8)
    Traceback (most recent call last):
    ...
    TypeError: `prompt` must be token ids, got a str ('Hello'): tokenize it first, e.g. tokenizer(text)["input_ids"]
    """
    from collections.abc import Mapping

    got = type(prompt).__name__
    if isinstance(prompt, Mapping) or (hasattr(prompt, "keys") and hasattr(prompt, "__getitem__")):
        if "input_ids" not in prompt:
            raise TypeError(
                f"`{name}` is a {got} without an 'input_ids' entry (keys: {sorted(map(str, prompt.keys()))}); "
                "pass the token ids"
            )
        prompt = prompt["input_ids"]
        got = f"{got}['input_ids'] ({type(prompt).__name__})"
    if isinstance(prompt, (str, bytes)):
        text = prompt if len(prompt) <= 40 else prompt[:37] + "..."
        raise TypeError(
            f"`{name}` must be token ids, got a {type(prompt).__name__} ({text!r}): tokenize it first, "
            'e.g. tokenizer(text)["input_ids"]'
        )
    if prompt is None:
        raise TypeError(f"`{name}` must be token ids, got None")
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, numbers.Integral) and not isinstance(prompt, bool):
        raise TypeError(f"`{name}` must be a sequence of token ids, got a single {got}: wrap it, [{int(prompt)}]")
    try:
        items = list(prompt)
    except TypeError as exc:
        raise TypeError(f"`{name}` must be a sequence of token ids, got {got}") from exc
    if items and isinstance(items[0], (list, tuple)):
        if len(items) != 1:
            raise ValueError(
                f"`{name}` must be one sequence of token ids, got a batch of {len(items)} sequences (from {got}); "
                "decode one prompt at a time"
            )
        items = list(items[0])
    if not items:
        raise ValueError(f"`{name}` must be non-empty (the model needs a context), got an empty sequence")
    out = []
    for t in items:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"`{name}` must hold integer token ids, got {type(t).__name__} {t!r} (in a {got})")
        if not 0 <= int(t) < V:
            raise ValueError(f"`{name}` must hold token ids in [0, {V}), got {int(t)}")
        out.append(int(t))
    return out
