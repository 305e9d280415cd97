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
* optionally ``logits(state, input_ids, last=m)`` -- the same, returning
  the logits of the last ``m`` positions only, ``(B, m, V)``, which the model
  may compute alone (both adapters do: a Hugging Face model applies its
  output layer to those positions only, transformers' ``logits_to_keep``);
  the decoder passes it where :func:`takes_last` finds the keyword, and
  asks for the rows it reads (one per draft call, ``L + 1`` per target
  call), so a prompt's prefill does not pay the ``V``-wide output layer at
  every prompt position;
* ``select(state, row, length)`` -- keep one row, truncated to its first
  ``length`` tokens (used after verification: the chosen draft, its
  accepted prefix); ``row`` may also be a sequence of row indices, kept in
  that order (one row per context of a batch of contexts).

Draft trees (optional; both adapters have them): ``tree_logits(state, parents,
tokens, pending=...)`` scores every node of a draft tree -- ``parents`` and
``tokens`` arrays of ``n + 1`` nodes, node 0 the root (the context) -- in one
call, each node attending to the context and its own ancestors
(:meth:`HFCausalLM.tree_logits`); ``score_tree`` gives the same as float64
laws. The decoder's device route passes ``tokens`` as an int64 tensor on the
target's device and reads nothing before the call: a model of one's own
takes such a tensor too (without reading it, to keep the one host
synchronisation per iteration).

Lengths and columns count padding: every row of a state has ``length``
columns, row ``r``'s first ``a_r`` of them padding, so the rows of a
left-padded batch stay aligned on their last token.

:class:`HFCausalLM` wraps any Hugging Face causal LM (``model(input_ids,
cache=...)``, or ``past_key_values=...`` before transformers 5.x renamed
it) on any torch device; :class:`CallableLM` wraps a
plain function ``ids -> logits`` without a cache (tests, toy models).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._registry import unknown_name_message
from .._validation import sequence_like
from ._deps import require
from ._sampling import on_device

torch = require("torch", "otspec.decoding")

__all__ = ["DTYPES", "LanguageModel", "HFCausalLM", "CallableLM", "check_device", "check_dtype",
           "checkpoint_vocab", "load_pair", "next_token_logits", "validate_language_model", "MAX_TREE_NODES",
           "MAX_TREE_CELLS"]

#: ``dtype`` of a loaded checkpoint: ``"auto"`` keeps the checkpoint's own (its config's ``dtype``).
DTYPES = ("auto", "bfloat16", "float16", "float32")


def check_dtype(dtype, name: str = "dtype"):
    """The torch dtype (or ``"auto"``) of a name of :data:`DTYPES`; ValueError naming ``name`` otherwise.

    Examples
    --------
    >>> from otspec.decoding._models import check_dtype
    >>> check_dtype("bfloat16")
    torch.bfloat16
    """
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(unknown_name_message(name, dtype, DTYPES))
    return dtype if dtype == "auto" else getattr(torch, dtype)


def check_device(device, name: str = "device"):
    """The ``torch.device`` of ``device``, refused (ValueError naming ``name``) when this machine has no such
    device: ``cuda`` without CUDA, ``cuda:3`` with 2 GPUs, ``mps`` without Metal, a malformed name.

    Examples
    --------
    >>> from otspec.decoding._models import check_device
    >>> check_device("cpu")
    device(type='cpu')
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"`{name}` must name a torch device such as 'cpu', 'cuda' or 'cuda:1', got {device!r}") \
            from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"`{name}`={device!r}, but this machine has no CUDA device "
                             "(torch.cuda.is_available() is False): use 'cpu'")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"`{name}`={device!r}, but this machine has {n} CUDA device(s): cuda:0 to cuda:{n - 1}")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"`{name}`={device!r}, but this machine has no MPS device: use 'cpu'")
    elif dev.type != "cpu":
        try:
            torch.empty(0, device=dev)
        except (RuntimeError, AssertionError):
            raise ValueError(f"`{name}`={device!r} is not a device this machine has") from None
    return dev


@contextlib.contextmanager
def _progress_bars(transformers, show: bool):
    """transformers' (and the hub's) progress bars on or off for the block; the previous setting is restored."""
    log = transformers.utils.logging
    was = log.is_progress_bar_enabled()
    (log.enable_progress_bar if show else log.disable_progress_bar)()
    try:
        yield
    finally:
        if was != show:
            (log.enable_progress_bar if was else log.disable_progress_bar)()


def checkpoint_vocab(name_or_path) -> int:
    """Width of a checkpoint's output layer, from its config alone (no weights loaded): ``config.vocab_size``.

    Raises
    ------
    OSError
        No config at ``name_or_path`` (transformers' message).
    """
    transformers = require("transformers", "checkpoint_vocab")
    cfg = transformers.AutoConfig.from_pretrained(str(name_or_path))
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return int(cfg.vocab_size)


def load_pair(draft, target, *, dtype: str = "auto", device="cpu", draft_device=None):
    r"""Load a draft and a target checkpoint (folder or hub name) as :class:`HFCausalLM`, checked first.

    .. math::

        V_{\text{draft}} = V_{\text{target}}

    is required (read from both configs). Every check comes before any
    weight is loaded: the ``dtype`` name, both devices (a device this
    machine lacks is refused), the two vocabularies.

    Parameters
    ----------
    draft, target : str or path
        Checkpoint folders (``save_pretrained``) or names.
    dtype : {"auto", "bfloat16", "float16", "float32"}, keyword-only
        ``"auto"``: each checkpoint's own dtype.
    device : str or torch.device, keyword-only
        The target's device (and the draft's, unless ``draft_device``).
    draft_device : str or torch.device, optional, keyword-only

    Returns
    -------
    draft, target : HFCausalLM

    Raises
    ------
    ValueError
        An unknown ``dtype``, a device this machine lacks, vocabularies that differ.
    OSError
        A folder or name without a config.

    Examples
    --------
    >>> import tempfile, torch, transformers
    >>> from otspec.decoding._models import load_pair
    >>> cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    >>> folder = tempfile.mkdtemp()
    >>> transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    >>> d, t = load_pair(folder, folder, dtype="bfloat16")
    >>> t.model.dtype, t.vocab_size
    (torch.bfloat16, 8)
    """
    dt = check_dtype(dtype)
    tdev = check_device(device, "device")
    ddev = tdev if draft_device is None else check_device(draft_device, "draft_device")
    vd, vt = checkpoint_vocab(draft), checkpoint_vocab(target)
    if vd != vt:
        raise ValueError(f"`draft` and `target` must share one vocabulary, got vocab_size {vd} ({draft}) and "
                         f"{vt} ({target})")
    return (HFCausalLM.from_pretrained(draft, dtype=dt, device=ddev),
            HFCausalLM.from_pretrained(target, dtype=dt, device=tdev))



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


def takes_last(lm, depth: int = 4) -> bool:
    """Whether ``lm.logits`` takes the keyword ``last`` (:class:`LanguageModel`: the last positions' logits
    only): a parameter of that name, or a wrapper whose ``logits(*args, **kwargs)`` passes keywords on to a
    wrapped ``lm.lm`` that takes it (at most ``depth`` wrappers deep). Anything else is called without it.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM
    >>> takes_last(CallableLM(lambda ids: torch.zeros(ids.shape + (3,)), vocab_size=3))
    True
    """
    try:
        params = inspect.signature(lm.logits).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    if "last" in params:
        return True
    passes = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    inner = lm.__dict__.get("lm") if hasattr(lm, "__dict__") else None
    return passes and inner is not None and depth > 0 and takes_last(inner, depth - 1)


def _check_last(last, t: int):
    """``last`` of :meth:`LanguageModel.logits`: ``None`` (all ``t`` positions) or an int in ``[1, t]``."""
    if last is None:
        return None
    if isinstance(last, bool) or not isinstance(last, numbers.Integral):
        raise TypeError(f"`last` must be None or an int, got {type(last).__name__}")
    if not 1 <= last <= t:
        raise ValueError(f"`last` must lie in [1, {t}] (the positions fed), got {last}")
    return int(last)


def _logits_keyword(model) -> str | None:
    """The keyword of ``model.forward`` that limits its output layer to the last positions: ``logits_to_keep``
    (transformers >= 4.50), ``num_logits_to_keep`` (4.45-4.49), or ``None`` (the logits are sliced after)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        return None
    return next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)


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


def _to_device(a, device):
    """Host ints (a list or an array) as an int64 tensor on ``device``, copied without waiting for the device's
    queued work (``non_blocking``: a blocking copy to a GPU synchronises its stream; from pageable host memory
    the copy is staged at once, so ``a`` may be dropped after the call)."""
    return torch.as_tensor(np.asarray(a, dtype=np.int64)).to(device, non_blocking=True)


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


# ----------------------------------------------------------------------------- draft trees
#: Most draft tokens ``n`` of a tree scored in one call (Medusa's and EAGLE-2's trees have 60-64, Sequoia's up to
#: 768), and most cells ``B (n + 1)^2`` of the ancestor table of a batch of ``B`` trees (64 MiB of bools).
MAX_TREE_NODES = 2048
MAX_TREE_CELLS = 1 << 26
#: attention implementations of transformers that add a 4-D float attention mask as given
_MASK_ATTENTION = ("eager", "sdpa")


class _TreeBatch:
    """Validated arrays of one tree-scoring call: ``B`` trees of ``n + 1`` nodes each (padding nodes allowed)."""

    __slots__ = ("batched", "B", "n", "t0", "parents", "tokens", "tokens_t", "depth", "real", "anc", "pending",
                 "keep", "V", "ids", "lost")

    def path(self, r: int, a: int) -> list[int]:
        """The nodes on the root path of node ``a`` of tree ``r``, root excluded, root first."""
        out = []
        while a > 0:
            out.append(a)
            a = int(self.parents[r, a])
        return out[::-1]


def _int_array(x, name: str) -> np.ndarray:
    """``x`` as a numpy array of integers (a copy where ``x`` is a tensor); TypeError / ValueError naming ``name``."""
    if x is None or isinstance(x, (str, bytes)):
        raise TypeError(f"`{name}` must be an array of ints, got {type(x).__name__}")
    if torch.is_tensor(x):
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except ValueError:
        raise ValueError(f"`{name}` must be a rectangular array of ints, got ragged rows") from None
    if a.size and (a.dtype == bool or not np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"`{name}` must hold ints, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def _where(batched: bool, r: int) -> str:
    return f" in row {r}" if batched else ""


def _tensor_tokens(tokens):
    """A tensor ``tokens`` checked by its metadata alone (dtype, shape; no value read, no synchronisation), and a
    placeholder array of its shape for the structural checks (``None`` where ``tokens`` is no tensor)."""
    if not torch.is_tensor(tokens):
        return None, None
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(f"`tokens` must hold ints, got dtype {tokens.dtype}")
    return tokens, np.full(tuple(tokens.shape), -1, dtype=np.int64)


def _tree_batch(parents, tokens, pending, keep, V: int) -> _TreeBatch:
    """Check the arguments of ``tree_logits`` (see :meth:`HFCausalLM.tree_logits`) before any work; a tensor
    ``tokens`` by its dtype and shape only (its values are checked on its device by :func:`_node_ids`)."""
    if torch.is_tensor(parents):
        return _device_tree_batch(parents, tokens, pending, keep, V)
    tok_t, tok = _tensor_tokens(tokens)
    par = _int_array(parents, "parents")
    tok = _int_array(tokens, "tokens") if tok_t is None else tok
    if tok.ndim not in (1, 2) or tok.shape[-1] < 1 or tok.size < 1:
        raise ValueError(f"`tokens` must have shape (n+1,) or (B, n+1) with B, n+1 >= 1, got {tok.shape}")
    batched = tok.ndim == 2
    if par.ndim not in (1, 2) or (par.ndim == 2 and not batched) or par.shape[-1] != tok.shape[-1] or (
            par.ndim == 2 and par.shape[0] != tok.shape[0]):
        also = f" or {tok.shape}" if batched else ""
        raise ValueError(f"`parents` must have shape ({tok.shape[-1]},){also} (the nodes of `tokens`), got {par.shape}")
    tok2 = tok if batched else tok[None]
    B, m = tok2.shape
    n = m - 1
    if n > MAX_TREE_NODES:
        raise ValueError(f"`tokens` holds n = {n} draft nodes per tree, above MAX_TREE_NODES = {MAX_TREE_NODES}")
    if B * m * m > MAX_TREE_CELLS:
        raise ValueError(f"`tokens` of shape {tok.shape} needs B (n+1)^2 = {B * m * m} ancestor cells, above "
                         f"MAX_TREE_CELLS = {MAX_TREE_CELLS}: score fewer or smaller trees per call")
    par2 = np.broadcast_to(par, (B, m))
    for arr, name, why in ((par2, "parents", "node 0 is the root, the context"),
                           (tok2, "tokens", "the root carries no draft token")):
        bad = np.flatnonzero(arr[:, 0] != -1)
        if bad.size:
            r = int(bad[0])
            raise ValueError(f"`{name}[0]` must be -1 ({why}), got {int(arr[r, 0])}{_where(batched, r)}")
    idx = np.arange(m)
    bad = np.argwhere((par2[:, 1:] < -1) | (par2[:, 1:] >= idx[None, 1:]))
    if bad.size:
        r, i = int(bad[0, 0]), int(bad[0, 1]) + 1
        raise ValueError(f"`parents` must satisfy -1 <= parents[i] < i (every parent before its children), got "
                         f"parents[{i}] = {int(par2[r, i])}{_where(batched, r)}")
    real = par2 != -1
    real[:, 0] = True
    if tok_t is not None:
        tok2 = np.where(real, 0, -1)  # the values stay on the device: the checks below see valid ids
        tok2[:, 0] = -1
    bad = np.argwhere(~real & (tok2 != -1))
    if bad.size:
        r, i = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(f"a padding node (parents[i] = -1, i >= 1) must have tokens[i] = -1, got tokens[{i}] = "
                         f"{int(tok2[r, i])}{_where(batched, r)}")
    bad = np.argwhere(real & (idx[None, :] > 0) & ((tok2 < 0) | (tok2 >= V)))
    if bad.size:
        r, i = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(f"`tokens` must hold token ids in [0, {V}) at the draft nodes, got tokens[{i}] = "
                         f"{int(tok2[r, i])}{_where(batched, r)}")
    rows = np.arange(B)
    depth = np.zeros((B, m), dtype=np.int64)
    anc = np.zeros((B, m, m), dtype=bool)
    anc[:, 0, 0] = True
    for i in range(1, m):
        p = np.maximum(par2[:, i], 0)
        lost = real[:, i] & ~real[rows, p]
        if lost.any():
            r = int(np.flatnonzero(lost)[0])
            raise ValueError(f"`parents[{i}]` = {int(p[r])} is a padding node (parents[{int(p[r])}] = -1): a draft "
                             f"node's parent must be a node{_where(batched, r)}")
        anc[:, i] = anc[rows, p]
        anc[:, i, i] = True
        depth[:, i] = depth[rows, p] + 1
    anc[~real] = False                      # a padding node sees the context and itself only
    anc[:, :, 0] = True
    anc[:, idx, idx] = True
    pen = _pending_rows(pending, B, V)
    tb = _TreeBatch()
    tb.batched, tb.B, tb.n, tb.t0 = batched, B, n, int(pen.shape[1])
    tb.parents, tb.tokens, tb.depth, tb.real, tb.anc = par2, None if tok_t is not None else tok2, depth, real, anc
    tb.tokens_t = None if tok_t is None else tok_t.reshape(B, m)
    tb.V, tb.ids, tb.lost = V, None, None
    tb.pending = np.broadcast_to(pen, (B, tb.t0))
    tb.keep = None if keep is None else _kept_nodes(keep, tb)
    return tb


def _pending_rows(pending, B: int, V: int) -> np.ndarray:
    """``pending`` of ``tree_logits`` checked, as a ``(1, t)`` or ``(B, t)`` array."""
    pen = _int_array(pending, "pending")
    if pen.ndim == 1:
        pen = pen[None]
    if pen.ndim != 2 or pen.shape[0] not in (1, B) or pen.shape[1] < 1:
        raise ValueError(f"`pending` must have shape (t,) or ({B}, t) with t >= 1 (at least the context's last "
                         f"token, the root's), got {np.shape(pending)}")
    if pen.min() < 0 or pen.max() >= V:
        raise ValueError(f"`pending` must hold token ids in [0, {V}), got {int(pen.min() if pen.min() < 0 else pen.max())}")
    return pen


def _device_tree_batch(parents, tokens, pending, keep, V: int) -> _TreeBatch:
    r"""``tree_logits``'s arguments with ``parents`` a tensor: one tree, or a batch of trees (``(B, n + 1)``, each row
    its own tree), whose structure stays on its device, never read on the host (a decoder or a profile whose trees
    are chosen on the device, as EAGLE-2's are). Dtypes and shapes are checked; the ancestor table and the depths
    are built there (:func:`_ancestors_on_device`); a padding node (``parents[i] = -1``, ``i >= 1``) gives NaN rows
    as on the host route, and a parent outside ``[-1, i)`` at node ``i >= 1`` or a padding parent, which only a read
    could refuse, makes the rows of that node and of its descendants NaN (as an out-of-range token does)."""
    if not torch.is_tensor(tokens):
        raise TypeError(f"`parents` as a tensor needs `tokens` as a tensor too (the tree stays on the device), got "
                        f"{type(tokens).__name__}")
    for x, name in ((parents, "parents"), (tokens, "tokens")):
        if x.dtype == torch.bool or x.is_floating_point() or x.is_complex():
            raise TypeError(f"`{name}` must hold ints, got dtype {x.dtype}")
    if parents.ndim not in (1, 2) or parents.shape[-1] < 1 or parents.numel() < 1:
        raise ValueError(f"`parents` as a tensor must have shape (n+1,) (one tree) or (B, n+1) (a batch of trees) "
                         f"with B, n+1 >= 1, got {tuple(parents.shape)}")
    shared = parents.ndim == 1 and tokens.ndim == 2  # one structure for a batch of trees
    if tuple(tokens.shape) != tuple(parents.shape) and not (shared and tokens.shape[1] == parents.shape[0]):
        raise ValueError(f"`tokens` must have the shape of `parents` {tuple(parents.shape)}, got "
                         f"{tuple(tokens.shape)}")
    if keep is not None:
        raise TypeError("`keep` needs the tree's structure on the host: pass `parents` as an array")
    batched = tokens.ndim == 2
    B, m = (int(tokens.shape[0]), int(tokens.shape[1])) if batched else (1, int(tokens.shape[0]))
    n = m - 1
    if n > MAX_TREE_NODES:
        raise ValueError(f"`tokens` holds n = {n} draft nodes per tree, above MAX_TREE_NODES = {MAX_TREE_NODES}")
    if B * m * m > MAX_TREE_CELLS:
        raise ValueError(f"`tokens` of shape {tuple(tokens.shape)} needs B (n+1)^2 = {B * m * m} ancestor cells, "
                         f"above MAX_TREE_CELLS = {MAX_TREE_CELLS}: score fewer or smaller trees per call")
    pen = _pending_rows(pending, B, V)
    anc, depth, lost = _ancestors_on_device(parents.reshape(-1, m).expand(B, m))
    tb = _TreeBatch()
    tb.batched, tb.B, tb.n, tb.t0 = batched, B, n, int(pen.shape[1])
    tb.parents, tb.tokens, tb.tokens_t = None, None, tokens.reshape(B, m)
    tb.anc, tb.depth, tb.lost = anc, depth, lost
    tb.real = np.ones((B, m), dtype=bool)  # the padding nodes are among the lost ones (NaN rows)
    tb.V, tb.ids, tb.keep = V, None, None
    tb.pending = np.broadcast_to(pen, (B, tb.t0))
    return tb


def _ancestors_on_device(parents):
    r"""The ancestor table, depths and unusable nodes of ``B`` trees whose ``(B, m)`` parents are a tensor, built on
    its device with no host read.

    .. math::

        A_0[i, j] = [\, j \in \{i, \pi(i)\} \,], \qquad
        A_{s+1}[i] = A_s[i] \lor A_s[\pi^{2^s}(i)], \qquad \pi^{2^{s+1}} = \pi^{2^s} \circ \pi^{2^s},

    pointer jumping: after :math:`s` steps row :math:`i` holds the nodes up to :math:`2^s` steps above it, so
    :math:`\lceil \log_2 n 
ceil` steps (row gathers of ``(B, m, m)`` bools) reach every ancestor of a tree of
    ``n = m - 1`` draft nodes, whatever its depth (the root is its own parent here). ``depth[i]`` is the number of
    ancestors of ``i`` but itself. A padding node (parent ``-1``) hangs from the root (depth 1, seeing only the
    context and itself, as the host route lays it out); a parent outside ``[-1, i)`` is read as the root too. Both,
    and every node below one, are ``lost`` (their rows NaN).

    Returns
    -------
    anc : (B, m, m) bool tensor
    depth : (B, m) int64 tensor
    lost : (B, m) bool tensor
    """
    dev = parents.device
    B, m = (int(x) for x in parents.shape)
    idx = torch.arange(m, device=dev)
    par = parents.to(torch.long)
    draft = idx > 0
    off = draft & ((par < 0) | (par >= idx))  # padding (-1) and bad parents: both lost
    jump = torch.where(off | ~draft, 0, par)
    anc = torch.eye(m, dtype=torch.bool, device=dev).expand(B, m, m).clone()
    anc.scatter_(2, jump[:, :, None], True)
    for _ in range(max(m - 2, 1).bit_length()):  # 2^s >= n steps after s
        anc |= anc.gather(1, jump[:, :, None].expand(B, m, m))
        jump = jump.gather(1, jump)
    return anc, anc.sum(-1) - 1, (anc & off[:, None, :]).any(-1)


def _on(a, device):
    """A host array as a tensor on ``device`` (copied without waiting), a tensor as it is."""
    return a if torch.is_tensor(a) else torch.from_numpy(np.ascontiguousarray(a)).to(device, non_blocking=True)


#: Tensors of :func:`_shape_on`, by device and content (at most :data:`_SHAPES_KEPT`; then made afresh).
_SHAPES: dict = {}
_SHAPES_KEPT = 256


def _shape_on(a, device):
    """A host array of a tree's shape (ancestor masks, depths, the real nodes of a batch) as a tensor on
    ``device``, made once per content and device: a walk drafting trees of static shapes copies each to the
    device once per run instead of once per call. Never written to by its users; a tensor is returned as it is."""
    if torch.is_tensor(a):
        return a
    a = np.ascontiguousarray(a)
    key = (str(device), a.dtype.str, a.shape, a.tobytes())
    t = _SHAPES.get(key)
    if t is None:
        if len(_SHAPES) >= _SHAPES_KEPT:
            _SHAPES.clear()
        t = _SHAPES[key] = _on(a.copy(), device)  # its own memory: on the CPU a tensor shares the array's
    return t


def _kept_nodes(keep, tb: _TreeBatch):
    """``keep`` as one node per tree (``None`` when every tree keeps its root: nothing beyond the context)."""
    if isinstance(keep, numbers.Integral) and not isinstance(keep, bool):
        k = np.full(tb.B, int(keep), dtype=np.int64)
    else:
        if not tb.batched:
            raise TypeError(f"`keep` must be an int (a node of the tree), got {type(keep).__name__}")
        k = _int_array(keep, "keep")
        if k.shape != (tb.B,):
            raise ValueError(f"`keep` must be an int or one node per tree, shape ({tb.B},), got shape {k.shape}")
    for r, a in enumerate(k.tolist()):
        if not 0 <= a <= tb.n or not tb.real[r, a]:
            raise ValueError(f"`keep` must name a node of the tree, in [0, {tb.n}] and not a padding node, "
                             f"got {a}{_where(tb.batched, r)}")
    return None if not k.any() else k


def _check_fallback(fallback) -> None:
    if fallback is not None and fallback != "rows":
        raise ValueError(f"`fallback` must be None or 'rows', got {fallback!r}")


def _tree_refusal(model) -> str | None:
    """Why ``model`` cannot score a tree in one forward with a 4-D attention mask (``None``: it can)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        params = {}
    missing = [k for k in ("attention_mask", "position_ids") if k not in params]
    if missing:
        return f"its forward takes no {' and no '.join(f'`{k}`' for k in missing)}"
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None)
    if impl is None:
        return "its config names no attention implementation (`config._attn_implementation`)"
    if impl not in _MASK_ATTENTION:
        return (f"its attention implementation {impl!r} does not add a 4-D float attention mask "
                f"(eager and sdpa do)")
    layer_types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if window is not None and (not layer_types or any("sliding" in str(t) for t in layer_types)):
        return f"it has sliding-window attention (window {window}), which a 4-D mask over the context would override"
    return None


def _node_ids(tb: _TreeBatch, device):
    """The ids fed for the nodes, ``(B, n + 1)`` int64 on ``device`` (0 at the root and at padding nodes), and the
    nodes whose logits are meaningless: ``None`` for host ``tokens`` (checked before the call), else the draft
    nodes of a tensor ``tokens`` with an id outside ``[0, V)`` and their descendants (``(B, n + 1)`` bool, read
    on the device only). Computed once per call (kept in ``tb``)."""
    if tb.ids is None and tb.tokens_t is None:
        tb.ids = torch.from_numpy(np.where(tb.real, tb.tokens, 0)).to(device, non_blocking=True).clamp_(min=0), None
    if tb.ids is not None:
        return tb.ids
    real = _shape_on(tb.real & (np.arange(tb.n + 1) > 0)[None], device)
    tok = on_device(tb.tokens_t, device, torch.long, non_blocking=True)
    wrong = real & ((tok < 0) | (tok >= tb.V))
    anc = _shape_on(tb.anc, device)
    lost = (anc & wrong[:, None, :]).any(-1)
    tb.ids = torch.where(real & ~wrong, tok, 0), lost if tb.lost is None else lost | tb.lost
    return tb.ids


def _tree_layout(tb: _TreeBatch, L: int, pad, device):
    r"""Input ids ``(B, t0 + n)``, boolean mask ``(B, t0 + n, L + t0 + n)`` and position ids of one tree call.

    Query ``q`` sits at column ``L + q``: the ``t0`` pending tokens first (causal), then nodes ``1..n``.
    A node sees columns ``< L + t0`` (the context) and the columns of its ancestors and itself; the
    node of depth ``d`` takes position ``L + t0 - 1 + d`` (minus the row's padding).
    """
    B, n, t0 = tb.B, tb.n, tb.t0
    Q, K = t0 + n, L + t0 + n
    pen = torch.from_numpy(np.array(tb.pending)).to(device, non_blocking=True)
    ids = torch.cat([pen, _node_ids(tb, device)[0][:, 1:]], dim=1)
    q = torch.arange(Q, device=device)
    cols = torch.arange(K, device=device)
    mask = (cols[None, :] <= torch.clamp(L + q, max=L + t0 - 1)[:, None]).expand(B, Q, K).clone()
    mask[:, t0:, L + t0:] = _shape_on(tb.anc, device)[:, 1:, 1:]
    depth = _shape_on(tb.depth, device)[:, 1:]
    pos = torch.cat([(L + q[:t0]).expand(B, t0), L + t0 - 1 + depth], dim=1)
    if pad is not None:
        mask &= cols[None, None, :] >= pad[:, None, None]
        mask[:, q, L + q] = True            # every query sees itself (a padding query would see nothing)
        pos = (pos - pad[:, None]).clamp(min=0)
    return ids, mask, pos


def _kept_columns(tb: _TreeBatch, L: int, path_cols: list[list[int]]):
    """Columns of each row kept by ``keep``: the context, then its kept path, rows realigned on the right by
    left padding (``shift[r]`` more columns for a path shorter than the longest kept)."""
    D = max(len(c) for c in path_cols)
    shift = np.array([D - len(c) for c in path_cols], dtype=np.int64)
    cols = np.array([[0] * int(s) + list(range(L + tb.t0)) + list(c) for s, c in zip(shift, path_cols)],
                    dtype=np.int64)
    return cols, shift


def _shifted_pad(pad, rows, shift, device):
    """The padding of the kept rows plus their realignment (``None`` when no row is padded)."""
    shift = torch.as_tensor(shift, device=device)
    new = shift if pad is None else pad[rows] + shift
    return new if bool(new.any()) else None


def _gather_kv(t, rows, cols):
    """Rows ``rows`` of a ``(B, H, T, D)`` key or value tensor, columns ``cols[r]`` of each kept row ``r``."""
    t = t[rows]
    return torch.gather(t, 2, cols[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))


def _gatherable(cache) -> bool:
    """Whether ``_gather_cache`` can rewrite ``cache`` (a transformers ``DynamicCache`` of full-attention layers)."""
    if cache is None:
        return True
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return all(type(layer).__name__ == "DynamicLayer" for layer in layers)
    return isinstance(getattr(cache, "key_cache", None), list) and isinstance(getattr(cache, "value_cache", None), list)


def _view_cache(cache, rows: list[int], batch: int, old: int, length: int) -> bool:
    """Keep rows ``rows`` of ``cache``, its first ``length`` of ``old`` columns, by one strided view per key and
    value tensor (``as_strided``: one op, no copy), where the rows are evenly spaced (one row, or ``r0, r0 + s, ...``
    with ``s >= 1``) and the cache is a transformers (>= 4.56) ``DynamicCache`` of full-attention layers each holding
    ``batch`` rows of ``old`` columns. Otherwise nothing is done and ``False`` is returned (the caller gathers and crops).

    The view holds the values a gather of the rows and a crop would hold, bit for bit (the same entries); it shares
    the storage of the tensors it is made of, which the next call's concatenation (``DynamicLayer.update``) copies
    into a fresh tensor, as every call does. It saves an op per tensor (a gather and a crop are two) and, on a GPU, a
    kernel launch and a copy of the kept rows per tensor."""
    layers = getattr(cache, "layers", None)
    if not layers or not _gatherable(cache):
        return False
    step = rows[1] - rows[0] if len(rows) > 1 else 1
    if step < 1 or any(b - a != step for a, b in zip(rows, rows[1:])):
        return False
    held = []
    for layer in layers:
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if k is None or v is None:
            continue
        ks, vs = k.shape, v.shape  # read once (each read of a tensor's attribute is a torch call)
        if len(ks) == 1 and ks[0] == 0:  # not filled (what gather and crop leave alone too)
            continue
        if len(ks) != 4 or len(vs) != 4 or (ks[0], ks[2], vs[0], vs[2]) != (batch, old, batch, old):
            return False
        held.append((layer, ks, vs))
    n = len(rows)
    for layer, ks, vs in held:
        for name, shape in (("keys", ks), ("values", vs)):
            t = getattr(layer, name)
            s0, s1, s2, s3 = t.stride()
            setattr(layer, name, t.as_strided((n, shape[1], length, shape[3]), (s0 * step, s1, s2, s3),
                                              t.storage_offset() + rows[0] * s0))
    return True


def _gather_cache(cache, rows, cols) -> None:
    """Keep rows ``rows`` of ``cache``, columns ``cols[r]`` of each (in place)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers >= 4.56
        for layer in layers:
            if getattr(layer, "keys", None) is not None:
                layer.keys = _gather_kv(layer.keys, rows, cols)
                layer.values = _gather_kv(layer.values, rows, cols)
        return
    for kv in (cache.key_cache, cache.value_cache):  # pragma: no cover - transformers 4.45-4.55
        for i, t in enumerate(kv):
            kv[i] = _gather_kv(t, rows, cols)


def _finish_tree(logits, tb: _TreeBatch, wrong=None):
    """The tree's ``(B, n + 1, V)`` logits, NaN at padding nodes (and at the nodes ``wrong`` of :func:`_node_ids`);
    ``(n + 1, V)`` for one unbatched tree. ``logits`` is the call's own fresh tensor (a model's output, or rows
    gathered from it), written in place: no copy of the tree's logits per call."""
    if not tb.real.all():
        _nan_rows(logits, torch.from_numpy(~tb.real).to(logits.device, non_blocking=True))
    if wrong is not None:
        _nan_rows(logits, wrong)
    return logits if tb.batched else logits[0]


def _nan_rows(logits, rows) -> None:
    """NaN in place at the rows ``rows`` (bool, ``logits.shape[:-1]``) of ``logits``: on the CPU at the rows' indices
    (finding them waits for nothing there, and only those rows are written: a boolean index, like a masked fill,
    would pass over every entry), elsewhere by a masked fill (no host read)."""
    if logits.device.type == "cpu":
        logits[rows.nonzero(as_tuple=True)] = math.nan
    else:
        logits.masked_fill_(rows[..., None], math.nan)


def _score_rows(lm, state, tb: _TreeBatch):
    r"""Score a batch of trees by rows: each root-to-leaf path of each tree as its own row, in one ``lm.logits``
    call (every tree gets ``k`` rows, the most leaves of a tree, repeating its first path; shorter paths are
    right-padded, which a causal model never sees). The state ends as after :meth:`HFCausalLM.tree_logits`.
    A tree whose structure is on the device (:func:`_device_tree_batch`): :func:`_score_node_rows`."""
    if tb.lost is not None:
        return _score_node_rows(lm, state, tb)
    B, n, t0 = tb.B, tb.n, tb.t0
    L = state.length
    has_child = np.zeros((B, n + 1), dtype=bool)
    for r, i in np.argwhere(tb.real[:, 1:]):
        has_child[r, tb.parents[r, i + 1]] = True
    leaf_of = np.zeros((B, n + 1), dtype=np.int64)
    paths = []
    for r in range(B):
        leaves = [i for i in range(1, n + 1) if tb.real[r, i] and not has_child[r, i]]
        rp = [tb.path(r, i) for i in leaves] or [[]]
        seen = set()
        for j, p in enumerate(rp):
            for a in p:
                if a not in seen:
                    seen.add(a)
                    leaf_of[r, a] = j
        paths.append(rp)
    k = max(len(p) for p in paths)
    D = int(tb.depth[tb.real].max())
    nodes = np.zeros((B * k, D), dtype=np.int64)  # node of each column of each row (0: right padding, id 0)
    for r, rp in enumerate(paths):
        for j in range(k):
            p = rp[min(j, len(rp) - 1)]
            nodes[r * k + j, : len(p)] = p
    node_ids, wrong = _node_ids(tb, lm.device)
    tree_of = torch.from_numpy(np.repeat(np.arange(B), k)).to(lm.device, non_blocking=True)
    tail = node_ids[tree_of[:, None], torch.from_numpy(nodes).to(lm.device, non_blocking=True)]
    pen = torch.from_numpy(np.repeat(tb.pending, k, axis=0)).to(lm.device, non_blocking=True)
    logits = lm.logits(state, torch.cat([pen, tail], dim=1))
    row = torch.from_numpy(np.arange(B)[:, None] * k + leaf_of).to(logits.device)
    col = torch.from_numpy(np.where(tb.real, t0 - 1 + tb.depth, t0 - 1)).to(logits.device)
    out = logits[row, col]
    if tb.keep is None:
        lm.select(state, [r * k for r in range(B)], L + t0)
    else:
        rows = [r * k + int(leaf_of[r, a]) for r, a in enumerate(tb.keep.tolist())]
        kept = [list(range(L + t0, L + t0 + int(tb.depth[r, a]))) for r, a in enumerate(tb.keep.tolist())]
        lm._take(state, rows, *_kept_columns(tb, L, kept))
    return _finish_tree(out, tb, wrong)


def _score_node_rows(lm, state, tb: _TreeBatch):
    """:func:`_score_rows` for trees whose structure stays on the device: every node's root path as its own row
    (``B (n + 1)`` rows of ``t0 + n`` columns, tree ``r``'s rows ``r (n + 1), ...``, right-padded: the leaves are not
    known on the host), one ``lm.logits`` call; the state ends holding the contexts."""
    B, n, t0 = tb.B, tb.n, tb.t0
    L = state.length
    dev = torch.device(lm.device)
    node_ids, wrong = _node_ids(tb, dev)
    anc, depth = tb.anc.to(dev), tb.depth.to(dev)
    m = n + 1
    cols = torch.arange(1, max(n, 1) + 1, device=dev)
    # node at depth c of each node's path (0, the root, past its end): one ancestor per depth
    at = anc[:, :, None, :] & (depth[:, None, None, :] == cols[None, None, :, None])
    path = (at.to(torch.long) * torch.arange(m, device=dev)).sum(-1)
    tail = node_ids.gather(1, path.reshape(B, -1)).reshape(B * m, -1)
    pen = torch.from_numpy(np.repeat(tb.pending, m, axis=0)).to(dev, non_blocking=True)
    logits = lm.logits(state, torch.cat([pen, tail], dim=1))
    out = logits[torch.arange(B * m, device=dev), t0 - 1 + depth.reshape(-1)]
    lm.select(state, 0 if B == 1 else [r * m for r in range(B)], L + t0)
    return _finish_tree(out.reshape((B, m) + tuple(out.shape[1:])), tb, wrong)


class _TreeScoring:
    """``score_tree``: float64 laws from a class's ``tree_logits``."""

    def score_tree(self, state, parents, tokens, *, pending, keep=None, fallback=None):
        r"""The target's next-token laws at the root and at every node of a draft tree, float64.

        .. math::

            q_{\text{nodes}}[i, y] = M(y \mid x_{1:T},\, \text{path}(i)), \qquad i = 0, 1, \dots, n,

        the softmax (temperature 1, float64) of :meth:`tree_logits`; row ``0`` is the law after the
        context. Same parameters, state handling and errors as :meth:`tree_logits`.

        Returns
        -------
        numpy.ndarray
            ``(n + 1, V)`` float64 (``(B, n + 1, V)`` for a batch of trees), rows summing to 1;
            rows of padding nodes are NaN.

        Examples
        --------
        >>> import torch
        >>> from otspec.decoding import CallableLM
        >>> lm = CallableLM(lambda ids: torch.nn.functional.one_hot(ids, 3).double() * 50, vocab_size=3)
        >>> lm.score_tree(lm.new_state(), [-1, 0, 0], [-1, 1, 2], pending=[0]).round(6).tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
        """
        x = self.tree_logits(state, parents, tokens, pending=pending, keep=keep, fallback=fallback)
        return torch.softmax(x.to(torch.float64), dim=-1).cpu().numpy()


class _HFState:
    __slots__ = ("cache", "length", "batch", "pad")

    def __init__(self):
        self.cache = None
        self.length = 0
        self.batch = 1
        self.pad = None  # (batch,) int64: leading padding columns of each row, or None (no row padded)


def _grow(state: _HFState, B: int) -> None:
    """Repeat the rows of an HF state (cache and padding) to ``B`` rows; give it a cache if it has none."""
    if state.batch != B:
        reps = _repeats(state.batch, B)
        if state.cache is not None and state.length > 0:
            state.cache.batch_repeat_interleave(reps)
        if state.pad is not None:
            state.pad = state.pad.repeat_interleave(reps)
    if state.cache is None:
        state.cache = _new_cache()


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


class HFCausalLM(_TreeScoring):
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
    >>> tuple(lm.logits(lm.new_state(), torch.tensor([[1, 2, 3]]), last=1).shape)  # the last position only
    (1, 1, 8)

    Prompts ``[5]`` and ``[3, 1, 5]`` in one left-padded batch (row 0 padded by 2):

    >>> both = lm.logits(lm.new_state(pad=[2, 0]), torch.tensor([[0, 0, 5], [3, 1, 5]]))
    >>> alone = lm.logits(lm.new_state(), torch.tensor([[5]]))
    >>> torch.allclose(both[0, -1], alone[0, -1], rtol=0, atol=1e-6)
    True
    """

    def __init__(self, model, *, name: str | None = None):
        if not isinstance(model, torch.nn.Module) or not callable(getattr(model, "forward", None)):
            raise TypeError(f"`model` must be a torch causal LM module, got {type(model).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"`name` must be a str or None, got {type(name).__name__}")
        emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if emb is not None and getattr(emb, "weight", None) is not None:
            v = int(emb.weight.shape[0])
        elif isinstance(getattr(getattr(model, "config", None), "vocab_size", None), numbers.Integral):
            v = int(model.config.vocab_size)
        else:  # checked before model.eval(): a refused module is left as it was
            raise TypeError(f"`model` must be a causal LM (output embeddings or config.vocab_size), got a "
                            f"{type(model).__name__} with neither")
        self.model = model.eval()
        self._vocab = v
        self.name = name or type(model).__name__
        self.n_calls = 0
        self._cache_kw = _cache_keyword(model)
        self._keep_kw = _logits_keyword(model)

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def device(self):
        return next(self.model.parameters()).device

    def _rows_index(self, rows: list[int]):
        """The kept rows of :meth:`select` as an int64 tensor on the model's device, made once per rows and device
        (a walk keeps the same few row sets at every step: one host-to-device copy each per run, not per call)."""
        key = (str(self.device), tuple(rows))
        memo = self.__dict__.setdefault("_rows_memo", {})
        if key not in memo:
            if len(memo) >= 64:  # bounded: a caller selecting ever new rows keeps at most 64 of them
                memo.clear()
            memo[key] = _to_device(rows, self.device)
        return memo[key]

    @classmethod
    def from_pretrained(cls, name_or_path, *, dtype="auto", device="cpu", name: str | None = None) -> HFCausalLM:
        r"""Load a checkpoint folder or name (``AutoModelForCausalLM``) in ``dtype`` on ``device``.

        .. math::

            \text{checkpoint} \mapsto \text{HFCausalLM}(\text{model in } \texttt{dtype} \text{ on } \texttt{device})

        No tokenizer is needed (the decoder takes token ids). The dtype and
        the device are checked before anything is read.

        Parameters
        ----------
        name_or_path : str or path
        dtype : {"auto", "bfloat16", "float16", "float32"} or torch.dtype, keyword-only
            ``"auto"``: the checkpoint's own dtype.
        device : str or torch.device, keyword-only
        name : str, optional, keyword-only
            A label (default: ``name_or_path``).

        Returns
        -------
        HFCausalLM

        Raises
        ------
        ValueError
            An unknown ``dtype``, a device this machine lacks.
        OSError
            Nothing loadable at ``name_or_path``.

        Examples
        --------
        See :func:`otspec.decoding._models.load_pair`.
        """
        dt = dtype if isinstance(dtype, torch.dtype) else check_dtype(dtype)
        dev = check_device(device)
        transformers = require("transformers", "HFCausalLM.from_pretrained")
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
        key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        with _progress_bars(transformers, False):
            model = transformers.AutoModelForCausalLM.from_pretrained(str(name_or_path), **{key: dt})
        return cls(model.to(dev), name=name or str(name_or_path))

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
    def logits(self, state: _HFState, input_ids, *, last: int | None = None):
        r"""Append ``input_ids`` to every row of ``state``; the logits at the new positions.

        .. math::

            \text{out}_{b, i} = \text{logits}(x_{b, 1:T - m + i}), \qquad i = 1, \dots, m,

        for the ``m = last`` last of the ``t`` positions fed (``m = t`` by default), ``T`` the state's length
        after the call. With ``last`` the model computes its output layer at those positions only
        (transformers' ``logits_to_keep``; sliced after the call for a model without that keyword), which is
        the whole saving of a prompt's prefill: the ``V``-wide layer at one position instead of every one.

        Parameters
        ----------
        state : state
            From :meth:`new_state`; updated in place (the cache holds all ``t`` positions whatever ``last``).
        input_ids : array_like or tensor of int, shape (B, t)
        last : int in [1, t], optional, keyword-only

        Returns
        -------
        torch.Tensor, shape (B, t, V) or (B, last, V)
            The model's own dtype, on its device.

        Raises
        ------
        ValueError
            ``input_ids`` not of shape ``(B, t)`` with ``t >= 1``; ``last`` outside ``[1, t]``; a padded
            state's first call not longer than its padding.
        TypeError
            ``last`` not an int.

        Examples
        --------
        The class example computes the output layer at the last position only with ``last=1``.
        """
        ids = (on_device(input_ids, self.device, torch.long) if torch.is_tensor(input_ids)
               else torch.as_tensor(input_ids, dtype=torch.long, device=self.device))
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise ValueError(f"`input_ids` must have shape (B, t) with t >= 1, got {tuple(ids.shape)}")
        B, t = int(ids.shape[0]), int(ids.shape[1])
        last = _check_last(last, t)
        _check_padded_call(state.pad, state.length, t)
        _grow(state, B)
        kw = {self._cache_kw: state.cache}
        if state.pad is not None:  # as generate() with left padding: the 2-D mask of cache + new tokens
            cols = torch.arange(state.length + t, device=self.device)
            kw["attention_mask"] = (cols[None, :] >= state.pad[:, None]).long()
            kw["position_ids"] = (cols[None, state.length:] - state.pad[:, None]).clamp(min=0)
        if last is not None and last < t and self._keep_kw is not None:
            kw[self._keep_kw] = last
        out = self.model(input_ids=ids, use_cache=True, **kw)
        self.n_calls += 1
        state.cache = getattr(out, self._cache_kw)  # out.cache (5.x) or out.past_key_values (4.x)
        state.length += int(ids.shape[1])
        state.batch = B
        logits = out.logits
        return logits if last is None or logits.shape[1] == last else logits[:, -last:]

    @torch.inference_mode()
    def select(self, state: _HFState, row: int | Sequence[int], length: int) -> None:
        rows = _kept_rows(row, state.batch)
        if not 0 <= length <= state.length:
            raise ValueError(f"`length` must lie in [0, {state.length}], got {length}")
        if state.cache is None:
            state.batch, state.length, state.pad = 1, 0, None
            return
        state.pad = _kept_pad(state.pad, rows, length)
        every = rows == list(range(state.batch))
        # rows kept by strided views (a cut of every row alone stays the cache's own crop: one view a tensor too)
        if 0 < length and not every and _view_cache(state.cache, rows, state.batch, state.length, length):
            state.batch, state.length = len(rows), length
            return
        if not every:
            state.cache.batch_select_indices(self._rows_index(rows))
            state.batch = len(rows)
        if length < state.length:
            if length == 0:
                state.cache, state.length = None, 0
                return
            # negative: remove that many tokens (transformers >= 4.45 and 5.x agree on this form)
            state.cache.crop(length - state.length)
        state.length = length

    @torch.inference_mode()
    def tree_logits(self, state: _HFState, parents, tokens, *, pending, keep=None, fallback: str | None = None):
        r"""Logits at the root and at every node of a draft tree, in one forward call (tree attention).

        .. math::

            \ell[i] = \text{logits}(x_{1:T},\, \text{path}(i))_{\text{last}}, \qquad
            \text{mask}[i, j] = [\, j \preceq i \,], \qquad
            \text{pos}(i) = T - 1 + \text{depth}(i),

        for the nodes ``i = 0..n`` of a tree in the node order of Medusa's buffers (``parents[0] = -1``,
        the root = the context; ``parents[i] < i``): node ``i`` attends to the whole context and to its
        ancestors and itself (:math:`j \preceq i`), never to its siblings or cousins, and the node of depth
        ``d`` takes the position it would have in its own sequence, ``T - 1 + d`` for a context of ``T``
        tokens (positions count from 0, so the root sits at the last context position ``T - 1``). Row
        ``0`` is the model's logits at the last context token; row ``i`` its logits after the root path
        of node ``i`` -- what scoring that path as its own row gives, up to float rounding.

        The state holds the context but for its last ``t >= 1`` tokens, ``pending`` (as a decoder keeps
        its state one token behind: the root needs its own logits); the call feeds ``pending`` and the
        ``n`` draft tokens as ``t + n`` columns, on top of the KV cache, with a 4-D mask (each row its
        own tree) and explicit position ids (a left-padded row counted from its first real token).
        Afterwards the state holds the context -- exactly what ``logits(state, pending)`` would leave,
        the tree's columns cropped off -- or, with ``keep=k``, the context followed by the root path of
        node ``k`` (of each tree its own ``k``; rows whose kept paths are shorter than the longest are
        realigned by left padding, which the padded state hides from every later call).

        Parameters
        ----------
        state : state of :meth:`new_state`
            Batch ``b`` dividing ``B``; its rows are repeated ``B / b`` times as in :meth:`logits`.
        parents : array of int or torch.Tensor of int, shape ``(n + 1,)`` or ``(B, n + 1)``
            ``parents[0] = -1``; ``-1 <= parents[i] < i``. In a batch, trees with fewer nodes are padded to
            ``n + 1`` nodes by padding nodes ``parents[i] = -1``, ``tokens[i] = -1`` (``i >= 1``). A tensor
            (``tokens`` a tensor of its shape, or ``(B, n + 1)`` for a 1-D one; no ``keep``; trees chosen on the
            device, as EAGLE-2's) is never read on the host: the attention mask and positions are built on the
            device (the ancestors by :math:`\lceil \log_2 n \rceil` pointer-jumping gathers), the row fallback
            scores every node's path as its own row, the logits are those of the same parents as an array (the
            same call), and a parent outside ``[-1, i)`` at node ``i >= 1`` or a padding parent makes the rows of
            that node and of its descendants NaN.
        tokens : array of int or torch.Tensor of int, shape ``(n + 1,)`` or ``(B, n + 1)``
            ``tokens[0] = -1``; the draft token of each node, in ``[0, V)``. A 2-D ``tokens`` makes a
            batch of ``B`` trees (sharing ``parents`` when it is 1-D). A tensor (on any device) is never
            read on the host -- no synchronisation, as a decoder on the models' device needs: its dtype and
            shape are checked, its root and padding entries ignored, and an id outside ``[0, V)`` at a draft
            node, which only a read could refuse, makes the rows of that node and of its descendants NaN
            (what a caller checking its laws for non-finite rows catches).
        pending : array of int, shape ``(t,)`` or ``(B, t)``, keyword-only
            The context's last ``t >= 1`` tokens, not yet in ``state`` (1-D: the same for every tree).
            On a new left-padded state they are the whole padded prompts and must reach past the padding.
        keep : int or sequence of int, optional, keyword-only
            A node of the tree (one per tree in a batch) whose root path stays in the cache after the
            call; ``None`` or ``0``: only the context stays.
        fallback : {None, 'rows'}, keyword-only
            What to do when the model cannot take a 4-D attention mask: refuse (``None``) or score each
            root-to-leaf path as its own row (``'rows'``: one :meth:`logits` call on ``B k`` rows, ``k``
            the most leaves of a tree; same result up to float rounding).

        Returns
        -------
        torch.Tensor
            ``(n + 1, V)`` logits (``(B, n + 1, V)`` for a batch of trees) on :attr:`device`, in the
            model's dtype; rows of padding nodes are NaN.

        Raises
        ------
        TypeError
            The model's forward cannot take a 4-D mask -- its attention implementation is not eager or
            sdpa (flash attention ignores such masks), it has sliding-window layers, or its forward takes
            no ``attention_mask`` / ``position_ids`` -- and ``fallback`` is not ``'rows'`` (the message
            names the model class and what is missing); ``keep`` with a cache that is not a
            ``DynamicCache``; arrays of non-integers; ``parents`` a tensor with ``tokens`` not one, or with
            ``keep``.
        ValueError
            A malformed tree (named entry), ``tokens`` or ``pending`` outside ``[0, V)``, more than
            :data:`MAX_TREE_NODES` nodes or :data:`MAX_TREE_CELLS` ancestor cells, a ``keep`` that is not
            a node, ``pending`` not reaching past the padding, or ``B`` not a multiple of the state's
            batch. Nothing is computed and the state is untouched.

        References
        ----------
        Miao et al., "SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative
        Inference and Verification", arXiv:2305.09781, §4.1 (tree-based parallel decoding: one
        topology-aware causal mask scores every node of a token tree). Cai et al., "Medusa: Simple LLM
        Inference Acceleration Framework with Multiple Decoding Heads", arXiv:2401.10774, §2.1.2 (tree
        attention; node order, mask and position ids as in its ``generate_medusa_buffers``).

        Examples
        --------
        A tree with two children of the root and a grandchild, scored in one call on a tiny GPT-2
        (absolute positions) against its two root-to-leaf paths scored as rows:

        >>> import torch, transformers
        >>> from otspec.decoding import HFCausalLM
        >>> _ = torch.manual_seed(0)
        >>> gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        ...     vocab_size=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
        >>> lm = HFCausalLM(gpt2)
        >>> state = lm.new_state()
        >>> _ = lm.logits(state, torch.tensor([[1, 2]]))       # the context [1, 2, 3], its last token pending
        >>> tree = lm.tree_logits(state, [-1, 0, 0, 1], [-1, 5, 6, 7], pending=[3])
        >>> tree.shape, state.length                             # the tree is dropped from the cache
        (torch.Size([4, 8]), 3)
        >>> rows = lm.logits(lm.new_state(), torch.tensor([[1, 2, 3, 5, 7], [1, 2, 3, 6, 7]]))
        >>> want = torch.stack([rows[0, 2], rows[0, 3], rows[1, 3], rows[0, 4]])
        >>> torch.allclose(tree, want, rtol=0, atol=1e-5)
        True
        """
        tb = _tree_batch(parents, tokens, pending, keep, self._vocab)
        _check_fallback(fallback)
        _check_padded_call(state.pad, state.length, tb.t0)
        _repeats(state.batch, tb.B)
        if tb.keep is not None and not _gatherable(state.cache):
            raise TypeError(f"`keep` needs a transformers DynamicCache of full-attention layers, got a "
                            f"{type(state.cache).__name__} in {type(self.model).__name__}")
        why = _tree_refusal(self.model)
        if why is not None:
            if fallback != "rows":
                raise TypeError(f"{type(self.model).__name__} ({self.name}) cannot score a draft tree in one forward: "
                                f"{why}; load it with attn_implementation='sdpa', or pass fallback='rows' to score "
                                "each root-to-leaf path as its own row")
            return _score_rows(self, state, tb)
        _grow(state, tb.B)
        L, t0, n = state.length, tb.t0, tb.n
        ids, mask, pos = _tree_layout(tb, L, state.pad, self.device)
        dtype = next(self.model.parameters()).dtype
        bias = torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill_(~mask, torch.finfo(dtype).min)
        kw = {self._cache_kw: state.cache}
        if t0 > 1 and self._keep_kw is not None:  # the output layer at the root and the nodes only, not the prompt's
            kw[self._keep_kw] = n + 1
        out = self.model(input_ids=ids, use_cache=True, attention_mask=bias[:, None], position_ids=pos, **kw)
        self.n_calls += 1
        state.cache = getattr(out, self._cache_kw)
        state.length, state.batch = L + t0 + n, tb.B
        if tb.keep is None:
            self.select(state, list(range(tb.B)), L + t0)
        else:
            kept = [[L + t0 - 1 + a for a in tb.path(r, a)] for r, a in enumerate(tb.keep.tolist())]
            self._take(state, list(range(tb.B)), *_kept_columns(tb, L, kept))
        return _finish_tree(out.logits[:, -(n + 1) :], tb, _node_ids(tb, self.device)[1])

    def _take(self, state: _HFState, rows: list[int], cols: np.ndarray, shift: np.ndarray) -> None:
        """Keep rows ``rows`` of the state, columns ``cols[r]`` of each, padded ``shift`` more columns."""
        r = _to_device(rows, self.device)
        _gather_cache(state.cache, r, _to_device(cols, self.device))
        state.pad = _shifted_pad(state.pad, r, shift, self.device)
        state.length, state.batch = int(cols.shape[1]), len(rows)

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


class CallableLM(_TreeScoring):
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
        if name is not None and not isinstance(name, str):
            raise TypeError(f"`name` must be a str or None, got {type(name).__name__}")
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ValueError(f"`device` must be a torch device or its name ('cpu', 'cuda:0'), got {device!r}") from exc
        self.fn = fn
        self._vocab = int(vocab_size)
        self._device = dev
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

    def logits(self, state: _SeqState, input_ids, *, last: int | None = None):
        """:meth:`HFCausalLM.logits` (``fn`` sees the whole sequence; ``last`` only slices its output)."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self._device)
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise ValueError(f"`input_ids` must have shape (B, t) with t >= 1, got {tuple(ids.shape)}")
        B, t = int(ids.shape[0]), int(ids.shape[1])
        last = _check_last(last, t)
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
        return out[:, -(t if last is None else last):]

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
            state.ids = state.ids[_to_device(rows, state.ids.device), :length]

    def tree_logits(self, state: _SeqState, parents, tokens, *, pending, keep=None, fallback: str | None = None):
        r"""Logits at the root and at every node of a draft tree, by rows (exact).

        .. math::

            \ell[i] = \text{fn}(x_{1:T},\, \text{path}(i))_{T - 1 + \text{depth}(i)}, \qquad i = 0, \dots, n.

        ``fn`` takes no attention mask, so each root-to-leaf path is scored as its own row, all in one
        :meth:`logits` call: exactly the logits of each path alone whenever ``fn`` computes its rows
        independently. Parameters, returns, the state afterwards and the errors are those of
        :meth:`HFCausalLM.tree_logits` (``fallback`` is checked and has no effect: this is the row route).

        Examples
        --------
        >>> import torch
        >>> from otspec.decoding import CallableLM
        >>> running_sum = lambda ids: ids.cumsum(1)[..., None].double().repeat(1, 1, 8)  # every logit
        >>> lm = CallableLM(running_sum, vocab_size=8)
        >>> state = lm.new_state()
        >>> lm.tree_logits(state, [-1, 0, 0, 1], [-1, 3, 4, 5], pending=[1, 2], keep=3)[:, 0].tolist()
        [3.0, 6.0, 7.0, 11.0]
        >>> state.ids.tolist()                    # the context, then the root path of node 3
        [[1, 2, 3, 5]]
        """
        tb = _tree_batch(parents, tokens, pending, keep, self._vocab)
        _check_fallback(fallback)
        _check_padded_call(state.pad, state.length, tb.t0)
        batch = state.ids.shape[0] if state.ids is not None else 1 if state.pad is None else state.pad.shape[0]
        _repeats(int(batch), tb.B)
        return _score_rows(self, state, tb)

    def _take(self, state: _SeqState, rows: list[int], cols: np.ndarray, shift: np.ndarray) -> None:
        """Keep rows ``rows`` of the state, columns ``cols[r]`` of each, padded ``shift`` more columns."""
        r = _to_device(rows, self._device)
        state.ids = state.ids[r[:, None], _to_device(cols, self._device)]
        state.pad = _shifted_pad(state.pad, r, shift, self._device)

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
    if not sequence_like(prefixes):  # an int or a 0-d array: "object is not iterable" named nothing
        raise TypeError(f"`prefixes` must be a sequence of token-id sequences, got {type(prefixes).__name__}")
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
