r"""What a profile computes: the settings of one run, validated before any model call.

Notation: ``p`` is the draft model's next-token law, ``q`` the target's.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field

from .._registry import get_verifier, suggest, unknown_name_message, verifier_names
from .._validation import validate_positive_int, validate_seed
from ..decoding._sampling import Sampling
from ..decoding._verifiers import decoding_names, lp_max_support, trial_build
from ..multidraft._khisti import MAX_MULTISETS
from ..otm._lp import MAX_PLAN_ENTRIES
from ._renewal import RENEWAL_SCHEMES
from ._tree_bound import (
    BOUND_FIELDS,
    DEFAULT_BOUND_BUDGET,
    bound_law_bytes,
    check_bound_vocabulary,
    validate_bound_budget,
)
from ._trees import (
    check_tree_support,
    kept_tree_bytes,
    resolve_trees,
    tree_law_bytes,
    tree_values_per_position,
    tree_values_per_text_position,
)

__all__ = ["ProfileSettings", "BATCHED", "CHEAP_ACC", "CHEAP_FAMILIES", "CONTEXTS", "ON_REQUEST", "RENEWAL_DEFAULT",
           "MAX_K", "MAX_L", "MAX_TREE_NODES", "MAX_NEW_TOKENS", "MAX_SHARD_SIZE", "MAX_CALL_ROWS", "MAX_LAW_BYTES",
           "MAX_SHARD_VALUES", "DEFAULT_CALIBRATION_S", "MAX_CALIBRATION_S", "costly", "token_verifiers",
           "families", "check_limits", "values_per_prompt", "validate_calibration_s"]

#: Token-level verifiers whose per-depth acceptance has a batched closed form on ``(..., V)`` laws
#: (:func:`otspec.alpha_k` -- also the value of ``"optimal"`` and of the LP plan ``"lp"``, both optimal --,
#: :func:`otspec.multidraft.batched_maximal_coupling_acceptance`, :func:`otspec.multidraft.batched_kseq_acceptance`).
BATCHED = ("token", "optimal", "lp", "kseq")
#: Of those, the ones cheap enough for every position (one sort per depth serves every k); k-Seq's
#: acceptance (one sort per depth for every k, about 30 ms for 4 depths and k = 1..4 at V = 49,152, plus a
#: bisection per k) runs on the subsample.
CHEAP_ACC = ("token", "optimal", "lp")
#: Schemes whose expected accepted tokens given the drafts need no verifier build: products of
#: ``min(1, q/p)`` along a block, and :func:`otspec.block.tau_law_on_path`.
CHEAP_FAMILIES = ("token", "block", "block-onestep")


def costly(kind: str, name: str) -> bool:
    """Whether a quantity is computed at every ``subsample``-th profiled position only.

    Per-depth acceptance (``kind="acc"``) is cheap for :data:`CHEAP_ACC`; expected accepted tokens
    (``kind="tau"``) for :data:`CHEAP_FAMILIES`. Every other quantity builds a verifier per depth
    or per node of the draft tree (at V = 49,152 on one CPU core: k-Seq about 15 ms, mentored 130 ms,
    the optimal verifier 100 ms, the without-replacement optimum about 1.7 s), far above the
    forward passes' time.
    """
    return name not in (CHEAP_ACC if kind == "acc" else CHEAP_FAMILIES)
#: Verifiers computed only when named (never by default): the without-replacement optimum costs
#: about 1.7 s per depth at V = 49,152 (:func:`otspec.otm.alpha_k_without_replacement`).
ON_REQUEST = ("without-replacement",)
#: Schemes whose renewal emission tables along the text are recorded by default (closed forms
#: costing O(L V) per position; k-Seq and multi-round cost a sort per position and survivor count, shared by
#: every k and L: on request).
RENEWAL_DEFAULT = ("token", "block-onestep")
#: Largest support (vocabulary, or top-k) on which the optimal verifier's expected tokens given the
#: drafts run by default; above it, on request (``families=[..., "optimal"]``).
OPTIMAL_TREE_SUPPORT = 1024
#: Default wall seconds of a run's cost calibration (``calibration_s``).
DEFAULT_CALIBRATION_S = 30.0
#: Largest ``calibration_s`` (a day): a larger number is a typo, not a budget.
MAX_CALIBRATION_S = 86_400.0


#: Where the profiled contexts come from.
CONTEXTS = ("sample", "reference")

# Limits on the work and memory a setting implies, checked before any model call and before anything is
# written (a run that cannot finish must not start, nor leave a manifest behind).
#: Largest ``k_max``: every ``k <= k_max`` is evaluated, and the multi-draft verifiers build up to
#: ``k_max`` verifiers per node of the draft tree for each ``k`` (on a 6-token toy pair ``k_max = 512``
#: already costs about 15 s per profiled position; at V = 49,152 a build costs 15 to 130 ms).
MAX_K = 256
#: Largest ``L_max``: ``L_max`` draft calls per profiled position, and emission tables of
#: ``L_max (L_max + 3) / 2`` values per text position and renewal scheme.
MAX_L = 64
#: Largest draft tree, ``k_max * L_max`` nodes: the rows of the draft calls times their depths, the
#: nodes at which verifiers are built, and the calls the per-shard cost calibration times (one per ``(k, L)``).
MAX_TREE_NODES = 1024
#: Largest ``max_new_tokens``: the path positions walked per prompt, each a target call at least.
MAX_NEW_TOKENS = 65_536
#: Largest ``shard_size``: the prompts whose rows are held in memory before their shard is written.
MAX_SHARD_SIZE = 4096
#: Largest model call, ``batch_size * k_max`` rows (the draft tree of every prompt of a batch).
MAX_CALL_ROWS = 4096
#: Largest memory (bytes) of the laws a batch holds at once: the float64 draft and target laws of its
#: trees, ``batch_size k_max (2 L_max + 1) V`` values; the float32 logits of its first target call
#: (prompt and tree on every row, ``batch_size k_max (n + L_max + 1) V`` values for prompts of ``n``
#: tokens); the target's float64 laws along the path, ``batch_size max_new_tokens V`` values (and,
#: for the renewal tables, the draft's along the text and the float32 logits of that pass).
MAX_LAW_BYTES = 4 * 2**30
#: Largest number of values a shard holds before it is written (each about 150 bytes as a Python row):
#: ``min(shard_size, prompts)`` times :func:`values_per_prompt`.
MAX_SHARD_VALUES = 10_000_000


def token_verifiers() -> tuple[str, ...]:
    """Every registered token-level verifier (:data:`otspec.multidraft.VERIFIERS`)."""
    return verifier_names(kind="token")


def families() -> tuple[str, ...]:
    """Every scheme the decoding loop runs on i.i.d. drafts at a real vocabulary: token-level DraftSelection and
    block verification (not the multi-draft block verifiers, which enumerate all ``V**L`` blocks)."""
    return tuple(n for n in decoding_names() if get_verifier(n).build_multi is None)


def _names(value, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    try:
        items = list(value)
    except TypeError as exc:
        raise TypeError(f"`{what}` must be a sequence of names, got {type(value).__name__}") from exc
    out = []
    for v in items:
        if not isinstance(v, str):
            raise TypeError(f"`{what}` must hold names (str), got {type(v).__name__} {v!r}")
        if v not in allowed:
            raise ValueError(f"`{what}` got an unknown verifier {v!r}{suggest(v, allowed)}; known: {allowed}")
        if v not in out:
            out.append(v)
    return tuple(out)


@dataclass(frozen=True)
class ProfileSettings:
    r"""Settings of a profile run: the grid, the verifiers, the sampling and the context path.

    .. math::

        \text{at each profiled context } c:\quad
        X^{(1)}, \dots, X^{(k_{\max})} \overset{\text{i.i.d.}}{\sim} p(\cdot \mid c)^{L_{\max}},
        \quad\text{one target scoring of the tree.}

    Parameters
    ----------
    k_max, L_max : int
        Largest number of drafts and largest draft length; every ``k <= k_max``
        and ``L <= L_max`` is computed from the same drafts.
    max_new_tokens : int
        Length of the context path after each prompt (profiled positions are
        its first ``max_new_tokens`` positions, every ``stride``-th).
    stride : int
        Distance between profiled positions along the path.
    verifiers : sequence of str or None
        Token-level verifiers whose per-depth acceptance is recorded (default:
        every registered one whose required options are given).
    families : sequence of str or None
        Schemes whose expected accepted tokens are recorded (default: every
        i.i.d. decoding scheme except ``"lp"``, whose LP needs a small support).
    verifier_options : dict or None
        Per-verifier options, e.g. ``{"mentored": {"D": 0.1}, "ensemble": {"w": 0.5}}``.
    subsample : int
        The costly quantities (:func:`costly`: every verifier built per depth
        or per tree node) are computed at every ``subsample``-th profiled
        position only (1: everywhere, 0: never).
    temperature, top_k, top_p, top_p_rule
        As :class:`otspec.decoding.Sampling`, applied to draft and target.
    context : {"sample", "reference"}
        ``"sample"``: the path continues each prompt with tokens sampled from
        the target; ``"reference"``: the prompt's given reference text
        (teacher forcing).
    seed : int
        Root seed; prompt ``i`` draws from ``np.random.SeedSequence(seed).spawn``'s
        ``i``-th child, so results do not depend on sharding.
    shard_size : int
        Prompts per Parquet shard.
    renewal : sequence of str or None
        Schemes whose emission tables along the text are recorded for the
        renewal estimator (docs/theory/profile.rst); default: those of
        :data:`RENEWAL_DEFAULT` among ``families``; any of
        :data:`otspec.profile.RENEWAL_SCHEMES` may be named (``()``: none).
    batch_size : int
        Prompts walked together, one model call per step for all of them
        (default 1: one prompt at a time). A batch is up to ``batch_size``
        prompts of one shard with equal path length (with ``context="sample"``
        every prompt's; with reference text ``min(max_new_tokens,
        len(reference))``), in order of first appearance, left-padded to the
        longest: each row's padding is masked out of every attention and its
        positions count from its first real token (``new_state(pad=...)`` of
        :class:`otspec.decoding.HFCausalLM` and
        :class:`otspec.decoding.CallableLM`; models without it batch prompts
        of equal length only). A shard holds ``shard_size`` prompts, so
        ``shard_size`` bounds the batch. Each prompt keeps its own generator
        and order of draws: on models whose logits do not depend on the batch
        (e.g. :func:`otspec.profile.toy_pair`, any ``CallableLM`` computed row
        by row) the tables equal the unbatched run's exactly; batched
        transformer kernels round differently (float32 rounding: the padded
        logits agree with each prompt's alone to ``1e-5`` relative in the
        tests), which can, rarely, change a sampled token. How a run executes, like the device: not part of the run's
        identity (its manifest), so a run may resume with another value.
    trees : sequence or None
        Draft-tree families profiled beside the ``(k, L)`` grid, on the same contexts (docs/guide/trees_profile.rst):
        each a text ``process:shape[:verifiers]`` -- ``"topk:branching(4,2)"``, ``"topk:[[0],[1],[0,0]]"``
        (Medusa's ``medusa_choices``), ``"eagle2:3,4,16"`` (SGLang's ``speculative_num_steps``,
        ``speculative_eagle_topk``, ``speculative_num_draft_tokens``), ``"iid:chains(2,3):specinfer"``,
        ``"wor:branching(4,2):sequoia,traversal"`` (default verifiers: SpecInfer's rule for ``iid``, Sequoia's
        and Traversal Verification for ``wor``) -- or a tuple ``(process, shape[, verifiers])`` with a
        :class:`otspec.tree.TreeShape` or :class:`otspec.tree.Eagle2Params`. Stored as canonical texts.
    tree_universe : str, TreeShape or None
        Rank paths whose target path probabilities (and the draft's token probabilities) are recorded at every
        profiled position (with the ``"topk"`` shapes): any static top-k shape inside it gets its exact value, and
        the best one per number of nodes is chosen from them (e.g. ``"branching(8,4,2)"``).
    bound_budget : int
        At every subsampled position, the upper bound on every lossless verifier of each sampled-tree family
        (``"iid"``, ``"wor"``: :func:`otspec.tree.bound`) is computed with at most this many prefixes expanded
        (the context and its children, their laws in one tree-attention call per model and position) and recorded
        beside the verifiers' values (0: off; default 64; at most
        :data:`otspec.profile._tree_bound.MAX_PROFILE_BOUND_BUDGET`). Recorded in the manifest only when the bound
        runs (on, with a sampled family and ``subsample`` > 0), so runs without it keep their manifests.
    calibration_s : float or None
        Wall seconds the run's cost calibration may take (default :data:`DEFAULT_CALIBRATION_S`; None: unbounded):
        after one round of every model-call shape, the timed decodes and the further timings run while their
        estimated seconds fit, the configurations that could still be recommended first
        (:func:`otspec.profile._overhead.overhead_rows`); what the budget left out is recorded and the report
        says so. How a run executes, like ``batch_size``: not part of the run's identity (its manifest).

    Attributes
    ----------
    skipped : dict
        The registered verifiers and schemes left out, each with the reason
        (a sentence): ``{"verifiers": {name: reason}, "families": {name: reason}}``.

    Raises
    ------
    ValueError
        Unknown verifier names (with the closest name), ``k_max`` or ``L_max``
        < 1, options a verifier does not take, a required option missing, an
        unknown ``context``, a bad sampling setting; a setting above one of
        the limits on work and memory (:data:`MAX_K` = 256 drafts,
        :data:`MAX_L` = 64 tokens per draft, :data:`MAX_TREE_NODES` = 1024 for
        ``k_max * L_max``, :data:`MAX_NEW_TOKENS`, :data:`MAX_SHARD_SIZE`, ``bound_budget``,
        :data:`MAX_CALL_ROWS` for ``batch_size * k_max``; those that need the
        vocabulary are checked by :func:`check_limits`).
    TypeError
        Parameters of the wrong type.

    Examples
    --------
    >>> from otspec.profile import ProfileSettings
    >>> s = ProfileSettings(k_max=2, L_max=3, verifiers=["token", "kseq"], families=["token", "block"])
    >>> s.verifiers, s.k_max
    (('token', 'kseq'), 2)
    >>> ProfileSettings(verifiers=["kseqq"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `verifiers` got an unknown verifier 'kseqq' (did you mean 'kseq'?); ...
    >>> ProfileSettings(k_max=10**12)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `k_max` must be at most 256 (MAX_K: ...), got 1000000000000
    >>> s.skipped["families"]["kseq"]
    'Not asked for: `families` was given and does not name it.'
    >>> ProfileSettings(trees=["topk:branching(2,2)", "wor:chains(2,2)"]).trees
    ('topk:branching(2,2)', 'wor:chains(2,2):sequoia,traversal')
    >>> ProfileSettings(trees=["topk:[[0],[0,1],[1,0]]"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `trees[0]`: `paths` must be prefix-closed: the parent path (1,) of (1, 0) is missing
    """

    k_max: int = 4
    L_max: int = 4
    max_new_tokens: int = 64
    stride: int = 1
    verifiers: tuple | None = None
    families: tuple | None = None
    verifier_options: dict = field(default_factory=dict)
    subsample: int = 32
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    top_p_rule: str = "ties"
    context: str = "sample"
    seed: int = 0
    shard_size: int = 8
    renewal: tuple | None = None
    batch_size: int = 1
    trees: tuple | None = None
    tree_universe: str | None = None
    bound_budget: int = DEFAULT_BOUND_BUDGET
    calibration_s: float | None = DEFAULT_CALIBRATION_S

    def __post_init__(self):
        object.__setattr__(self, "calibration_s", validate_calibration_s(self.calibration_s))
        for name in ("k_max", "L_max", "max_new_tokens", "stride", "shard_size", "batch_size"):
            object.__setattr__(self, name, validate_positive_int(getattr(self, name), name))
        object.__setattr__(self, "subsample", validate_positive_int(self.subsample, "subsample", minimum=0))
        object.__setattr__(self, "seed", validate_seed(self.seed, "seed"))
        self._check_bounds()
        plan = resolve_trees(self.trees, self.tree_universe)
        object.__setattr__(self, "trees", plan.specs)
        object.__setattr__(self, "tree_universe", plan.universe_spec)
        object.__setattr__(self, "_tree_plan", plan if plan.families or plan.universe is not None else None)
        object.__setattr__(self, "bound_budget", validate_bound_budget(self.bound_budget, len(plan.sampled)))
        if self.context not in CONTEXTS:
            raise ValueError(unknown_name_message("context", self.context, CONTEXTS))
        Sampling(self.temperature, self.top_k, self.top_p, self.top_p_rule)  # validates the sampling
        opts = self.verifier_options or {}
        if not isinstance(opts, dict):
            raise TypeError(f"`verifier_options` must be a dict of dicts, got {type(opts).__name__}")
        allowed = tuple(dict.fromkeys(token_verifiers() + families()))
        for name, o in opts.items():
            if name not in allowed:
                raise ValueError(f"`verifier_options` names an unknown verifier {name!r}{suggest(name, allowed)}")
            if not isinstance(o, dict):
                raise TypeError(f"`verifier_options[{name!r}]` must be a dict, got {type(o).__name__}")
            extra = set(o) - get_verifier(name).options
            if extra:
                raise ValueError(f"`verifier_options[{name!r}]` accepts {sorted(get_verifier(name).options)}, "
                                 f"got unknown keys {sorted(extra)}")
            if o:  # option values no law takes (mentored's D < 0): refused with the settings, before any model loads
                trial_build(get_verifier(name), 1, o, f"`verifier_options[{name!r}]`")
        object.__setattr__(self, "verifier_options", {k: dict(v) for k, v in sorted(opts.items())})

        def missing(n):
            return sorted(get_verifier(n).required - set(opts.get(n, {})))

        skipped: dict = {"verifiers": {}, "families": {}}
        object.__setattr__(self, "_auto", (self.verifiers is None, self.families is None))
        tv = token_verifiers()
        fam = families()
        if self.verifiers is None:
            v = tuple(n for n in tv if not missing(n) and n not in ON_REQUEST)
        else:
            v = _names(self.verifiers, tv, "verifiers")
        if self.families is None:
            f = tuple(n for n in fam if not missing(n) and n != "lp")
        else:
            f = _names(self.families, fam, "families")
        for n in v + f:
            if missing(n):
                raise ValueError(f"verifier {n!r} needs options {missing(n)}: pass "
                                 f"verifier_options={{{n!r}: {{{missing(n)[0]!r}: ...}}}}")
        for field_name, chosen, every, auto in (("verifiers", v, tv, self.verifiers is None),
                                                ("families", f, fam, self.families is None)):
            for n in every:
                if n not in chosen:
                    skipped[field_name][n] = _left_out_reason(n, field_name, auto, missing(n))
        object.__setattr__(self, "verifiers", v)
        object.__setattr__(self, "families", f)
        object.__setattr__(self, "_skipped", skipped)

        if self.renewal is None:
            r = tuple(n for n in f if n in RENEWAL_DEFAULT)
        else:
            r = _names(self.renewal, tuple(RENEWAL_SCHEMES), "renewal")
        object.__setattr__(self, "renewal", r)

    def _check_bounds(self) -> None:
        """The limits that need no vocabulary (:data:`MAX_K`, ...; :func:`check_limits` checks the others)."""
        for name, limit, what in (
                ("k_max", MAX_K, "MAX_K: every k <= k_max is evaluated, with verifiers built per k at every "
                                 "node of the draft tree"),
                ("L_max", MAX_L, "MAX_L: one draft call per depth, emission tables growing as L_max**2"),
                ("max_new_tokens", MAX_NEW_TOKENS, "MAX_NEW_TOKENS: path positions walked per prompt"),
                ("shard_size", MAX_SHARD_SIZE, "MAX_SHARD_SIZE: prompts held in memory before a shard is written")):
            if getattr(self, name) > limit:
                raise ValueError(f"`{name}` must be at most {limit} ({what}), got {getattr(self, name)}")
        nodes = self.k_max * self.L_max
        if nodes > MAX_TREE_NODES:
            raise ValueError(f"`k_max` * `L_max` = {self.k_max} * {self.L_max} = {nodes} draft tree nodes, above "
                             f"the limit MAX_TREE_NODES = {MAX_TREE_NODES} (verifiers are built per node and the "
                             "cost calibration times one call per (k, L)): lower `k_max` or `L_max`")
        rows = self.batch_size * self.k_max
        if rows > MAX_CALL_ROWS:
            raise ValueError(f"`batch_size` * `k_max` = {self.batch_size} * {self.k_max} = {rows} rows per model "
                             f"call, above the limit MAX_CALL_ROWS = {MAX_CALL_ROWS}: lower `batch_size`")

    @property
    def skipped(self) -> dict:
        """What these settings leave out, and why: ``{"verifiers": {name: reason}, "families": {name: reason}}``.

        Every registered token-level verifier missing from :attr:`verifiers` and every scheme missing
        from :attr:`families`, with the reason as a sentence (not asked for, a required option not
        given, on request only, too large for the vocabulary: :meth:`for_vocabulary`); with
        ``subsample=0``, also the quantities that are never computed although named.
        """
        out = {k: dict(v) for k, v in self._skipped.items()}
        if self.subsample == 0:
            why = ("`subsample` is 0, so the quantities that build a verifier per depth or per tree node are "
                   "never computed.")
            for field_name, kind in (("verifiers", "acc"), ("families", "tau")):
                for n in getattr(self, field_name):
                    if costly(kind, n):
                        out[field_name][n] = why
        return out

    def positions(self) -> dict:
        """Where each quantity is computed: at every profiled position, or at every ``subsample``-th one.

        Returns
        -------
        dict
            ``{"every": [families], "subsample": [families], "subsample_every": subsample,
            "acceptance": {"every": [verifiers], "subsample": [verifiers]}}``: the schemes whose
            expected accepted tokens, and the verifiers whose per-depth acceptance, are computed at
            every profiled position or on the subsample (:func:`costly`; empty with ``subsample=0``).
        """
        def split(names, kind):
            every = [n for n in names if not costly(kind, n)]
            sub = [n for n in names if costly(kind, n)] if self.subsample else []
            return every, sub

        fe, fs = split(self.families, "tau")
        ve, vs = split(self.verifiers, "acc")
        return {"every": fe, "subsample": fs, "subsample_every": self.subsample,
                "acceptance": {"every": ve, "subsample": vs}}

    def for_vocabulary(self, V: int) -> ProfileSettings:
        r"""These settings with the verifiers that cannot run at this vocabulary checked.

        ``"khisti"`` enumerates draft multisets (at most 200,000) and the LP plan ``"lp"``
        has at most :data:`otspec.decoding._verifiers.LP_MAX_COLUMNS` columns, so both need a
        small support (``top_k``; with ``top_p`` the support of a node is not known in advance, so the
        bound is the vocabulary's); ``"lp"``'s per-depth acceptance is :math:`\alpha_k` and always runs.
        The without-replacement optimum needs ``k_max`` tokens with mass. A verifier chosen by default
        that does not fit is left out, with its reason in :attr:`skipped`; one asked for by name raises
        (except the optimal verifier's expected tokens, which run at their cost).

        Raises
        ------
        ValueError
            A verifier asked for by name whose exact computation does not fit the vocabulary.
        """
        V = validate_positive_int(V, "V")
        if self.bounds_trees:
            check_bound_vocabulary(self.bound_budget, V)
        sampling = self.sampling
        reach = 1 if sampling.greedy else (V if self.top_k is None else min(V, self.top_k))
        nucleus = self.top_p is not None and self.top_p < 1.0
        if self.tree_plan is not None:
            check_tree_support(self.tree_plan, reach, "greedy sampling (temperature 0)" if sampling.greedy else
                               f"a vocabulary of {V} tokens" if reach == V else f"`top_k` = {self.top_k}")

        def problem(name: str, kind: str):
            if name == "khisti" and math.comb(reach + self.k_max - 1, self.k_max) > MAX_MULTISETS:
                return (f"'khisti' enumerates C(s + k - 1, k) draft multisets, at most {MAX_MULTISETS}; with "
                        f"s = {reach} tokens and k_max = {self.k_max} that is too many: pass top_k")
            union = V if reach == V else min(V, 2 * reach)  # the draft's and the target's supports together
            if name == "khisti" and math.comb(reach + self.k_max - 1, self.k_max) * union > MAX_PLAN_ENTRIES:
                return (f"the selection plan of 'khisti' is a dense (C(s + k - 1, k), n) array, at most "
                        f"{MAX_PLAN_ENTRIES} entries; with s = {reach} draft tokens, n = {union} tokens of the "
                        f"two supports and k_max = {self.k_max} that is too many: pass top_k")
            if name == "optimal" and kind == "tau" and reach > OPTIMAL_TREE_SUPPORT and not nucleus:
                return (f"the optimal verifier's expected tokens build it at every node of the draft tree with "
                        f"several drafts (0.1 to 2.5 s per build at V = 49,152); above {OPTIMAL_TREE_SUPPORT} tokens they run on "
                        "request only, when `families` names 'optimal' (its per-depth acceptance, alpha_k, always "
                        "runs)")
            if name == "lp" and kind == "tau" and reach > lp_max_support(self.k_max):
                return (f"'lp' builds an LP per tree node: with k_max = {self.k_max} its support may be at most "
                        f"{lp_max_support(self.k_max)} tokens, got {reach}: pass top_k")
            if name == "without-replacement" and self.k_max > reach:
                return (f"'without-replacement' draws k distinct drafts, so it needs k_max = {self.k_max} tokens "
                        f"with mass at every node, and the support has at most {reach}: lower k_max")
            return None

        auto_v, auto_f = self._auto
        keep = {}
        skipped = {k: dict(v) for k, v in self._skipped.items()}
        for field_name, kind, auto in (("verifiers", "acc", auto_v), ("families", "tau", auto_f)):
            names = []
            for n in getattr(self, field_name):
                msg = problem(n, kind)
                if msg is None or (n == "optimal" and not auto):  # named: runs, at its cost
                    names.append(n)
                elif not auto:
                    raise ValueError(f"`{field_name}`: {msg}")
                else:
                    skipped[field_name][n] = f"At a vocabulary of {V} tokens, {msg}."
            keep[field_name] = tuple(names)
        for n in ON_REQUEST:  # the reason quotes the run's own vocabulary
            if skipped["verifiers"].get(n) == _on_request_reason(None):
                skipped["verifiers"][n] = _on_request_reason(V)
        if (keep["verifiers"] == self.verifiers and keep["families"] == self.families
                and skipped == self._skipped):
            return self
        d = self.to_dict()
        d.update(keep, bound_budget=self.bound_budget)  # to_dict leaves it out when the bound is off
        out = ProfileSettings(**d)
        object.__setattr__(out, "_auto", self._auto)
        object.__setattr__(out, "_skipped", skipped)
        return out

    @property
    def tree_plan(self):
        """The resolved tree families (:class:`otspec.profile._trees.TreePlan`), or None without trees."""
        return self._tree_plan

    @property
    def sampling(self):
        """The :class:`otspec.decoding.Sampling` of draft and target."""
        return Sampling(self.temperature, self.top_k, self.top_p, self.top_p_rule)

    def ks(self, name: str) -> tuple[int, ...]:
        """The numbers of drafts recorded for ``name`` (1 only for single-draft verifiers)."""
        return (1,) if get_verifier(name).single_draft or get_verifier(name).kind == "block" else tuple(
            range(1, self.k_max + 1))

    def options(self, name: str) -> dict:
        return dict(self.verifier_options.get(name, {}))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verifiers"] = list(self.verifiers)
        d["families"] = list(self.families)
        d["renewal"] = list(self.renewal)
        if self.trees or self.tree_universe is not None:
            d["trees"] = list(self.trees)
        else:  # a run without trees keeps the manifest of runs made before trees existed
            del d["trees"], d["tree_universe"]
        if not self.bounds_trees:  # a run without the bound keeps the manifest of runs made before it existed
            del d["bound_budget"]
        return d

    @property
    def bounds_trees(self) -> bool:
        """Whether the run records the bound (a positive ``bound_budget``, a sampled family and a subsample)."""
        return bool(self.bound_budget and self.subsample and self.tree_plan is not None and self.tree_plan.sampled)


def validate_calibration_s(value) -> float | None:
    """``calibration_s`` as a float in ``(0, MAX_CALIBRATION_S]``, or None (unbounded).

    Raises
    ------
    TypeError
        Not a real number (a bool included).
    ValueError
        Not finite, not positive, or above :data:`MAX_CALIBRATION_S`.

    Examples
    --------
    >>> validate_calibration_s(5), validate_calibration_s(None)
    (5.0, None)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`calibration_s` must be a number of seconds or None, got {type(value).__name__}")
    v = float(value)
    if not (math.isfinite(v) and 0.0 < v <= MAX_CALIBRATION_S):
        raise ValueError(f"`calibration_s` must be a finite number of seconds in (0, {MAX_CALIBRATION_S:g}] or None "
                         f"(unbounded), got {value!r}")
    return v


def _on_request_reason(V: int | None) -> str:
    """Why the without-replacement optimum runs on request only, at the run's vocabulary ``V`` when known."""
    here = "" if V is None else f"; this run's vocabulary has {V:,} tokens"
    return ("It runs on request only (name it): the without-replacement optimum's cost grows with the vocabulary "
            f"(about 1.7 s per depth measured at SmolLM2's V = 49,152{here}).")


def _left_out_reason(name: str, field_name: str, auto: bool, missing: list) -> str:
    """Why a default leaves ``name`` out of ``field_name`` (a sentence)."""
    if not auto:
        return f"Not asked for: `{field_name}` was given and does not name it."
    if missing:
        return (f"It needs the option {missing[0]!r}, which `verifier_options` does not give "
                f"(e.g. {{\"{name}\": {{\"{missing[0]}\": ...}}}}).")
    if name in ON_REQUEST:
        return _on_request_reason(None)
    if name == "lp" and field_name == "families":
        return ("Its expected tokens build an LP per draft tree node and run on request only (name it); its "
                "per-depth acceptance is alpha_k, recorded as the verifier 'lp'.")
    return "It is not among the defaults."  # pragma: no cover - every default exclusion has its reason above


def values_per_prompt(settings: ProfileSettings, path: int) -> int:
    """An upper bound on the values one prompt of ``path`` positions adds to its shard.

    Per profiled position, every recorded ``(kind, name, k, j)`` (:func:`costly` ones on the
    subsample only: at most ``ceil(positions / subsample)`` of them), plus the renewal tables
    (``L (L + 3) / 2`` values per text position, scheme and ``k``, and ``depth + 1`` per tree row name) and
    the time rows.
    """
    L = settings.L_max
    positions = -(-path // settings.stride)
    sub = 0 if settings.subsample == 0 else -(-positions // settings.subsample)
    cheap = dear = 0
    for kind, names in (("acc", settings.verifiers), ("tau", settings.families)):
        for n in names:
            spec = get_verifier(n)
            per = len(settings.ks(n)) * L * ((1 if spec.lossless else 3) if kind == "acc" else 2)
            if costly(kind, n):
                dear += per
            else:
                cheap += per
    renewal = 0
    if settings.context == "sample":
        renewal = path * (1 + sum(len(settings.ks(n)) for n in settings.renewal) * L * (L + 3) // 2
                          + tree_values_per_text_position(settings.tree_plan))
    bound = sub * len(BOUND_FIELDS) * len(settings.tree_plan.sampled) if settings.bounds_trees else 0
    return (positions * cheap + sub * dear + renewal + positions * tree_values_per_position(settings.tree_plan) + bound
            + 8)


def check_limits(settings: ProfileSettings, V: int, lengths) -> None:
    """Refuse settings whose memory at this vocabulary and on these prompts passes a stated limit.

    ``lengths`` are the prompts' token counts. Checks :data:`MAX_LAW_BYTES` (the laws a batch holds)
    and :data:`MAX_SHARD_VALUES` (the values a shard holds); the limits that need no vocabulary
    are checked by :class:`ProfileSettings` itself.

    Raises
    ------
    ValueError
        Naming the settings to lower, the amount and the limit.
    """
    lengths = [int(n) for n in lengths]
    if not lengths:
        return
    s = settings
    B = min(s.batch_size, s.shard_size, len(lengths))
    n = max(lengths)
    T = s.max_new_tokens
    tree = B * s.k_max * (2 * s.L_max + 1) * V * 8
    first = B * s.k_max * (n + s.L_max + 1) * V * 4
    path = B * T * V * 8 + ((2 * T * V * 8 + (n + T) * V * 4) if s.renewal and s.context == "sample" else 0)
    path += B * T * kept_tree_bytes(s.tree_plan) if s.context == "sample" and s.stride == 1 else 0
    families = tree_law_bytes(s.tree_plan, V, B) + (bound_law_bytes(s.tree_plan, s.bound_budget, V, B)
                                                     if s.bounds_trees else 0)
    need = tree + first + path + families
    if need > MAX_LAW_BYTES:
        raise ValueError(
            f"these settings hold {need / 2**30:.1f} GiB of laws at once at a vocabulary of {V} tokens, above the "
            f"limit MAX_LAW_BYTES = {MAX_LAW_BYTES / 2**30:.0f} GiB (draft trees {tree / 2**30:.2f} GiB: batch "
            f"{B} * `k_max` {s.k_max} * (2 `L_max` + 1) rows; first target call {first / 2**30:.2f} GiB with "
            f"prompts of up to {n} tokens; the path's laws {path / 2**30:.2f} GiB for `max_new_tokens` {T}"
            + (f"; the `trees` {families / 2**30:.2f} GiB" if families else "") + "): "
            "lower `k_max`, `L_max`, `batch_size` or `max_new_tokens`, or shorten the prompts"
            + (" or the `trees`" if families else ""))
    per = max(values_per_prompt(s, T), 1)
    prompts = min(s.shard_size, len(lengths))
    values = prompts * per + 3 * (s.k_max * s.L_max + s.k_max + 1)
    if values > MAX_SHARD_VALUES:
        raise ValueError(
            f"a shard would hold up to {values} values ({prompts} prompts of up to {per} values each), above "
            f"the limit MAX_SHARD_VALUES = {MAX_SHARD_VALUES}: lower `shard_size`, `max_new_tokens`, `k_max` "
            "or `L_max`, or raise `stride` or `subsample`")
