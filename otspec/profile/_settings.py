r"""What a profile computes: the settings of one run, validated before any model call.

Notation: ``p`` is the draft model's next-token law, ``q`` the target's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .._registry import get_verifier, suggest, unknown_name_message, verifier_names
from .._validation import validate_positive_int, validate_seed
from ..decoding._sampling import Sampling
from ..decoding._verifiers import decoding_names, lp_max_support
from ..multidraft._khisti import MAX_MULTISETS
from ._renewal import RENEWAL_SCHEMES

__all__ = ["ProfileSettings", "BATCHED", "CHEAP_ACC", "CHEAP_FAMILIES", "CONTEXTS", "ON_REQUEST", "RENEWAL_DEFAULT",
           "costly", "token_verifiers", "families"]

#: Token-level verifiers whose per-depth acceptance has a batched closed form on ``(..., V)`` laws
#: (:func:`otspec.alpha_k` -- also the value of ``"optimal"`` and of the LP plan ``"lp"``, both optimal --,
#: :func:`otspec.multidraft.batched_maximal_coupling_acceptance`, :func:`otspec.multidraft.batched_kseq_acceptance`).
BATCHED = ("token", "optimal", "lp", "kseq")
#: Of those, the ones cheap enough for every position (one sort per depth serves every k); k-Seq sorts
#: once per k (about 130 ms per k for 4 depths at V = 49,152), so it runs on the subsample.
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
#: costing O(L V) per position; k-Seq and multi-round cost a sort per position and ``(k, L)``: on request).
RENEWAL_DEFAULT = ("token", "block-onestep")
#: Largest support (vocabulary, or top-k) on which the optimal verifier's expected tokens given the
#: drafts run by default; above it, on request (``families=[..., "optimal"]``).
OPTIMAL_TREE_SUPPORT = 1024
#: Where the profiled contexts come from.
CONTEXTS = ("sample", "reference")


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

    Raises
    ------
    ValueError
        Unknown verifier names (with the closest name), ``k_max`` or ``L_max``
        < 1, options a verifier does not take, a required option missing, an
        unknown ``context``, a bad sampling setting.
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

    def __post_init__(self):
        for name in ("k_max", "L_max", "max_new_tokens", "stride", "shard_size", "batch_size"):
            object.__setattr__(self, name, validate_positive_int(getattr(self, name), name))
        object.__setattr__(self, "subsample", validate_positive_int(self.subsample, "subsample", minimum=0))
        object.__setattr__(self, "seed", validate_seed(self.seed, "seed"))
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
        object.__setattr__(self, "verifier_options", {k: dict(v) for k, v in sorted(opts.items())})

        def ready(n):
            return get_verifier(n).required <= set(opts.get(n, {}))

        object.__setattr__(self, "_auto", (self.verifiers is None, self.families is None))
        tv = token_verifiers()
        if self.verifiers is None:
            v = tuple(n for n in tv if ready(n) and n not in ON_REQUEST)
        else:
            v = _names(self.verifiers, tv, "verifiers")
        fam = families()
        if self.families is None:
            f = tuple(n for n in fam if ready(n) and n != "lp")
        else:
            f = _names(self.families, fam, "families")
        for n in v + f:
            if not ready(n):
                missing = sorted(get_verifier(n).required - set(opts.get(n, {})))
                raise ValueError(f"verifier {n!r} needs options {missing}: pass verifier_options={{{n!r}: {{...}}}}")
        object.__setattr__(self, "verifiers", v)
        object.__setattr__(self, "families", f)

        if self.renewal is None:
            r = tuple(n for n in f if n in RENEWAL_DEFAULT)
        else:
            r = _names(self.renewal, tuple(RENEWAL_SCHEMES), "renewal")
        object.__setattr__(self, "renewal", r)

    def for_vocabulary(self, V: int) -> ProfileSettings:
        """These settings with the verifiers that cannot run at this vocabulary checked.

        ``"khisti"`` enumerates draft multisets (at most 200,000) and the LP plan ``"lp"``
        has at most :data:`otspec.decoding._verifiers.LP_MAX_COLUMNS` columns, so both need a
        small support (``top_k``); ``"lp"``'s per-depth acceptance is :math:`\alpha_k` and always runs.
        A verifier chosen by default that does not fit is left out; one asked for by name raises.

        Raises
        ------
        ValueError
            A verifier asked for by name whose exact computation does not fit the vocabulary.
        """
        import math


        reach = V if self.top_k is None else min(V, self.top_k)
        nucleus = self.top_p is not None and self.top_p < 1.0

        def problem(name: str, kind: str):
            if nucleus:
                return None
            if name == "khisti" and math.comb(reach + self.k_max - 1, self.k_max) > MAX_MULTISETS:
                return (f"'khisti' enumerates C(s + k - 1, k) draft multisets, at most {MAX_MULTISETS}; with "
                        f"s = {reach} tokens and k_max = {self.k_max} that is too many: pass top_k")
            if name == "optimal" and kind == "tau" and reach > OPTIMAL_TREE_SUPPORT:
                return (f"the optimal verifier's expected tokens build it at every node of the draft tree "
                        f"(0.1 to 2.5 s per build at V = 49,152); above {OPTIMAL_TREE_SUPPORT} tokens it runs on "
                        "request only (its per-depth acceptance, alpha_k, always runs)")
            if name == "lp" and kind == "tau" and reach > lp_max_support(self.k_max):
                return (f"'lp' builds an LP per tree node: with k_max = {self.k_max} its support may be at most "
                        f"{lp_max_support(self.k_max)} tokens, got {reach}: pass top_k")
            return None

        auto_v, auto_f = self._auto
        keep = {}
        for field_name, kind, auto in (("verifiers", "acc", auto_v), ("families", "tau", auto_f)):
            names = []
            for n in getattr(self, field_name):
                msg = problem(n, kind)
                if msg is None or (n == "optimal" and not auto):  # named: runs, at its cost
                    names.append(n)
                elif not auto:
                    raise ValueError(f"`{field_name}`: {msg}")
            keep[field_name] = tuple(names)
        if keep["verifiers"] == self.verifiers and keep["families"] == self.families:
            return self
        d = self.to_dict()
        d.update(keep)
        return ProfileSettings(**d)

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
        return d
