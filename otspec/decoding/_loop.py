r"""The speculative decoding loop and the autoregressive baseline.

Notation: ``p`` is the draft model's next-token law, ``q`` the target's
(Leviathan et al. use the opposite letters).
"""

from __future__ import annotations

import functools
import math
import numbers
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import otspec
import otspec.block
from otspec._verifier import sample_from
from otspec.block._verifiers import backward_law, draw_residual, remain_rej
from otspec.block._weights import float_chains, path_weight_rows, path_weights

from .._array import namespace
from .._registry import get_verifier, unknown_name_message
from .._validation import TORCH_SEEDS, sequence_like, validate_positive_int, validate_seed, validate_size
from ._deps import require
from ._models import HFCausalLM, _tree_refusal, takes_last, validate_language_model, validate_prompt
from ._sampling import Sampling, _block, _law_block, _laws_into, bad_logit_rows, bad_rows, draw_rows, sample_rows
from ._tree_device import (
    DEVICE_TREE_PROCESSES,
    DEVICE_TREE_VERIFIERS,
    _draws,
    _kernel_rows,
    device_tree_step,
    has_device_route,
)
from ._tree_loop import TreeStep, TreeSteps, check_with_tree, check_without_tree, tree_law_bytes, tree_plan
from ._verifiers import (
    DEVICE_VERIFIERS,
    Scheme,
    block_walk_t,
    check_multiblock_size,
    resolve_scheme,
    verify_block_onestep_t,
    verify_chain_t,
)

torch = require("torch", "otspec.decoding")

__all__ = ["ENGINES", "MAX_LAW_BYTES", "MAX_NEW_TOKENS", "DecodeResult", "BaselineResult", "speculative_decode",
           "autoregressive_decode", "make_rng", "law_bytes"]

#: Where a chain's verification runs (``speculative_decode(engine=...)``): ``"torch"`` on the models' device
#: (:data:`otspec.decoding._verifiers.DEVICE_VERIFIERS`), ``"numpy"`` on the host through the package's
#: verifiers (every verifier; the independent route), ``"auto"`` the first where the verifier has it.
ENGINES = ("auto", "torch", "numpy")
#: Largest memory for the laws of one iteration (:func:`law_bytes`), checked before any model call.
MAX_LAW_BYTES = 8 * 2**30
#: Largest ``max_new_tokens`` of one decoding run (:func:`speculative_decode`, :func:`autoregressive_decode`),
#: checked before any model call: a million tokens, past any model's context; ``10**18`` ran until interrupted.
MAX_NEW_TOKENS = 2**20
#: First laws kept on the device (``log_laws``) before their :math:`\alpha_K` are computed in one batch.
LAW_BATCH = 64


def law_bytes(V: int, k: int, L: int) -> int:
    r"""Bytes of the float64 laws one chain iteration holds on the device: :math:`8 V k (2L + 1)`.

    The draft laws ``(k, L, V)`` and the target laws ``(k, L + 1, V)``; the
    softmax of the target's logits needs one more block of the latter's size
    while it runs, which the check below counts as well.

    Parameters
    ----------
    V, k, L : int

    Returns
    -------
    int

    Examples
    --------
    >>> from otspec.decoding._loop import law_bytes
    >>> law_bytes(128_256, 1, 4) / 2**20  # MiB
    8.806640625
    """
    return 8 * int(V) * int(k) * (2 * int(L) + 1)


def _check_law_memory(V: int, k: int, L: int, devices) -> None:
    """Refuse (ValueError) an iteration whose laws exceed :data:`MAX_LAW_BYTES`, or the free memory of a CUDA
    device of the models (counting the softmax's temporary block), before any model call."""
    need = law_bytes(V, k, L)
    _refuse_memory(need, need + 8 * V * k * (L + 1), devices, "the softmax's temporary",
                   f"the float64 laws of one iteration, 8 * V * k * (2L + 1) bytes = {need / 2**30:.2f} GiB for V={V}, "
                   f"k={k}, L={L}", "use a smaller `k` or `L`")


def _refuse_memory(need: int, peak: int, devices, extra: str, what: str, fix: str) -> None:
    """ValueError ``"{what}, exceed {where}: {fix}"`` where ``need`` bytes of laws pass :data:`MAX_LAW_BYTES` or
    ``peak`` bytes (the laws with ``extra``) the free memory of a CUDA device among ``devices``."""
    free = None
    for dev in devices:
        if dev.type == "cuda":
            f = int(torch.cuda.mem_get_info(dev)[0])
            free = f if free is None else min(free, f)
    if need > MAX_LAW_BYTES or (free is not None and peak > free):
        where = (f"MAX_LAW_BYTES = {MAX_LAW_BYTES / 2**30:.1f} GiB" if need > MAX_LAW_BYTES
                 else f"the {free / 2**30:.2f} GiB free on the device (with {extra}: {peak / 2**30:.2f} GiB)")
        raise ValueError(f"{what}, exceed {where}: {fix}")


def _check_tree_memory(plan, tree, V: int, sampling, device_route: bool, prompt: int, log_laws: bool,
                       draft, target) -> None:
    """:func:`_check_law_memory` for a draft tree (:func:`~otspec.decoding._tree_loop.tree_law_bytes`): its float64
    laws against :data:`MAX_LAW_BYTES`, with the logits and temporaries against a CUDA device's free memory."""
    by_rows = isinstance(target, HFCausalLM) and _tree_refusal(target.model) is not None
    if not by_rows and getattr(target, "_keep_kw", None) is not None:
        prompt = 1  # the tree call's output layer at the root and the nodes only (transformers' logits_to_keep)
    parts = tree_law_bytes(plan, V, sampling, device=device_route, prompt=prompt, log_laws=log_laws,
                           law_batch=LAW_BATCH, by_rows=by_rows)
    need = parts["laws"] + parts["root laws"]
    name = repr(tree) if isinstance(tree, str) else f"a {plan.process!r} tree"
    sizes = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in parts.items() if v)
    devices = {torch.device(draft.device), torch.device(target.device)}
    _refuse_memory(need, sum(parts.values()), devices, "the logits and temporaries",
                   f"the float64 laws of one iteration of `tree`={name} ({plan.shape.n} draft nodes, depth {plan.L}, "
                   f"{'device' if device_route else 'host'} route), {need / 2**30:.2f} GiB at V={V} ({sizes})",
                   "use a tree of fewer nodes" + (", or log_laws=False (no root laws kept)" if parts["root laws"]
                                                   else ""))


def _clock(*devices) -> float:
    """The decoder's one clock: :func:`time.perf_counter` after synchronising the CUDA devices among ``devices``
    (a no-op on the CPU), so no queued work is charged to the wrong side of a reading."""
    for dev in devices:
        if dev is not None and dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return time.perf_counter()


def make_rng(rng) -> np.random.Generator:
    """The numpy generator of the verifiers, derived from a ``torch.Generator`` (or an int seed).

    ``None`` gives fresh entropy; an int seeds a new ``torch.Generator``; a
    ``torch.Generator`` is advanced by one draw (so successive runs with the
    same generator differ, and a re-seeded generator replays them).

    Parameters
    ----------
    rng : torch.Generator, int or None
        Where the randomness of a decoding run comes from.

    Returns
    -------
    numpy.random.Generator
        A generator seeded by one draw from ``rng``.

    Raises
    ------
    TypeError
        ``rng`` of another type (a numpy generator is refused: decoding seeds come from torch).

    Examples
    --------
    >>> from otspec.decoding import make_rng
    >>> float(make_rng(0).random()) == float(make_rng(0).random())
    True
    """
    seed = _seed(rng)
    return np.random.default_rng(seed)


def _seed(rng) -> int | None:
    """One draw from ``rng`` (see :func:`make_rng`), or None for fresh entropy."""
    if rng is None:
        return None
    if isinstance(rng, numbers.Integral) and not isinstance(rng, bool):
        # numpy integers too; >= 0; below 2**64 (torch's seeds are 64-bit: 2**64 was "Overflow when unpacking")
        g = torch.Generator().manual_seed(validate_seed(rng, "rng", below=TORCH_SEEDS))
    elif isinstance(rng, torch.Generator):
        g = rng
    else:
        raise TypeError(f"`rng` must be a torch.Generator, an int seed or None, got {type(rng).__name__}")
    return int(torch.randint(0, 2**62, (1,), generator=g, device=g.device).item())


def _device_generators(seed: int | None, draft_device, target_device):
    """``torch.Generator`` s on the draft's and the target's devices (one when they coincide), seeded from
    ``seed`` (fresh entropy when None)."""
    def make(dev, s):
        g = torch.Generator(device=dev)
        return g.manual_seed(s) if s is not None else (g.seed(), g)[1]

    gt = make(target_device, seed)
    if torch.device(draft_device) == torch.device(target_device):
        return gt, gt
    return make(draft_device, None if seed is None else (seed * 2654435761 + 1) % 2**62), gt


def _np(t) -> np.ndarray:
    """The loop's one device-to-host move: a numpy view of a CPU tensor (no copy), a copy from any other device."""
    return t.detach().to("cpu").numpy()


def _draw_rows_on(host: bool, W, gen, out, ids=None):
    """:func:`draw_rows` of ``W`` (``(B, V)`` float64, its ``"cdf"`` rule on the CPU) with its running sums in
    ``out``; on a route reading the host (``host``) where the numba passes may read ``W`` in place
    (:func:`~otspec.decoding._tree_device._kernel_rows`), by :func:`~otspec.decoding._tree_device._draws` instead: the
    same uniform, the same running sums added in the same order, so the same draw bit for bit, with one read of each
    row and no running sum written (a pass of ``V`` float64 writes fewer per draw). ``ids``: where the ids are
    written (:func:`draw_rows`' ``ids``), returned."""
    if host and _kernel_rows(W):
        got = _draws(W, 1, gen, host=True)[:, 0]
        return got if ids is None else ids.copy_(got)
    return draw_rows(W, gen, out=out, ids=ids)


def _sample(P, gen: np.random.Generator) -> np.ndarray:
    """:func:`sample_rows` of a ``(B, V)`` float64 tensor: the numpy path on the CPU, on the device elsewhere."""
    if P.device.type == "cpu":
        return sample_rows(_np(P), gen)
    return _sample_rows_device(P, gen)


def _sample_rows_device(P, gen: np.random.Generator) -> np.ndarray:
    """:func:`sample_rows` computed where ``P`` lives: ``B`` uniforms go in, ``B`` token ids come out.

    The same inverse-CDF rule (``u * total`` searched in the running sums,
    a landing on a zero-mass entry steps back to the last positive one), so
    the same law; only ``B`` integers cross to the host.
    """
    B, V = P.shape
    c = torch.cumsum(P, dim=1)
    u = torch.as_tensor(gen.random(B), dtype=P.dtype, device=P.device) * c[:, -1]
    i = torch.searchsorted(c, u[:, None], right=True).clamp_(max=V - 1)
    ar = torch.arange(V, device=P.device)
    last_pos = torch.where((P > 0) & (ar[None, :] <= i), ar[None, :], torch.full_like(ar, -1)[None, :])
    return _np(last_pos.amax(dim=1).clamp_(min=0)).astype(np.int64)


def _support(p, q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of the supports of two rows ``p``, ``q`` (tensors on the model's device), moved to the host.

    Returns the token ids of the union and ``p``, ``q`` restricted to it and
    renormalised (float64 numpy). Only those entries cross to the host: the
    whole vocabulary without truncation, the top-k / top-p union with it.
    """
    keep = (p > 0) | (q > 0)
    if bool(keep.all()):
        idx = np.arange(p.shape[-1])
        pc, qc = _np(p), _np(q)
    else:
        it = torch.nonzero(keep).flatten()
        idx, pc, qc = _np(it), _np(p[it]), _np(q[it])
    return idx, pc / pc.sum(), qc / qc.sum()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _Track:
    """A model, its state and the token sequence that the state holds (row ``0`` when batch 1)."""

    def __init__(self, lm, sampling: Sampling):
        self.lm = lm
        self.sampling = sampling
        self.state = lm.new_state()
        self.seq: list[int] = []
        self.batch = 1
        self.calls = 0
        self.keeps = takes_last(lm)  # ask for the logits read only (``logits(..., last=m)``)

    def _logits(self, ids, last):
        return self.lm.logits(self.state, ids, last=last) if self.keeps and last else self.lm.logits(self.state, ids)

    def logits_t(self, ids: np.ndarray, last: int | None = None):
        """Append ``ids`` (B, t) to every row (the state's rows repeated as ``logits`` does); return the raw
        logits, a tensor on the model's device: (B, t, V), or at least the last ``last`` positions (the model
        computes only those where it can, :func:`~otspec.decoding._models.takes_last`; the caller slices)."""
        t = torch.as_tensor(np.ascontiguousarray(ids), dtype=torch.long).to(self.lm.device)
        logits = self._logits(t, last)
        self.calls += 1
        self.batch = int(ids.shape[0])
        return logits

    def logits_ids(self, ids, last: int | None = None):
        """:meth:`logits_t` of ids already a tensor on the model's device (no host round trip)."""
        logits = self._logits(ids, last)
        self.calls += 1
        self.batch = int(ids.shape[0])
        return logits

    def feed_t(self, ids: np.ndarray, last: int = 1):
        """Append ``ids`` (B, t) to every row; return the float64 laws of the last ``last`` positions (B, last, V).

        A tensor on the model's device: the decoder moves to the host only the rows its verifiers read.
        """
        return self.sampling.probs(self.logits_t(ids, last)[:, -last:])

    def feed(self, ids: np.ndarray, last: int = 1) -> np.ndarray:
        """:meth:`feed_t` as a numpy array (the baseline and the block schemes, one row each)."""
        return _np(self.feed_t(ids, last))

    def sync(self, ctx: list[int], row: int = 0, row_seq: list[int] | None = None) -> list[int]:
        """Keep ``row`` (holding ``row_seq``) truncated to its longest prefix of ``ctx`` minus one; return the pending tokens."""
        seq = self.seq if row_seq is None else row_seq
        c = min(_common_prefix(seq, ctx), len(ctx) - 1)
        if self.batch != 1 or c < len(seq):
            self.lm.select(self.state, row if self.batch != 1 else 0, c)
        self.batch = 1
        self.seq = list(ctx[:c])
        return list(ctx[c:])

    def dist_after(self, ctx: list[int]) -> np.ndarray:
        """Next-token law after ``ctx`` (batch 1), feeding only what the state lacks."""
        pending = self.sync(ctx)
        law = self.feed(np.array([pending], dtype=np.int64))[0, -1]
        self.seq = list(ctx)
        return law


class _PathModel:
    """``otspec.models.Model`` view of one decoding step: logged laws along the block, model calls elsewhere."""

    def __init__(self, track: _Track, ctx: list[int], logged: dict):
        self.track = track
        self.ctx = ctx
        self.logged = logged
        self.vocab_size = track.lm.vocab_size
        self.extra_calls = 0

    def next_dist(self, prefix):
        key = tuple(int(t) for t in prefix)
        law = self.logged.get(key)
        if law is None:
            law = self.track.dist_after(self.ctx + list(key))
            self.logged[key] = law
            self.extra_calls += 1
        return law


def _bad_logits_error(role: str, lm, pos: int, where: str) -> ValueError:
    """The ValueError of non-finite logits of the ``role`` model ``lm`` in its next-token law after ``pos``
    tokens (``where``: which law of the iteration), with a hint when the model's dtype is known."""
    dtype = getattr(getattr(lm, "model", None), "dtype", None)
    return ValueError(
        f"the {role} model {getattr(lm, 'name', type(lm).__name__)!r} gave non-finite logits (NaN or inf) at "
        f"position {pos} (its next-token law after {pos} tokens, {where})"
        + (f"; its dtype is {dtype}: float16 overflows, try bfloat16 or float32" if dtype is not None else "")
    )


def _draw_into_work(W, gen, work, *, host: bool = False):
    """:func:`draw_rows` of ``W`` (1, V) with its running sums in the ``work`` block of the chains' draws (by the
    numba pass, no sums written, on a route reading the host: :func:`_draw_rows_on`)."""
    return _draw_rows_on(host, W, gen, _block(work, "chain_c", tuple(W.shape), W.device))


def _deprecated_verifier_name(result) -> str:
    """``result.verifier``, the old attribute of the verifier's *name* (``.verifier`` is a Verifier object
    elsewhere in otspec): warns, then returns ``result.verifier_name``."""
    warnings.warn(
        f"{type(result).__name__}.verifier is deprecated: it is the verifier's name, now `verifier_name`",
        DeprecationWarning,
        stacklevel=2,
    )
    return result.verifier_name


@dataclass(frozen=True, eq=False)
class DecodeResult:
    r"""One speculative decoding run, with everything logged per iteration (one target scoring each).

    Attributes
    ----------
    tokens : (m,) ndarray of int64
        Generated tokens (prompt excluded), at most ``max_new_tokens``.
    prompt_length : int
    verifier_name : str
        The verifier's registered name (or the callable's ``__name__``);
        ``.verifier`` elsewhere in otspec is a :class:`otspec.Verifier`
        object, so the name has its own attribute (``.verifier`` here is a
        deprecated alias of it).
    lossless : bool
        Whether the verifier reproduces the (processed) target law exactly.
    k, L : int
        ``K`` draft sequences of length ``L`` (at most: see ``draft_lengths``).
    sampling : Sampling
    accepted : (N,) ndarray of int64
        Accepted draft tokens :math:`\tau` per iteration.
    emitted : (N,) ndarray of int64
        Tokens produced per iteration (``tau + 1``; ``L_i + 1`` for Sun et al.'s (arXiv:2403.10444)
        v1 block verifier); a lossless run makes none past ``max_new_tokens`` (see ``draft_lengths``), a
        lossy one counts its last iteration's tokens before their truncation to ``max_new_tokens``.
    target_calls : (N,) ndarray of int64
        Serial target calls per iteration (1, plus the v1 residual's calls).
    predicted_accepted : (N,) ndarray of float64
        The exact analysis' prediction of ``accepted`` from the logged laws:
        for token-level schemes the sum of the verifiers' exact acceptances
        over the depths reached (:math:`\alpha_k` for the optimal verifier),
        for block schemes :math:`E[\tau \mid X^L]`.
    predicted_emitted, predicted_calls : (N,) ndarray of float64
        The same for ``emitted`` and ``target_calls``.
    reached : (N, L) ndarray of float64
        Measured :math:`\mathbb 1\{\tau \ge j\}`, ``j = 1..L`` (0 past an iteration's ``L_i``).
    predicted_reached : (N, L) ndarray of float64
        Predicted :math:`P(\tau \ge j)` contributions (unbiased for ``reached``; 0 past ``L_i``).
    alpha_first : (N,) ndarray of float64
        Exact acceptance of the first-depth verification
        (:math:`P(Y \in S(X))` of the verifier on :math:`p_1, q_1`).
    alpha_opt_first : (N,) ndarray of float64
        :math:`\alpha_K(p_1, q_1)`, the optimum for ``K`` drafts (:func:`otspec.alpha_k`).
        With ``engine="torch"`` and ``K > 1`` it needs a sort of each first
        law: computed on the device from the kept first laws in batches
        outside ``wall_time``, or NaN when the run kept none
        (``log_laws=False``); at ``K = 1`` it is :math:`1 - \mathrm{TV}(p_1, q_1)`.
        It and ``alpha_first`` are NaN for an iteration without drafts (``L_i = 0``).
    wall_time : float
        Seconds spent decoding (model calls, sampling, verification), the
        devices synchronised at both ends; the prediction bookkeeping is
        excluded.
    draft_calls, total_target_calls : int
    process : str or None
        The draft process of a tree run (:data:`otspec.tree.PROCESSES` or
        ``"spechub"``); None for chains.
    tree : TreeShape, Eagle2Params or None
        The tree a tree run drafted at every step (its last iterations its
        first ``draft_lengths[i]`` levels); None for chains. Then
        ``k`` is the number of children of the root, ``L`` the largest depth,
        ``accepted`` the depth of the accepted node, ``predicted_*`` and
        ``alpha_first`` the verifier's exact values given each realised tree
        (:meth:`otspec.tree.TreeVerifier.emission`), and ``alpha_opt_first``
        the best first-depth acceptance of the process at the root:
        :math:`\alpha_K` for ``"iid"``, its without-replacement analogue for
        ``"wor"``, the target mass of the root's children for ``"topk"`` and
        ``"eagle2"``, :func:`otspec.tree.spechub_optimum` for ``"spechub"``.
    engine : {"torch", "numpy"}
        Where the verification ran: on the models' device in torch (the
        laws never leave it; one host synchronisation per iteration, the
        emitted tokens; two for a draft tree, its token ids before the
        target's call and the outcome after it; for block verification
        (``"block"``) one more when :math:`\tau < L`, after its
        continuation's calls; on the CPU the host routes read their few
        numbers there), or on the host through the package's numpy
        verifiers (rows of the laws moved there).
    draft_lengths : (N,) ndarray of int64
        The drafts of each iteration, :math:`L_i = \min(L, r_i - 1)` with
        :math:`r_i` the tokens left before ``max_new_tokens`` (for a tree,
        the depth :math:`D_i = \min(D, r_i - 1)` of the levels drafted;
        ``L`` for a lossy verifier; 0: plain decoding's step, one target
        call and no draft): see :func:`speculative_decode`. Every other
        per-iteration record is that of the iteration as made: ``accepted
        <= L_i``, the predictions exact for ``L_i`` drafts (for the tree cut
        to :math:`D_i` levels). None in a result built by hand.
    """

    tokens: np.ndarray
    prompt_length: int
    verifier_name: str
    lossless: bool
    k: int
    L: int
    sampling: Sampling
    accepted: np.ndarray
    emitted: np.ndarray
    target_calls: np.ndarray
    predicted_accepted: np.ndarray
    predicted_emitted: np.ndarray
    predicted_calls: np.ndarray
    reached: np.ndarray
    predicted_reached: np.ndarray
    alpha_first: np.ndarray
    alpha_opt_first: np.ndarray
    wall_time: float
    draft_calls: int
    total_target_calls: int
    process: str | None = None
    tree: object = None
    engine: str = "numpy"
    draft_lengths: np.ndarray | None = None

    verifier = property(_deprecated_verifier_name, doc="Deprecated alias of ``verifier_name``.")

    @property
    def iterations(self) -> int:
        """Number of target scorings (decoding iterations)."""
        return int(self.accepted.shape[0])

    @property
    def block_efficiency(self) -> float:
        """Tokens produced per serial target call (bonus token included)."""
        return float(self.emitted.sum() / self.target_calls.sum())

    def __repr__(self) -> str:
        return (
            f"DecodeResult(verifier_name={self.verifier_name!r}, k={self.k}, L={self.L}, "
            f"tokens={self.tokens.shape[0]}, iterations={self.iterations}, "
            f"block_efficiency={self.block_efficiency:.3f})"
        )


@dataclass(frozen=True, eq=False)
class BaselineResult:
    """Plain autoregressive decoding of the target (the wall-clock baseline).

    Attributes
    ----------
    tokens : (m,) ndarray of int64
    wall_time : float
        Seconds (model calls and sampling).
    target_calls : int
    """

    tokens: np.ndarray
    wall_time: float
    target_calls: int

    @property
    def tokens_per_second(self) -> float:
        return float(self.tokens.shape[0] / self.wall_time) if self.wall_time > 0 else float("inf")


def _validate_common(target, prompt, max_new_tokens, temperature, top_k, top_p, eos_token_id, top_p_rule="ties"):
    V = validate_language_model(target, "target")
    prompt_ = validate_prompt(prompt, V)
    max_new = validate_size(max_new_tokens, "max_new_tokens", cap=MAX_NEW_TOKENS, cap_name="MAX_NEW_TOKENS",
                            hint="decode in several runs")
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, top_p_rule=top_p_rule)
    if eos_token_id is None:
        eos = frozenset()
    else:
        if not (isinstance(eos_token_id, numbers.Integral) or sequence_like(eos_token_id)):  # 2.5: "not iterable"
            raise TypeError(f"`eos_token_id` must be a token id, a sequence of them or None, got "
                            f"{type(eos_token_id).__name__}")
        ids = [eos_token_id] if isinstance(eos_token_id, numbers.Integral) else list(eos_token_id)
        for e in ids:
            if isinstance(e, bool) or not isinstance(e, numbers.Integral) or not 0 <= int(e) < V:
                raise ValueError(f"`eos_token_id` must be token ids in [0, {V}), got {eos_token_id!r}")
        eos = frozenset(int(e) for e in ids)
    return V, prompt_, max_new, sampling, eos


def _resolve(verifier, K: int, options, V: int, sampling: Sampling) -> Scheme:
    """:func:`resolve_scheme` under ``sampling``; greedy laws are one-hot, so every step's union support has at
    most 2 tokens, as under ``top_k=1``."""
    return resolve_scheme(verifier, k=K, options=options, vocab_size=V,
                          top_k=1 if sampling.greedy else sampling.top_k, top_p=sampling.top_p)


def _finish(out: list[int], max_new: int, eos: frozenset) -> np.ndarray:
    out = out[:max_new]
    for i, t in enumerate(out):
        if t in eos:
            out = out[: i + 1]
            break
    return np.array(out, dtype=np.int64)


def autoregressive_decode(
    target,
    prompt,
    *,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    top_p_rule: str = "ties",
    rng=None,
    eos_token_id=None,
) -> BaselineResult:
    r"""Sample from the target alone, one token per call (the baseline of every speed-up).

    .. math::

        y_{t+1} \sim q(\cdot \mid \text{prompt}, y_{1:t}),

    with ``q`` the target law after temperature / top-k / top-p, using the
    model's KV cache and the same float64 inverse-CDF sampling as the
    speculative loop.

    Parameters
    ----------
    target : LanguageModel
    prompt : sequence of int
        Non-empty token ids.
    max_new_tokens : int, keyword-only
        In ``[1, MAX_NEW_TOKENS]`` (:data:`MAX_NEW_TOKENS`, 2**20).
    temperature, top_k, top_p, top_p_rule : keyword-only
        See :class:`Sampling` (``top_p_rule="transformers"`` matches ``generate``;
        ``temperature=0`` is greedy decoding, the argmax at every step).
    rng : torch.Generator, int or None, keyword-only
        Seed source (a numpy generator is derived from it).
    eos_token_id : int, sequence of int or None, keyword-only
        Stop after any of these tokens.

    Returns
    -------
    BaselineResult

    Raises
    ------
    ValueError, TypeError
        Bad prompt, ``max_new_tokens < 1``, ``temperature < 0``, ... (before any model call).

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM, autoregressive_decode
    >>> lm = CallableLM(lambda ids: torch.zeros(ids.shape + (5,)), vocab_size=5)
    >>> autoregressive_decode(lm, [0], max_new_tokens=4, rng=0).tokens.shape
    (4,)
    """
    _, prompt_, max_new, sampling, eos = _validate_common(
        target, prompt, max_new_tokens, temperature, top_k, top_p, eos_token_id, top_p_rule
    )
    gen = make_rng(rng)
    track = _Track(target, sampling)
    out: list[int] = []
    pending = list(prompt_)
    t0 = time.perf_counter()
    while len(out) < max_new:
        law = track.feed(np.array([pending], dtype=np.int64))[0, -1]
        y = int(sample_rows(law[None], gen)[0])
        out.append(y)
        pending = [y]
        if y in eos:
            break
    wall = time.perf_counter() - t0
    return BaselineResult(tokens=_finish(out, max_new, eos), wall_time=wall, target_calls=track.calls)


def speculative_decode(
    prompt,
    *,
    draft,
    target,
    verifier=None,
    k: int | None = None,
    L: int | None = None,
    tree=None,
    process: str | None = None,
    allow_lossy: bool = False,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    top_p_rule: str = "ties",
    rng=None,
    verifier_options: dict | None = None,
    eos_token_id=None,
    progress: bool = False,
    engine: str = "auto",
    log_laws: bool = True,
) -> DecodeResult:
    r"""Speculative decoding of a real (or toy) draft/target pair with any verifier of the package.

    Each iteration drafts ``k`` i.i.d. sequences of length
    ``L`` from the draft (one batched draft call per
    position), scores all of them with the target in **one** batched call,
    then verifies:

    * token-level schemes run SpecTr's DraftSelection (Algorithm 3): at
      depth :math:`j` the ``k`` surviving drafts share the prefix, and the
      package verifier for :math:`(p_j, q_j, k)` draws :math:`Y`; the drafts
      with :math:`X_j = Y` survive; stop when none does (``Y`` is the
      correction) or after ``L`` accepted tokens (then a bonus token from
      :math:`q_{L+1}`). By Theorem 2 the output follows the target exactly
      for any lossless verifier. ``K = 1`` with ``"token"`` is Leviathan's
      speculative sampling.
    * block schemes (``K = 1``) run :mod:`otspec.block`'s verifier on the
      draft block with the logged conditionals.
    * draft trees (``tree=``, ``process=``): the draft fills the tree with
      one call per depth (the nodes of that depth that get children, as a
      batch of rows on its KV cache), the target scores every node in
      **one** call with a tree attention mask (:meth:`HFCausalLM.tree_logits`),
      and a tree verifier of :mod:`otspec.tree` accepts a root path and
      emits one more token (SpecInfer, Sequoia, EAGLE-2's target-only rule,
      SpecTr over a tree, Traversal Verification, ...). A verifier not
      lossless for the process is refused unless ``allow_lossy=True``.

    .. math::

        P\big(Y_{1:m} = y_{1:m}\big) = \prod_{t=1}^{m} q(y_t \mid \text{prompt}, y_{1:t-1})
        \quad\text{(lossless verifiers)}.

    Probabilities are float64. The laws ``P`` (K, L, V) and ``Q`` (K, L + 1,
    V) stay on the models' device. With ``engine="torch"`` (the default for
    ``"token"``, ``"multiround"``, ``"block-onestep"`` and ``"block"``) everything else
    does too: drafts and residuals are drawn there with a
    ``torch.Generator`` on that device, the ratio tests run there, and one
    host read per iteration brings the emitted tokens (the draft may sit on
    another device than the target: its drafts and laws are then copied to
    the target's). On the CPU, where a read waits for nothing, speculative
    sampling (``k = 1``) reads its few numbers per depth instead and forms
    the target's laws only up to the first rejection (the rows after it are
    used by nothing; their logits are still checked): the same draws bit
    for bit. Block verification (``"block"``) on the CPU reads the host
    with the numpy route's generator: the numpy route's tokens, calls and
    logged law bit for bit, without its copies and checks of every law;
    on an accelerator its decision and first token are made on the device
    (:func:`~otspec.decoding._verifiers.block_walk_t`) and its continuation
    is called with its tokens kept there (one more host read when
    :math:`\tau < L`). With ``engine="numpy"`` (every other verifier) drafts are
    sampled on the device (only ``K`` uniforms and ``K`` ids cross) and
    each verified depth moves one row of ``p`` and one of ``q`` restricted
    to their union support (plus the bonus row of ``q``) to the host, where
    the package's verifiers work on that support (the full vocabulary
    without truncation, e.g. ``verifier="optimal"`` at ``V = 49,152``;
    small after top-k / top-p). On the CPU the moves are views (no copy).

    The last iterations of a chain draft only what can still be used: with
    :math:`r_i` tokens left before ``max_new_tokens``, iteration :math:`i`
    drafts

    .. math::

        L_i = \min(L,\; r_i - 1)

    tokens (it makes at most :math:`L_i + 1`, so none past the limit), and
    at :math:`r_i = 1` it is plain decoding's step: one target call, one
    token from :math:`q`, no draft. transformers' assisted generation does
    the same (``AssistedCandidateGenerator._calculate_new_tokens`` in
    ``transformers/generation/candidate_generator.py``: the assistant's
    ``max_new_tokens`` is ``min(num_assistant_tokens, max_length -
    cur_len - 1)``, and ``get_candidates`` drafts nothing at 0). It is lossless: :math:`L_i` is a function of the tokens
    made before iteration :math:`i` only, so given them it is fixed before
    the iteration's randomness, and an iteration of a lossless verifier
    emits target-distributed tokens for every draft length fixed so
    (Leviathan et al. [1]_, Theorem 1; SpecTr [2]_, Theorem 2; Sun et
    al. [3]_); by induction over the iterations the whole output follows
    the target, as with a constant ``L``. Stopping at ``eos_token_id`` is
    unchanged (where an EOS will come is not known before it is drawn). A
    verifier that is not lossless (``"mentored"``, a lossy callable) keeps
    ``L`` to the end: its output law depends on ``L``, and the run makes the
    scheme it was asked for (the tokens past the limit are dropped). A draft
    tree of depth :math:`D` is cut the same way: with :math:`r_i` tokens
    left the iteration drafts and scores its first :math:`D_i = \min(D,
    r_i - 1)` levels only (a shape's nodes of depth at most :math:`D_i`;
    EAGLE-2's tree grown :math:`D_i` levels, its node budget capped at the
    nodes they propose), plain decoding's step at :math:`r_i = 1`; lossless
    for the same reason (a tree verifier's iteration follows the target for
    any shape fixed before its randomness, and :math:`D_i` is fixed by the
    past), while a tree verifier not lossless for the process keeps the
    whole tree (its output law depends on the shape). SafeAILab/EAGLE's own
    loop (``eagle/model/ea_model.py``, ``eagenerate``) drafts whole trees and
    stops once it has made more than ``max_new_tokens``. ``DecodeResult.draft_lengths``
    holds every :math:`L_i` (:math:`D_i` for trees), and every
    per-iteration record is the shortened iteration's own
    (:class:`DecodeResult`).

    Parameters
    ----------
    prompt : sequence of int, tensor, BatchEncoding or dict
        Non-empty token ids: a list, a 1-D tensor/array or a batch of one
        row, or what a tokenizer returns (a mapping with ``"input_ids"``,
        e.g. ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``
        in transformers 5).
    draft, target : LanguageModel, keyword-only
        Draft (``p``) and target (``q``) models, same ``vocab_size``; see
        :class:`HFCausalLM`. Keyword-only, so the roles cannot be swapped.
    verifier : str, callable, TreeVerifier or None, keyword-only
        Chains (default ``"token"``): ``"token"`` (speculative sampling), ``"kseq"``, ``"multiround"``,
        ``"optimal"``, ``"lp"`` (the OTM-k LP plan, built at every step: a
        support of at most 128 tokens for ``k = 2``, 32 for ``k = 3``, 18 for
        ``k = 4`` -- a smaller vocabulary needs no truncation, a larger one
        ``top_k`` within that bound), ``"mentored"`` (lossy;
        ``verifier_options={"D": ...}``), ``"block"`` (Sun et al.,
        arXiv:2403.10444, Algorithm 3, with its multi-token residual drawn by
        extra model calls), ``"block-onestep"`` -- any name of
        :data:`otspec.multidraft.VERIFIERS` with i.i.d. drafts; or a builder
        of the package (``otspec.kseq``, ``otspec.otm_lp``,
        ``otspec.maximal_coupling``, ...: run as its registered name); or any
        callable ``fn(p, q, k, **verifier_options)`` (third parameter named
        ``k``) or ``fn(p, q, **verifier_options)`` (single draft, ``k = 1``)
        returning an :class:`otspec.Verifier` or a result carrying one as
        ``.verifier`` (e.g. :class:`otspec.OTMResult`). Every step's ``p``,
        ``q`` are float64 vectors on the union of the two supports.
        Trees: a name of ``otspec.multidraft.verifier_names(kind="tree")``
        (``"specinfer"``, ``"sequoia"``, ``"target-only"``,
        ``"spectr-tree"``, ``"traversal"``, ``"gbv"``, ``"spechub"``, ...,
        with its options in ``verifier_options``) or an
        :class:`otspec.tree.TreeVerifier`; default the per-node rule
        lossless for the process: ``"specinfer"`` (``"iid"``),
        ``"sequoia"`` (``"wor"``), ``"target-only"`` (``"topk"``,
        ``"eagle2"``), ``"spechub"`` (``"spechub"``).
    k : int or None, keyword-only
        Number of i.i.d. draft sequences, ``k >= 1`` (default 1; 1 for
        single-draft schemes). Unset with ``tree``.
    L : int or None, keyword-only
        Draft length, ``L >= 1`` (default 4). Unset with ``tree``.
    tree : TreeShape, sequence of rank paths, Eagle2Params, str or None, keyword-only
        Draft a tree instead of chains: a shape (:class:`otspec.tree.TreeShape`,
        or its rank paths, Medusa's ``medusa_choices``), EAGLE-2's dynamic
        tree (:class:`otspec.tree.Eagle2Params`), or the text
        ``process:shape[:verifier]`` that the profile takes (``"eagle2:3,2,6"``,
        ``"topk:branching(4,2):target-only"``; ``process`` and ``verifier``
        then come from it); at least one and at most
        ``otspec.tree.MAX_DRAFT_TREE_NODES`` (1024, the profile's limit
        too) draft nodes. The target
        must have ``tree_logits`` (:class:`HFCausalLM`, :class:`CallableLM`; a
        model whose attention takes no 4-D mask is scored by rows, still
        one call).
    process : str or None, keyword-only
        How the draft fills ``tree``: ``"iid"`` (i.i.d. children, SpecInfer),
        ``"wor"`` (without replacement, Sequoia), ``"topk"`` (the draft's
        top-ranked tokens, Medusa / EAGLE), ``"eagle2"`` (with an
        ``Eagle2Params``; the default for one), ``"spechub"`` (SpecHub's
        pairs, ``V <= 2048``). ``"iid"``, ``"wor"`` and ``"spechub"`` draw
        from the processed draft law (temperature, top-k, top-p);
        ``"topk"`` and ``"eagle2"`` rank by the draft's own law (its softmax
        at temperature 1, untruncated, as EAGLE does), so greedy decoding
        works with them. A ``"wor"`` node needs as many tokens of positive
        draft probability as its children: greedy decoding or a smaller
        ``top_k`` is refused before any model call, a nucleus (``top_p``)
        too small at some node raises ValueError naming that node.
    allow_lossy : bool, keyword-only
        Run a tree verifier on a process it is not lossless for (refused by
        default); ``DecodeResult.lossless`` is then False.
    max_new_tokens : int, keyword-only
        In ``[1, MAX_NEW_TOKENS]`` (:data:`MAX_NEW_TOKENS`, 2**20).
    temperature, top_k, top_p, top_p_rule : keyword-only
        Applied identically to draft and target (:class:`Sampling`;
        ``top_p_rule="transformers"`` keeps the nucleus ``generate`` keeps).
        ``temperature=0`` is greedy decoding: both laws are one-hot at
        their argmax (smallest id on ties), every lossless verifier then
        emits the target's greedy continuation token for token, and each
        rule reduces to "accept while the draft's argmax is the target's"
        (docs/guide/decoding.rst, "Greedy decoding").
    rng : torch.Generator, int or None, keyword-only
        Seed source; the numpy ``rng`` of the verifiers and samplers is derived from it.
    verifier_options : dict, keyword-only
        Extra arguments of the verifier (``D`` for mentored, ``rho`` for k-Seq).
    eos_token_id : int, sequence of int or None, keyword-only
        Stop after any of these tokens.
    progress : bool, keyword-only
        Show a tqdm progress bar.
    engine : {"auto", "torch", "numpy"}, keyword-only
        Where a chain is verified. ``"torch"``: on the models' device
        (:func:`otspec.decoding._verifiers.verify_chain_t` for ``"token"``
        and ``"multiround"``, :func:`~otspec.decoding._verifiers.verify_block_onestep_t`
        for ``"block-onestep"``, :func:`~otspec.decoding._verifiers.block_walk_t`
        and the continuation's calls for ``"block"``): drafts, laws, ratio tests and residual draws
        stay there, drawn with a ``torch.Generator`` on that device seeded
        from ``rng``, and one transfer per iteration brings the emitted
        tokens (and the flags of non-finite logits) to the host (``"block"``:
        a second one after its continuation, when :math:`\tau < L`; on the
        CPU it draws with the numpy route's generator, the numpy route's
        tokens bit for bit). ``"numpy"``:
        the package's verifiers on the host (every verifier; the
        independent route the tests hold the device route against).
        ``"auto"`` (default): ``"torch"`` where the verifier has it.
        Trees: ``"torch"`` for static shapes filled by ``"iid"``, ``"wor"`` or
        ``"topk"``, and EAGLE-2's dynamic trees (``"eagle2"``), verified by
        ``"specinfer"``, ``"sequoia"`` or ``"target-only"``
        (:mod:`otspec.decoding._tree_device`: the tree drawn or chosen,
        scored, verified and its residual drawn on the device, one host read
        per iteration -- the accepted node and token, with the tree's token
        ids (and an EAGLE-2 tree's parents), after the target call); every other tree, and the
        multi-draft block schemes, run on the host whatever this says (``"torch"`` is
        refused for a tree without the device route).
    log_laws : bool, keyword-only
        With ``engine="torch"`` and ``K > 1``: keep each iteration's first
        draft and target laws on the device (``16 V`` bytes an iteration)
        and compute ``alpha_opt_first`` from them in batches of
        :data:`LAW_BATCH` iterations, one sort on the device each, timed
        apart from ``wall_time``. ``False`` keeps nothing and leaves
        ``alpha_opt_first`` NaN there. Ignored elsewhere (``K = 1``:
        :math:`\alpha_1 = 1 - \mathrm{TV}` costs nothing). The same for
        trees on the device with ``process="iid"`` or ``"wor"`` (the root's
        laws kept in blocks of :data:`LAW_BATCH` iterations, their optimum
        after each batch, without replacement on the host; ``"iid"`` trees
        on a CPU compute it after each iteration from the iteration's own
        blocks, timed apart too); ``"topk"`` trees need nothing kept.

    Returns
    -------
    DecodeResult

    Raises
    ------
    ValueError
        Different vocabularies, an empty prompt, ``K`` or ``L`` < 1, an
        unknown ``engine`` or ``"torch"`` for a verifier without that route,
        laws of one iteration above :data:`MAX_LAW_BYTES` (or the free
        memory of a CUDA device),
        ``temperature < 0``, an unknown verifier or one that does not fit
        ``K`` or the sampling; with ``tree``: a malformed tree, an unknown
        ``process``, a tree verifier not lossless for the process without
        ``allow_lossy`` (the message names the processes it is lossless
        for), ``k`` or ``L`` given, a tree the draft's laws cannot fill
        (``"wor"`` under greedy decoding) -- all before any model call.
    TypeError
        Models that are not :class:`LanguageModel`, non-integer ids, a
        target without ``tree_logits`` for a tree.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, Algorithm 1 (their ``p`` is our ``q``).
    .. [2] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, Algorithm 3, Theorem 2.
    .. [3] Sun et al., "Optimal Block-Level Draft Verification for
       Accelerating Speculative Decoding", Algorithm 3.
    .. [4] Miao et al., "SpecInfer", arXiv:2305.09781, §4 (token trees,
       tree attention, multi-step speculative sampling); Li et al.,
       "EAGLE-2", arXiv:2406.16858, §4 (dynamic draft trees).

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM, speculative_decode
    >>> q = CallableLM(lambda ids: torch.zeros(ids.shape + (4,)), vocab_size=4)
    >>> p = CallableLM(lambda ids: torch.zeros(ids.shape + (4,)), vocab_size=4)
    >>> res = speculative_decode([0], draft=p, target=q, L=3, max_new_tokens=8, rng=0)
    >>> res.tokens.shape, res.block_efficiency   # identical models accept every draft
    ((8,), 4.0)

    A draft tree: two i.i.d. children of the root, the first with a child, verified by SpecInfer's rule:

    >>> res = speculative_decode([0], draft=p, target=q, tree=[(0,), (1,), (0, 0)], process="iid",
    ...                          max_new_tokens=9, rng=0)
    >>> res.verifier_name, res.k, res.L, res.block_efficiency
    ('specinfer', 2, 2, 3.0)
    """
    V, prompt_, max_new, sampling, eos = _validate_common(
        target, prompt, max_new_tokens, temperature, top_k, top_p, eos_token_id, top_p_rule
    )
    Vd = validate_language_model(draft, "draft")
    if Vd != V:
        raise ValueError(
            f"`draft` and `target` must share one vocabulary, got vocab_size {Vd} (draft) and {V} (target)"
        )
    if tree is not None:
        check_with_tree(k, L)
        plan = tree_plan(tree, process=process, verifier=verifier, options=verifier_options,
                         allow_lossy=allow_lossy, target=target, V=V, sampling=sampling)
        if not isinstance(log_laws, bool):
            raise TypeError(f"`log_laws` must be a bool, got {type(log_laws).__name__}")
        scheme = Scheme(plan.name, "tree", None, plan.lossless)
        on_device = _tree_engine(engine, plan)
        _check_tree_memory(plan, tree, V, sampling, on_device, len(prompt_), log_laws, draft, target)
        if on_device:
            seed = _seed(rng)
            gen, gens = np.random.default_rng(seed), _device_generators(seed, draft.device, target.device)
            step = TreeSteps(plan, lambda p: device_tree_step(p, sampling, log_laws, law_batch=LAW_BATCH,
                                                              clock=_clock))
        else:
            gen, gens, step = make_rng(rng), None, TreeSteps(plan, lambda p: TreeStep(p, sampling))
        return _Decoder(draft, target, prompt_, scheme, plan.k, plan.L, max_new, sampling, gen, eos, progress,
                        tree_step=step, device_gens=gens).run()
    check_without_tree(process, allow_lossy)
    K = validate_positive_int(1 if k is None else k, "k")
    L = validate_positive_int(4 if L is None else L, "L")
    scheme = _resolve("token" if verifier is None else verifier, K, verifier_options, V, sampling)
    if scheme.kind == "multiblock":
        check_multiblock_size(scheme.name, V, L, K)
    use_torch = _engine(engine, scheme)
    if not isinstance(log_laws, bool):
        raise TypeError(f"`log_laws` must be a bool, got {type(log_laws).__name__}")
    _check_law_memory(V, K, L, {torch.device(draft.device), torch.device(target.device)})
    if use_torch:
        seed = _seed(rng)
        gen = np.random.default_rng(seed)
        gens = _device_generators(seed, draft.device, target.device)
    else:
        gen, gens = make_rng(rng), None
    return _Decoder(draft, target, prompt_, scheme, K, L, max_new, sampling, gen, eos, progress,
                    device_gens=gens, log_laws=log_laws).run()


def _engine(engine, scheme: Scheme) -> bool:
    """Whether ``scheme`` runs on the device (``engine`` checked against :data:`ENGINES` and the scheme)."""
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(unknown_name_message("engine", engine, ENGINES))
    has = scheme.kind in ("token", "block") and scheme.name in DEVICE_VERIFIERS and scheme.lossless is not None
    if engine == "torch" and not has:
        raise ValueError(
            f"`engine`='torch' verifies on the device with {list(DEVICE_VERIFIERS)} only, got `verifier`="
            f"{scheme.name!r}: use engine='numpy' (or 'auto')"
        )
    return has and engine != "numpy"


def _tree_engine(engine, plan) -> bool:
    """Whether a tree runs on the device (``engine`` checked against :data:`ENGINES` and the tree's route)."""
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(unknown_name_message("engine", engine, ENGINES))
    has = has_device_route(plan)
    if engine == "torch" and not has:
        raise ValueError(
            f"`engine`='torch' runs draft trees on the device with the processes {list(DEVICE_TREE_PROCESSES)} "
            f"and the verifiers {list(DEVICE_TREE_VERIFIERS)} only, got process={plan.process!r} and `verifier`="
            f"{plan.name!r}: use engine='numpy' (or 'auto')")
    return has and engine != "numpy"


class _Decoder:
    #: Whether speculative sampling (``K = 1``) verifies reading the host (:meth:`_chain_on_host`); None: on the
    #: CPU only. Tests set it False to run an accelerator's route (one host read per iteration) on CPU tensors.
    read_on_host: bool | None = None

    def __init__(self, draft, target, prompt, scheme: Scheme, K, L, max_new, sampling, gen, eos, progress,
                 tree_step: TreeSteps | None = None, device_gens=None, log_laws: bool = False):
        self.tree_step = tree_step
        self.device_gens = device_gens
        self.log_laws = log_laws
        self.dev_log: list = []  # per iteration, on the device: the acceptance of each depth
        self.first_laws: list = []  # (p_1, q_1) on the device, K > 1 with log_laws, until the next flush
        self._P = None  # the device route's draft laws (K, L, V), reused from iteration to iteration
        self._Q = None  # and its target laws (K, L + 1, V)
        self._work: dict = {}  # those of the shortened last iterations (views, :func:`_block`)
        self.alpha_opt: list = []  # alpha_K of the flushed first laws, on the device
        self.t = _Track(target, sampling)
        self.d = _Track(draft, sampling)
        self.prompt = prompt
        self.scheme = scheme
        self.K, self.L = K, L
        self.max_new = max_new
        self.sampling = sampling
        self.gen = gen
        self.eos = eos
        self.progress = progress
        self.lossless = scheme.lossless
        self.analysis_time = 0.0
        #: Block verification (``"block"``) on the torch route reading the host (:meth:`_block_on_host`): the
        #: numpy route's draws with the decoder's numpy generator, on the CPU (both models there: it reads views).
        self.host_block = (device_gens is not None and tree_step is None and scheme.name == "block"
                           and self._reads_host(target.device)
                           and torch.device(draft.device).type == torch.device(target.device).type == "cpu")
        self.log: dict[str, list] = {
            k: []
            for k in (
                "accepted", "emitted", "calls", "pred_acc", "pred_emit", "pred_calls",
                "reached", "pred_reached", "alpha1", "alpha_opt1", "lengths",
            )
        }

    # -- the draft and target phases (shared) -----------------------------------------
    def _draft_and_score(self, ctx, L):
        """Draft ``K`` sequences of ``L`` tokens and score them: token ids ``X`` (K, L) on the host, the float64
        laws ``P`` (K, L, V) and ``Q`` (K, L + 1, V) as tensors on the models' device (never moved whole)."""
        K = self.K
        pending = self.d.sync(ctx)
        P1 = self.d.feed_t(np.array([pending], dtype=np.int64))[:, -1]  # (1, V)
        V = P1.shape[-1]
        X = np.empty((K, L), dtype=np.int64)
        P = torch.empty((K, L, V), dtype=torch.float64, device=P1.device)
        P[:, 0] = P1
        X[:, 0] = _sample(P1.expand(K, V), self.gen)
        for j in range(1, L):
            P[:, j] = self.d.feed_t(X[:, j - 1 : j])[:, -1]
            X[:, j] = _sample(P[:, j], self.gen)
        pending_t = self.t.sync(ctx)
        ids = np.concatenate([np.broadcast_to(np.array(pending_t, dtype=np.int64), (K, len(pending_t))), X], axis=1)
        Q = self.t.feed_t(ids, last=L + 1)  # (K, L + 1, V): q_1 .. q_{L+1}
        return X, P, Q

    @staticmethod
    def _compress(p, q):
        idx = np.flatnonzero((p > 0) | (q > 0))
        pc, qc = p[idx], q[idx]
        return idx, pc / pc.sum(), qc / qc.sum()

    def _alpha_opt(self, p, q, k):
        _, pc, qc = self._compress(p, q)
        return float(otspec.alpha_k(pc, qc, k))

    # -- token-level DraftSelection ---------------------------------------------------------
    def _iter_token(self, ctx, L):
        K = self.K
        X, P, Q = self._draft_and_score(ctx, L)
        alive = list(range(K))
        out: list[int] = []
        accs: list[float] = []
        for j in range(L):
            r0 = alive[0]
            idx, pc, qc = _support(P[r0, j], Q[r0, j])  # the one pair of rows this depth verifies
            k = len(alive)
            v = self.scheme.build(pc, qc, k)
            if self.lossless is None:
                self.lossless = bool(v.lossless)
            elif not v.lossless:
                self.lossless = False
            drafts = np.searchsorted(idx, X[alive, j])
            y = int(idx[v.sample(drafts.tolist(), rng=self.gen)])
            a0 = time.perf_counter()
            accs.append(float(v.acceptance()))
            if j == 0:
                self.log["alpha1"].append(accs[0])
                self.log["alpha_opt1"].append(self._alpha_opt(pc, qc, K))
            self.analysis_time += time.perf_counter() - a0
            out.append(y)
            survivors = [r for r in alive if X[r, j] == y]
            if not survivors:
                break
            alive = survivors
        tau = len(out) if survivors else len(out) - 1
        if tau == L:
            y = int(_sample(Q[alive[0], L][None], self.gen)[0])
            out.append(y)
        row = alive[0]
        self.t.seq = ctx + X[row].tolist()
        self.d.seq = ctx + X[row, : L - 1].tolist()
        self.t.sync(ctx + out, row=row)
        self.d.sync(ctx + out, row=row)
        reached = np.zeros(L)
        reached[:tau] = 1.0
        pred_reached = np.zeros(L)
        pred_reached[: len(accs)] = accs  # 1{depth j reached} * a_j: unbiased for P(tau >= j)
        self._record(tau, len(out), 1, float(sum(accs)), float(sum(accs)) + 1.0, 1.0, reached, pred_reached)
        return out

    # -- token-level schemes on the models' device ----------------------------------------------
    def _iter_token_t(self, ctx, L):
        """One chain iteration of ``L`` drafts on the device (:func:`verify_chain_t`): one host synchronisation,
        the emitted tokens with the flags of non-finite logits."""
        K = self.K
        d, t = self.d, self.t
        gt = self.device_gens[1]
        X, Xt, Pt, Q, logits_t = self._draft_and_score_t(ctx, L)
        tdev = Xt.device
        if K == 1 and self._reads_host(tdev):
            on_host = self._block_onestep_on_host if self.scheme.kind == "block" else self._chain_on_host
            return on_host(ctx, L, X[0], Pt[0], Q[0], logits_t[0], gt)
        _laws_into(self.sampling, logits_t, Q)  # (K, L + 1, V)
        if self.scheme.kind == "block":  # block-onestep: the law of tau given the block, and alpha_1
            out, tau, row, law = verify_block_onestep_t(Xt, Pt, Q, gt, work=self._work)
            alpha = torch.cat([law, torch.minimum(Pt[0, 0], Q[0, 0]).sum()[None]])
        else:
            out, tau, row, alpha = verify_chain_t(Xt, Pt, Q, gt, work=self._work)
        # the one synchronisation (the flags' bools promoted to int64 by the one cat: no cast or cat of their own)
        host = torch.cat([out, tau[None], row[None], bad_rows(Pt).flatten(), bad_rows(Q).flatten()]).tolist()
        if any(host[L + 3:]):
            self._refuse_bad_logits(ctx, host[L + 3:], L)
        tau, row = int(host[L + 1]), int(host[L + 2])
        out = host[: tau + 1]
        held = ctx + out[:tau] + [-1] * (L - tau)  # what the states hold past the accepted tokens never matches
        t.seq, d.seq = held, held[: len(ctx) + L - 1]
        t.sync(ctx + out, row=row)
        d.sync(ctx + out, row=row)
        self.dev_log.append(self._pad_depths(alpha, L))
        if self.log_laws and K > 1:
            self.first_laws.append((Pt[0, 0].clone(), Q[0, 0].clone()))  # every chain shares the first laws
            if len(self.first_laws) == LAW_BATCH:
                self._flush_first_laws()
        reached = np.zeros(L)
        reached[:tau] = 1.0
        self._record(tau, len(out), 1, math.nan, math.nan, 1.0, reached, np.full(L, math.nan))
        return out

    def _draft_and_score_t(self, ctx, L):
        """The device route's draft and target phases: ``K`` chains of ``L`` drafts drawn on the draft's device
        (its generator), scored by the target in one call. Returns the drafts ``X`` (K, L) on the draft's device,
        the drafts ``Xt`` and laws ``Pt`` (K, L, V) on the target's, the block ``Q`` (K, L + 1, V) there that
        receives the target's laws (not formed yet) and the target's logits (K, L + 1, V); no host read."""
        K = self.K
        d, t = self.d, self.t
        gd = self.device_gens[0]
        pending = d.sync(ctx)
        ids = torch.tensor([pending], dtype=torch.long, device=d.lm.device)
        logits = d.logits_ids(ids, last=1)[:, -1]
        V = logits.shape[-1]
        full = L == self.L  # one block per decode, reused; a shortened iteration's laws in views of another
        P = self._P = _law_block(self._P, (K, L, V), logits.device) if full else _block(self._work, "P", (K, L, V),
                                                                                         logits.device)
        X = torch.empty((K, L), dtype=torch.long, device=logits.device)
        P1 = _laws_into(self.sampling, logits, P[:1, 0])  # (1, V)
        if K > 1:
            P[1:, 0] = P1
        c = _block(self._work, "draw_c", (K, V), logits.device)  # the draws' running sums, reused (same bits)
        host = self._reads_host(logits.device)
        if K == 1:  # each draft id written into its column by the draw itself (no copy op)
            _draw_rows_on(host, P1, gd, c[:1], ids=X[:, 0])
        else:
            X[:, 0] = draw_rows(P1.expand(K, V), gd, out=c)
        for j in range(1, L):
            _laws_into(self.sampling, d.logits_ids(X[:, j - 1 : j], last=1)[:, -1], P[:, j])
            if K == 1:
                _draw_rows_on(host, P[:, j], gd, c, ids=X[:, j])
            else:
                X[:, j] = _draw_rows_on(host, P[:, j], gd, c)
        pending_t = t.sync(ctx)
        tdev = t.lm.device
        Xt, Pt = X.to(tdev, non_blocking=True), P.to(tdev, non_blocking=True)
        head = torch.tensor(pending_t, dtype=torch.long, device=tdev).expand(K, len(pending_t))
        Q = self._Q = _law_block(self._Q, (K, L + 1, V), tdev) if full else _block(self._work, "Q", (K, L + 1, V),
                                                                                         tdev)
        logits_t = t.logits_ids(torch.cat([head, Xt], dim=1), last=L + 1)[:, -(L + 1):]  # (K, L + 1, V)
        return X, Xt, Pt, Q, logits_t

    def _block_t(self, ctx, L):
        r"""Block verification (``verifier="block"``, ``K = 1``) on an accelerator: the decision and the first
        token past the accepted ones on the device (:func:`block_walk_t`), then the continuation's model calls
        with its tokens kept on the device.

        Host synchronisations: one per iteration (the drafts, :math:`\tau`, that token, the flags of
        non-finite logits and the ``2 L`` numbers of the logged law: :math:`w_L`, the walk's sums and
        :math:`\alpha_1`), plus one when :math:`\tau < L` (the continuation's ``L - tau`` tokens and its laws'
        flags) -- ``1 + 1\{\tau < L\}``. The continuation :math:`y_{\tau+2}, \ldots, y_{L+1}` is drawn as
        :class:`otspec.block.BlockVerify` draws it, :math:`\propto (M_b(y^j, x) - M_s(y^j, x))_+` along the
        output prefix and the bonus from :math:`M_b`, each law from one call of each model on its state cut back
        to :math:`X^\tau` (``L - tau`` target calls and ``L - tau - 1`` draft calls, whether or not the output
        meets the block again: the tokens are never read in between). So ``target_calls`` is :math:`1 + L -
        \tau` (the numpy route reuses the block's laws where the output follows the block and may make fewer).
        Non-finite logits are refused with the model and the position. Returns the emitted tokens."""
        d, t = self.d, self.t
        gt = self.device_gens[1]
        _, Xt, Pt, Q, logits_t = self._draft_and_score_t(ctx, L)
        _laws_into(self.sampling, logits_t, Q)
        x, P, Q = Xt[0], Pt[0], Q[0]
        tau, y, w, sums = block_walk_t(x, P, Q, gt, work=self._work)
        f64 = torch.float64
        bad = torch.cat([bad_rows(P), bad_rows(Q)]).to(f64)
        a1 = torch.minimum(P[0], Q[0], out=_block(self._work, "chain_min", (P.shape[-1],), P.device)).sum()
        host = torch.cat([x.to(f64), torch.stack([tau, y]).to(f64), bad, w[L:], sums.flatten(),
                          a1[None]]).tolist()  # the one synchronisation (ids < 2**53: exact in float64)
        xs, (tau, y0) = [int(v) for v in host[:L]], (int(v) for v in host[L : L + 2])
        flags = host[L + 2 : 3 * L + 3]
        if any(flags):
            self._refuse_bad_logits(ctx, flags, L)
        rest = host[3 * L + 3 :]
        w_L, pairs, a1 = rest[0], [tuple(rest[1 + 2 * i : 3 + 2 * i]) for i in range(L - 1)], rest[-1]
        out = xs[:tau] + [y0]
        if tau < L:
            t.seq, d.seq = ctx + xs, ctx + xs[: L - 1]  # what the draft and target calls left in the states
            out += self._continuation_t(ctx, xs, tau, y0, P, Q, w)
        t.seq, d.seq = ctx + out[:L], ctx + out[: L - 1]  # what the states hold: the output but its last token(s)
        law = backward_law(w_L, pairs)
        self._record_block(L, out, tau, 1 + L - tau, law, a1)
        return out

    def _continuation_t(self, ctx, xs, tau, y0, P, Q, w):
        """The continuation of :meth:`_block_t` past its first token ``y0``: tokens ``tau + 2 .. L + 1`` of the
        output drawn on the target's device, each model fed the last token on the device; one host read at the
        end. Returns those ``L - tau`` tokens."""
        d, t = self.d, self.t
        gt = self.device_gens[1]
        L, V = P.shape
        tdev, ddev = P.device, torch.device(d.lm.device)
        head = ctx + xs[:tau] + [y0]
        cur = torch.tensor([y0], dtype=torch.long, device=tdev)
        for tr in (d, t):
            tr.sync(head)  # cut back to X^tau (the pending token is y0, fed below)
        jb, js = w[tau : tau + 1], torch.ones(1, dtype=P.dtype, device=tdev)  # M_b / M_s of the prefix, scaled
        cb, cs = Q[tau], P[tau]
        toks, bad = [], []
        for j in range(tau + 1, L + 1):  # the law after the output's first j tokens
            jb, js = jb * cb.index_select(0, cur), js * cs.index_select(0, cur)
            cb = _laws_into(self.sampling, t.logits_ids(cur.view(1, 1), last=1)[:, -1],
                            _block(self._work, "cont_target", (1, V), tdev))[0]
            bad.append(bad_rows(cb))
            if j == L:
                cur = _draw_into_work(cb[None], gt, self._work)
            else:
                lg = d.logits_ids(cur.view(1, 1).to(ddev, non_blocking=True), last=1)[:, -1]
                cs = _laws_into(self.sampling, lg, _block(self._work, "cont_draft", (1, V), ddev))[0]
                cs = cs.to(tdev, non_blocking=True)
                bad.append(bad_rows(cs))
                r = torch.mul(cb, jb, out=_block(self._work, "block_r", (V,), tdev)).sub_(cs * js).clamp_(min=0.0)
                r = torch.where(r.sum() > 0, r, cb, out=r)
                cur = _draw_into_work(r[None], gt, self._work)
            toks.append(cur)
        host = torch.cat([torch.cat(toks), torch.stack(bad).to(torch.long)]).tolist()  # the second read
        n = L - tau
        for i, f in enumerate(host[n:]):
            if f:  # the laws in order: per position the target's, then (but at the last) the draft's
                j, role = tau + 1 + i // 2, ("target" if i % 2 == 0 else "draft")
                lm = t.lm if role == "target" else d.lm
                raise _bad_logits_error(role, lm, len(ctx) + j, "a call of block verification's continuation")
        return host[:n]

    def _record_block(self, L, out, tau, calls, law, a1):
        r"""Log an iteration of block verification (``"block"``) on the torch route: the emitted ``L + 1`` tokens,
        the target calls made, the law of :math:`\tau` given the block, :math:`\alpha_1` (also
        ``alpha_opt_first``, the optimum for one draft); the predictions as the numpy route makes them."""
        t_idx = np.arange(L + 1)
        reached = np.zeros(L)
        reached[:tau] = 1.0
        self.log["alpha1"].append(a1)
        self.log["alpha_opt1"].append(a1)
        self._record(tau, len(out), calls, float(law @ t_idx), float(L + 1), 1.0 + float(law[:L] @ (L - t_idx[:L])),
                     reached, np.cumsum(law[::-1])[::-1][1:])

    def _reads_host(self, device) -> bool:
        """Whether speculative sampling's verification (``K = 1``) reads its few numbers on the host
        (:attr:`read_on_host`; default: on the CPU, where a read costs no synchronisation)."""
        return torch.device(device).type == "cpu" if self.read_on_host is None else bool(self.read_on_host)

    def _chain_on_host(self, ctx, L, x, P, Q, logits, gen):
        r"""Speculative sampling's verification (``K = 1``) reading the host, the route of a CPU: the target's
        laws formed row by row and only as far as the chain goes.

        The same draws as :func:`verify_chain_t` (:func:`_verify_one_chain_t`): the ``L`` uniforms in one call,
        then depth ``j`` accepted when :math:`u_j\,p_j(x_j) < q_j(x_j)` (the same float64 product and
        comparison, read as Python floats), up to the first rejection ``tau``; the residual
        :math:`(q_{\tau+1} - p_{\tau+1})_+` (:math:`q_{L+1}` after ``L`` acceptances) drawn by the same call on the
        same row. The target's law of depth ``j`` is needed only for ``j <= tau`` (its acceptance test, and the
        logged :math:`\alpha_j = \sum_x \min(p_j, q_j)` of the depths reached), so the rows past the first
        rejection are never formed: each row is the softmax of its own logits, the same values bit for bit as
        the block's. Their logits are still checked (:func:`bad_logit_rows`, the rule of :func:`bad_rows`), so
        non-finite logits anywhere in the call are refused as before. Returns the emitted tokens."""
        xs = x.tolist()
        u = torch.rand(L, dtype=torch.float64, device=P.device, generator=gen).tolist()
        tau = 0
        while True:
            _laws_into(self.sampling, logits[tau : tau + 1], Q[tau : tau + 1])
            if tau == L or not u[tau] * P[tau, xs[tau]].item() < Q[tau, xs[tau]].item():
                break
            tau += 1
        qrow = Q[tau : tau + 1]
        r = qrow.sub(P[tau : tau + 1]).clamp_(min=0.0) if tau < L else qrow
        y = int(_draw_into_work(r if r.sum().item() > 0 else qrow, gen, self._work, host=True)[0])  # guarded
        m = min(tau + 1, L)  # the depths verified: the logged predictions read alpha_j there only
        alpha = torch.zeros(L, dtype=torch.float64, device=P.device)
        alpha[:m] = torch.minimum(P[:m], Q[:m]).sum(-1)
        return self._emit_on_host(ctx, L, xs[:tau] + [y], tau, P, Q[: tau + 1], logits[tau + 1:], alpha)

    def _block_onestep_on_host(self, ctx, L, x, P, Q, logits, gen):
        r"""One-step block verification (``K = 1``) reading the host, the route of a CPU: the same draws, the same
        logged law and the same bits as :func:`verify_block_onestep_t`, with the target's bonus law
        :math:`q_{L+1}` formed only when every draft is accepted.

        The weights :math:`w_i` come from :math:`p_i(x_i)` and :math:`q_i(x_i)` read as Python floats (the same
        float64 division, product and minimum), the :math:`Z_i` from the same torch operators on the same
        ``(L - 1, V)`` block, and :math:`h_i`, :math:`P(\tau = t \mid X)` and :math:`\tau` in Python floats
        (the same operations in the same order as :func:`block_onestep_tau_law_t`; the suffix products
        sequential from :math:`t = L` down, as ``torch.cumprod``). Neither :math:`\tau` nor the law reads
        :math:`q_{L+1}`, so the target's laws are formed for the depths ``1..L`` and its last row only at
        :math:`\tau = L` (its logits are checked otherwise, :func:`bad_logit_rows`). The residual
        :math:`(w_\tau q_{\tau+1} - p_{\tau+1})_+` for :math:`0 < \tau < L` is the row of the ``Z`` block already
        made (its mass :math:`Z_\tau`), at :math:`\tau = 0` one subtraction (:math:`w_0 = 1`), at :math:`\tau = L`
        one product (:math:`p_{L+1} = 0`): the same values as the accelerator's route, with no copies of rows.
        Returns the emitted tokens."""
        xs = x.tolist()
        _laws_into(self.sampling, logits[:L], Q[:L])
        px, qx = P[torch.arange(L), x].tolist(), Q[torch.arange(L), x].tolist()
        _, w, _, ok = float_chains(px, qx)  # w_i = min(w_{i-1} q_i(x_i) / p_i(x_i), 1), the device's float chain
        if not ok:  # past the float range: the device route's recomputation on the same values, the same bits
            t64 = functools.partial(torch.tensor, dtype=torch.float64)
            chain = (None, t64([w[1:]]))
            w = [1.0] + path_weight_rows(t64([px]), t64([qx]), namespace(P), lambda: chain, block=False,
                                         onestep=True)[1][0].tolist()
        V, dev = P.shape[-1], P.device
        R = _block(self._work, "block_z", (L - 1, V), dev)  # row i - 1: (w_i q_{i+1} - p_{i+1})_+, i = 1..L-1
        Z = []
        if L > 1:
            torch.mul(torch.tensor(w[1:L], dtype=torch.float64, device=dev)[:, None], Q[1:L], out=R)
            Z = R.sub_(P[1:L]).clamp_(min=0.0).sum(-1).tolist()
        den = [z + (1.0 - wi) for z, wi in zip(Z, w[1:L])]
        h = [w[0]] + [z / dn if dn > 0 else 1.0 for z, dn in zip(Z, den)] + [w[L]]
        tail = [1.0] * (L + 2)  # tail[t] = prod_{j >= t} (1 - h_j), tail[L + 1] = 1
        tail[L] = 1.0 - h[L]
        for t in range(L - 1, -1, -1):
            tail[t] = tail[t + 1] * (1.0 - h[t])
        law = [h[t] * tail[t + 1] for t in range(L + 1)]
        eta = torch.rand(L, dtype=torch.float64, device=dev, generator=gen).tolist()
        tau = max([i for i in range(1, L + 1) if eta[i - 1] < h[i]], default=0)
        if 0 < tau < L:  # the residual is a row of the Z block, its mass Z_tau (> 0 iff the row's sum is)
            r, mass = R[tau - 1 : tau], Z[tau - 1]
        else:  # w_0 = 1 (q_1 - p_1: no product), or the bonus w_L q_{L+1} (p_{L+1} = 0: nothing subtracted)
            if tau == L:
                _laws_into(self.sampling, logits[L:], Q[L:])
            r = _block(self._work, "block_r", (1, V), dev)
            r = (torch.sub(Q[:1], P[:1], out=r) if tau == 0 else torch.mul(Q[L:], w[L], out=r)).clamp_(min=0.0)
            mass = r.sum().item()
        qrow = Q[tau : tau + 1]
        y = int(_draw_into_work(r if mass > 0 else qrow, gen, self._work, host=True)[0])
        alpha1 = torch.minimum(P[0], Q[0]).sum()[None]
        log = torch.cat([torch.tensor(law, dtype=torch.float64, device=dev), alpha1])
        formed = L + (tau == L)
        return self._emit_on_host(ctx, L, xs[:tau] + [y], tau, P, Q[:formed], logits[formed:], log)

    def _emit_on_host(self, ctx, L, out, tau, P, Q, logits, log):
        """The end of an iteration verified on the host (``K = 1``): non-finite logits refused (the draft's laws
        ``P``, the target's laws formed ``Q``, then the target's ``logits`` of the laws never formed), the states
        synchronised to the emitted tokens ``out``, the device log's row ``log`` and the iteration recorded."""
        flags = bad_rows(P).tolist() + bad_rows(Q).tolist() + bad_logit_rows(self.sampling, logits).tolist()
        if any(flags):
            self._refuse_bad_logits(ctx, flags, L)
        t, d = self.t, self.d
        held = ctx + out[:tau] + [-1] * (L - tau)  # what the states hold past the accepted tokens never matches
        t.seq, d.seq = held, held[: len(ctx) + L - 1]
        t.sync(ctx + out, row=0)
        d.sync(ctx + out, row=0)
        self.dev_log.append(self._pad_depths(log, L))
        reached = np.zeros(L)
        reached[:tau] = 1.0
        self._record(tau, len(out), 1, math.nan, math.nan, 1.0, reached, np.full(L, math.nan))
        return out

    def _refuse_bad_logits(self, ctx, flags, L):
        """ValueError naming the model and the position of the first law made from non-finite logits (``flags``:
        the draft's ``K L`` then the target's ``K (L + 1)``, ``L`` the iteration's drafts)."""
        K = self.K
        fd, ft = np.array(flags[: K * L]).reshape(K, L), np.array(flags[K * L:]).reshape(K, L + 1)
        role, lm, f = ("draft", self.d.lm, fd) if fd.any() else ("target", self.t.lm, ft)
        r, j = (int(a[0]) for a in np.nonzero(f))
        raise _bad_logits_error(role, lm, len(ctx) + j, f"chain {r}")

    def _finish_device_log(self) -> None:
        """The per-iteration predictions of the device route, from its logged acceptances (one transfer); an
        iteration of ``L_i < L`` drafts logged its own (:meth:`_pad_depths`), one of none NaN."""
        if not self.dev_log:
            return
        K, L, lg = self.K, self.L, self.log
        A = _np(torch.stack(self.dev_log).to("cpu"))  # (N, L): depth acceptances; block: (N, L + 2)
        taus = np.array(lg["accepted"], dtype=np.int64)
        drafted = np.array(lg["lengths"], dtype=np.int64)
        if self.scheme.kind == "block":  # P(tau = t | X), t = 0..L, then alpha_1 = sum min(p_1, q_1)
            law = A[:, : L + 1]
            pred_tau = law @ np.arange(L + 1)
            lg["pred_reached"] = list(np.cumsum(law[:, ::-1], axis=1)[:, ::-1][:, 1:])  # P(tau >= j | X)
            lg["pred_acc"] = list(pred_tau)
            lg["pred_emit"] = list(pred_tau + 1.0)
            lg["alpha1"] = lg["alpha_opt1"] = list(A[:, L + 1])
            return
        m = np.minimum(taus + 1, drafted)  # depths verified
        pred = np.where(np.arange(L)[None, :] < m[:, None], A, 0.0)  # 1{depth j reached} a_j
        lg["pred_reached"] = list(pred)
        lg["pred_acc"] = list(pred.sum(axis=1))
        lg["pred_emit"] = list(pred.sum(axis=1) + 1.0)
        lg["alpha1"] = list(A[:, 0])
        if K == 1:
            lg["alpha_opt1"] = list(A[:, 0])
        elif self.log_laws:
            self._flush_first_laws()
            opt = np.full(len(taus), math.nan)  # an iteration without drafts kept no first laws
            if self.alpha_opt:
                opt[drafted > 0] = _np(torch.cat(self.alpha_opt).to("cpu"))
            lg["alpha_opt1"] = list(opt)
        else:
            lg["alpha_opt1"] = [math.nan] * len(taus)

    def _flush_first_laws(self) -> None:
        r""":math:`\alpha_K` of the first laws kept so far, in one batched sort on their device, timed as analysis
        (excluded from ``wall_time``); the laws are then dropped."""
        if not self.first_laws:
            return
        dev = self.first_laws[0][0].device
        a0 = _clock(dev)
        p1 = torch.stack([a for a, _ in self.first_laws])
        q1 = torch.stack([b for _, b in self.first_laws])
        self.alpha_opt.append(otspec.alpha_k(p1, q1, self.K, validate=False))
        self.first_laws = []
        self.analysis_time += _clock(dev) - a0

    # -- block verification (K = 1) -----------------------------------------------------------
    def _iter_block(self, ctx, L):
        X, P, Q = self._draft_and_score(ctx, L)
        P, Q = _np(P), _np(Q)  # K = 1: the block verifier and its analysis read every row of the block
        block = tuple(X[0].tolist())
        cs = {block[:i]: P[0, i] for i in range(L)}
        cb = {block[:i]: Q[0, i] for i in range(L + 1)}
        self.t.seq = ctx + list(block)
        self.d.seq = ctx + list(block[: L - 1])
        dm = _PathModel(self.d, ctx, cs)
        tm = _PathModel(self.t, ctx, cb)
        ver = otspec.block.make_verifier(dm, tm, L, self.scheme.name)
        step = ver.verify(block, rng=self.gen)
        out = [int(t) for t in step.output]
        tau = int(step.tau)
        calls = 1 + tm.extra_calls
        a0 = time.perf_counter()
        # the law along the block from the decoder's own float64 rows (checked when formed from the logits), by the
        # verifier's own formula: what otspec.block.tau_law_on_path returns on them, without checking each row again
        law = type(ver)._path_tau_law(block, [P[0, i] for i in range(L)], [Q[0, i] for i in range(L)])
        t_idx = np.arange(L + 1)
        pred_tau = float(law @ t_idx)
        if self.scheme.name == "block":
            pred_emit = float(L + 1)
            pred_calls = 1.0 + float(law[:L] @ (L - t_idx[:L]))
        else:
            pred_emit, pred_calls = pred_tau + 1.0, 1.0
        reached = np.zeros(L)
        reached[:tau] = 1.0
        pred_reached = np.cumsum(law[::-1])[::-1][1:]  # P(tau >= j | X), j = 1..L
        p1, q1 = P[0, 0], Q[0, 0]
        self.log["alpha1"].append(float(np.minimum(p1, q1).sum()))
        self.log["alpha_opt1"].append(self._alpha_opt(p1, q1, 1))
        self.analysis_time += time.perf_counter() - a0
        self.t.sync(ctx + out)
        self.d.sync(ctx + out)
        self._record(tau, len(out), calls, pred_tau, pred_emit, pred_calls, reached, pred_reached)
        return out

    def _block_on_host(self, ctx, L):
        r"""Block verification (``verifier="block"``, ``K = 1``) reading the host, the route of a CPU: the draws,
        tokens, model calls and logged law of the numpy route (:meth:`_iter_block`) bit for bit, with no copy of a
        law and no pass over the vocabulary that the algorithm does not need.

        The same uniforms of the decoder's numpy generator in the same order: the draft's ``L`` tokens by
        :func:`sample_rows` on views of the laws, then Sun et al.'s Algorithm 3 (arXiv:2403.10444) as
        :meth:`otspec.block.BlockVerify._run` runs it -- the whole block accepted when :math:`\eta_0 < w_L`
        (:math:`w_k = M_b(X^k) / M_s(X^k)` from :math:`p_i(x_i)`, :math:`q_i(x_i)` read as Python floats), else
        the backward walk :math:`\eta \, p_{\rm rej}(X^k) < p_{\rm remain}(X^k)`, ``k = L-1`` down to 1, and the
        ``L - tau`` tokens of the continuation drawn from :math:`(M_b(y^j, x) - M_s(y^j, x))_+`, then the bonus
        from :math:`M_b`. The sums of the walk (:func:`~otspec.block._verifiers.remain_rej`, computed for every
        ``k`` once) are those of the logged law (:func:`~otspec.block._verifiers.backward_law`), the helpers
        the numpy verifier and :func:`otspec.block.tau_law_on_path` call, on the same rows: the same bits. A
        continuation's law is the logged row while the output follows the draft block, else one call of each
        model on its kept state (:meth:`_law_after`, timed as every call; non-finite logits refused with the
        model and the position). The target's bonus law :math:`q_{L+1}` is formed only when read (its logits
        checked otherwise); :math:`\alpha_1 = \sum_x \min(p_1, q_1)` is also ``alpha_opt_first``
        (:math:`\alpha_1` is the optimum for one draft). Returns the emitted tokens (``L + 1``)."""
        d, t, gen, smp = self.d, self.t, self.gen, self.sampling
        logits = d.logits_t(np.array([d.sync(ctx)], dtype=np.int64), last=1)[:, -1]  # (1, V)
        V, dev = logits.shape[-1], logits.device
        full = L == self.L
        P = (_law_block(self._P, (1, L, V), dev) if full else _block(self._work, "P", (1, L, V), dev))
        Q = (_law_block(self._Q, (1, L + 1, V), dev) if full else _block(self._work, "Q", (1, L + 1, V), dev))
        if full:
            self._P, self._Q = P, Q
        P, Q = P[0], Q[0]
        Pn, Qn = _np(P), _np(Q)  # views: the rows the numpy verifier reads
        xs: list[int] = []
        for j in range(L):
            if j:
                logits = d.logits_t(np.array([xs[-1:]], dtype=np.int64), last=1)[:, -1]
            _laws_into(smp, logits, P[j : j + 1])
            xs.append(int(sample_rows(Pn[j : j + 1], gen)[0]))
        pending_t = t.sync(ctx)
        lt = t.logits_t(np.array([pending_t + xs], dtype=np.int64), last=L + 1)[0, -(L + 1):]  # (L + 1, V)
        _laws_into(smp, lt[:L], Q[:L])
        flags = bad_rows(P).tolist() + bad_rows(Q[:L]).tolist() + bad_logit_rows(smp, lt[L:]).tolist()
        if any(flags):
            self._refuse_bad_logits(ctx, flags, L)
        t.seq, d.seq = ctx + xs, ctx + xs[: L - 1]
        ar = torch.arange(L)
        px, qx = P[ar, ar.new_tensor(xs)].tolist(), Q[ar, ar.new_tensor(xs)].tolist()
        w = path_weights(px, qx)[0]  # w_k = M_b(X^k) / M_s(X^k): otspec.block's path weights (exact past the range)
        work = self._host_rows(V)
        sums = [remain_rej(w[k], Qn[k], Pn[k], work) for k in range(1, L)]
        law = backward_law(w[L], sums)
        if gen.random() < w[L]:
            tau = L
        else:
            tau = next((k for k in range(L - 1, 0, -1) if gen.random() * sums[k - 1][1] < sums[k - 1][0]), 0)
        y, calls = xs[:tau], 1
        js = jb = 1.0
        for i in range(tau):
            js *= px[i]
            jb *= qx[i]
        for j in range(tau, L):
            if y == xs[:j]:  # the output still follows the block: the laws already formed
                cs_y, cb_y = Pn[j], Qn[j]
            else:
                cs_y, cb_y = self._law_after(d, ctx + y, "draft"), self._law_after(t, ctx + y, "target")
                calls += 1
            x = draw_residual(jb, cb_y, js, cs_y, gen, work)
            js *= float(cs_y[x])
            jb *= float(cb_y[x])
            y.append(x)
        if y == xs:
            _laws_into(smp, lt[L:], Q[L:])
            cb_y = Qn[L]
        else:
            cb_y = self._law_after(t, ctx + y, "target")
            calls += 1
        y.append(sample_from(cb_y, gen))
        t.sync(ctx + y)
        d.sync(ctx + y)
        self._record_block(L, y, tau, calls, law, float(np.minimum(Pn[0], Qn[0], out=work[0]).sum()))
        return y

    def _host_rows(self, V: int):
        """Two float64 rows of ``V`` entries kept across iterations (numpy), the work of the host route's sums
        and draws."""
        rows = self._work.get(("host_rows", V))
        if rows is None:
            rows = self._work[("host_rows", V)] = (np.empty(V), np.empty(V))
        return rows

    def _law_after(self, track: _Track, ctx: list[int], role: str) -> np.ndarray:
        """The ``role`` model's law after ``ctx`` (its state fed only what it lacks, :meth:`_Track.sync`), formed
        into a row kept for ``role`` (:func:`_laws_into`) and returned as a numpy view: block verification's
        continuation on the host. Non-finite logits are refused with the model and the position."""
        logits = track.logits_t(np.array([track.sync(ctx)], dtype=np.int64), last=1)[:, -1]
        row = _laws_into(self.sampling, logits, _block(self._work, "cont_" + role, tuple(logits.shape),
                                                       logits.device))
        if bool(bad_rows(row)[0]):
            raise _bad_logits_error(role, track.lm, len(ctx), "a call of block verification's continuation")
        track.seq = list(ctx)
        return _np(row)[0]

    # -- k draft blocks, every block enumerated (tiny V**L only) -----------------------------------
    def _iter_multiblock(self, ctx, L):
        K = self.K
        dm = _PathModel(self.d, ctx, {})  # queried on every prefix the verifier reads (all of them)
        tm = _PathModel(self.t, ctx, {})
        ver = get_verifier(self.scheme.name).build_multi(dm, tm, L, K)
        s = ver.sample(rng=self.gen)  # k draft blocks from the draft model, then the verification
        tau = int(s.tau)
        one_token = self.scheme.name == "multidraft-one-token"
        out = [int(t) for t in (s.output[: tau + 1] if one_token else s.output)]
        a0 = time.perf_counter()
        law = ver.tau_law()
        pred_tau = float(law @ np.arange(L + 1))
        reached = np.zeros(L)
        reached[:tau] = 1.0
        pred_reached = np.cumsum(law[::-1])[::-1][1:]  # P(tau >= j), j = 1..L
        p1, q1 = dm.next_dist(()), tm.next_dist(())
        self.log["alpha1"].append(float(np.minimum(p1, q1).sum()))
        self.log["alpha_opt1"].append(self._alpha_opt(p1, q1, K))
        self.analysis_time += time.perf_counter() - a0
        self.t.sync(ctx + out)
        self.d.sync(ctx + out)
        self._record(tau, len(out), 1, pred_tau, pred_tau + 1.0 if one_token else float(L + 1), 1.0,
                     reached, pred_reached)
        return out

    def _record(self, tau, emitted, calls, pred_acc, pred_emit, pred_calls, reached, pred_reached):
        r"""Log one iteration; ``reached`` and ``pred_reached`` of an iteration with fewer than ``L`` drafts are
        padded with zeros (a depth not drafted is not reached: :math:`P(\tau \ge j) = 0`)."""
        lg = self.log
        reached, pred_reached = self._pad_zeros(reached), self._pad_zeros(pred_reached)
        lg["accepted"].append(tau)
        lg["emitted"].append(emitted)
        lg["calls"].append(calls)
        lg["pred_acc"].append(pred_acc)
        lg["pred_emit"].append(pred_emit)
        lg["pred_calls"].append(pred_calls)
        lg["reached"].append(reached)
        lg["pred_reached"].append(pred_reached)

    def _pad_zeros(self, a):
        a = np.asarray(a, dtype=np.float64)
        return a if a.shape[0] == self.L else np.concatenate([a, np.zeros(self.L - a.shape[0])])

    def _pad_depths(self, alpha, L):
        r"""The device log's row of an iteration with ``L < self.L`` drafts padded to the decode's width: zeros at
        the depths not drafted (the chain's acceptances; the block verifier's :math:`P(\tau = t)` before its
        :math:`\alpha_1`); the row itself when nothing is missing."""
        if L == self.L:
            return alpha
        z = torch.zeros(self.L - L, dtype=alpha.dtype, device=alpha.device)
        if self.scheme.kind == "block":
            return torch.cat([alpha[: L + 1], z, alpha[L + 1:]])
        return torch.cat([alpha, z])

    # -- the last iteration when one token is left: plain decoding's step ----------------------
    def _iter_plain(self, ctx):
        r"""One target call and one token from its law, no draft (an iteration of ``L_i = 0`` drafts, when
        ``max_new_tokens`` leaves one token to make): plain decoding's step, on the route of the run (the device's
        generator and one host read with ``engine="torch"``). Its :math:`\alpha_1` is NaN (nothing verified)."""
        t = self.t
        pending = t.sync(ctx)
        on_numpy = self.device_gens is None or self.host_block  # the numpy generator draws
        logs_here = on_numpy or self.scheme.name == "block"  # block verification logs on the host on every route
        if logs_here or self.tree_step is not None:  # a tree run's device log is its steps' own
            self.log["alpha1"].append(math.nan)
            self.log["alpha_opt1"].append(math.nan)
        if self.host_block:  # the numpy route's draw, its law formed in a kept row and refused by name if bad
            y = self._plain_on_host(ctx, pending)
        elif on_numpy:
            law = t.feed_t(np.array([pending], dtype=np.int64))[:, -1]
            y = int(_sample(law, self.gen)[0])
        else:
            ids = torch.tensor([pending], dtype=torch.long, device=t.lm.device)
            law = self.sampling.probs(t.logits_ids(ids, last=1)[:, -1], check=False)  # (1, V); bad_rows checks it
            host = self.tree_step is None and self._reads_host(law.device)  # a tree's route is its steps' own
            yb = torch.cat([_draw_rows_on(host, law, self.device_gens[1], None),
                            bad_rows(law).to(torch.long)]).tolist()
            if yb[1]:
                self._refuse_bad_logits(ctx, [1] + [0] * (self.K - 1), 0)
            y = yb[0]
            L, dev = self.L, law.device
            row = torch.full((L + 2 if self.scheme.kind == "block" else L,), math.nan, dtype=torch.float64, device=dev)
            if self.scheme.kind == "block":  # P(tau = 0) = 1, then alpha_1 (NaN)
                row[: L + 1] = 0.0
                row[0] = 1.0
            if self.tree_step is None and not logs_here:
                self.dev_log.append(row)
        t.seq = ctx + [y]
        self._record(0, 1, 1, 0.0, 1.0, 1.0, np.zeros(0), np.zeros(0))
        return [y]

    def _plain_on_host(self, ctx, pending) -> int:
        """Plain decoding's step of :meth:`_block_on_host`'s run: the numpy route's draw (:func:`sample_rows` of
        the target's law after ``ctx``, the decoder's numpy generator) from a law formed in a kept row; non-finite
        logits refused with the model and the position."""
        t = self.t
        logits = t.logits_t(np.array([pending], dtype=np.int64), last=1)[:, -1]
        row = _laws_into(self.sampling, logits, _block(self._work, "cont_target", tuple(logits.shape), logits.device))
        if bool(bad_rows(row)[0]):
            self._refuse_bad_logits(ctx, [1] + [0] * (self.K - 1), 0)
        return int(sample_rows(_np(row), self.gen)[0])

    def _draft_length(self, done: int) -> int:
        r"""Drafts (a tree's levels) of the next iteration after ``done`` tokens: :math:`L_i = \min(L, m - \text{done} - 1)`,
        ``m = max_new_tokens`` (an iteration makes at most :math:`L_i + 1` tokens, so none is made past ``m``; as
        transformers' assisted generation, ``AssistedCandidateGenerator``); ``L`` for a verifier not known to be
        lossless (its output law depends on ``L``: the run keeps the scheme it was asked for)."""
        return min(self.L, self.max_new - done - 1) if self.lossless is True else self.L

    def run(self) -> DecodeResult:
        from tqdm.auto import tqdm

        step = {"block": self._iter_block, "multiblock": self._iter_multiblock}.get(self.scheme.kind, self._iter_token)
        if self.device_gens is not None:
            step = (self._block_on_host if self.host_block
                    else self._block_t if self.scheme.name == "block" else self._iter_token_t)
        if self.tree_step is not None:
            step = functools.partial(self.tree_step, self)
        ctx = list(self.prompt)
        out: list[int] = []
        bar = tqdm(total=self.max_new, disable=not self.progress, desc=f"speculative[{self.scheme.name}]", leave=False)
        devices = (torch.device(self.d.lm.device), torch.device(self.t.lm.device))
        t0 = _clock(*devices)
        try:
            while len(out) < self.max_new:
                L_i = self._draft_length(len(out))  # a tree's depth D_i: its first D_i levels (TreeSteps)
                new = step(ctx, L_i) if L_i else self._iter_plain(ctx)
                self.log["lengths"].append(L_i)
                ctx = ctx + new
                out.extend(new)
                bar.update(min(len(new), self.max_new - bar.n))
                if self.eos and any(t in self.eos for t in new):
                    break
        finally:
            bar.close()
        wall = _clock(*devices) - t0 - self.analysis_time
        self._finish_device_log()
        if self.tree_step is not None:
            self.tree_step.finish(self)
        lg = self.log
        L = self.L
        return DecodeResult(
            tokens=_finish(out, self.max_new, self.eos),
            prompt_length=len(self.prompt),
            verifier_name=self.scheme.name,
            lossless=bool(self.lossless),
            k=self.K,
            L=L,
            sampling=self.sampling,
            accepted=np.array(lg["accepted"], dtype=np.int64),
            emitted=np.array(lg["emitted"], dtype=np.int64),
            target_calls=np.array(lg["calls"], dtype=np.int64),
            predicted_accepted=np.array(lg["pred_acc"], dtype=np.float64),
            predicted_emitted=np.array(lg["pred_emit"], dtype=np.float64),
            predicted_calls=np.array(lg["pred_calls"], dtype=np.float64),
            reached=np.array(lg["reached"], dtype=np.float64).reshape(-1, L),
            predicted_reached=np.array(lg["pred_reached"], dtype=np.float64).reshape(-1, L),
            alpha_first=np.array(lg["alpha1"], dtype=np.float64),
            alpha_opt_first=np.array(lg["alpha_opt1"], dtype=np.float64),
            draft_lengths=np.array(lg["lengths"], dtype=np.int64),
            wall_time=wall,
            draft_calls=self.d.calls,
            total_target_calls=self.t.calls,
            process=None if self.tree_step is None else self.tree_step.plan.process,
            tree=None if self.tree_step is None else self.tree_step.plan.shape,
            engine="torch" if self.device_gens is not None else "numpy",
        )
