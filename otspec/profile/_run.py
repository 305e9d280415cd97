r"""``profile``: validate everything, then collect shard by shard (in process or on a dask cluster)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from .._deps import check_installed
from ..decoding._models import validate_language_model
from ._collect import analysis_device, check_device_memory, path_length
from ._distributed import run_on_client, takes_device
from ._prompts import load_prompts
from ._settings import ProfileSettings, check_limits
from ._shard import run_shard
from ._store import (
    FORMAT,
    MANIFEST,
    _model_id,
    check_folder,
    check_report_dest,
    fingerprint,
    manifest_for,
    out_path,
    prompts_entry,
    settings_entry,
    shard_path,
    write_manifest,
    write_shard,
)
from ._trees import check_tree_context

__all__ = ["ProfileRun", "Plan", "profile", "prepare", "execute", "check_before_loading", "check_report_dest",
           "subsample_positions", "subsample_text"]


@dataclass(frozen=True)
class ProfileRun:
    """A finished (or resumed) profile run.

    Attributes
    ----------
    out : pathlib.Path
        The run's folder (``manifest.json`` and ``shard-*.parquet``).
    settings : ProfileSettings
    prompts : int
    shards_written, shards_skipped : int
        Shards computed by this call and shards found finished (a resumed run).
    wall_time : float
        Seconds of this call (not stored in the run's files).
    """

    out: Path
    settings: ProfileSettings
    prompts: int
    shards_written: int
    shards_skipped: int
    wall_time: float


def profile(prompts, *, out, draft=None, target=None, models=None, settings: ProfileSettings | None = None,
            tokenizer=None, chat_template: bool = False, progress: bool | None = None, client=None,
            **options) -> ProfileRun:
    r"""Profile a draft/target pair on prompts: every verifier's exact values on the same draft trees, stored.

    .. math::

        \text{for each prompt } i,\ \text{each profiled } t:\quad
        a_j(k),\ E[\tau_L \mid X] \quad (k \le k_{\max},\ L \le L_{\max},\ \text{every verifier}).

    Everything is checked before any forward pass (settings, prompts, the
    two vocabularies, the limits on work and memory, the output folder);
    then one probe call per model fingerprints it (its next-token laws on
    a fixed context, hashed), the output folder is checked against the
    fingerprints, and only then is anything written: ``out/manifest.json``
    (settings, models with their fingerprints, the prompts' digest, what was
    left out and why -- ``"skipped"`` -- and which quantities run at every
    profiled position or on the subsample -- ``"positions"``), then the
    prompts shard by shard (``settings.shard_size`` prompts each), each
    shard written atomically to ``out/shard-NNNNN.parquet``; shards already
    there are skipped (a killed run resumes, losing at most the shard in
    progress, and only with the same settings, prompts and models).

    Parameters
    ----------
    prompts : list, JSONL path or datasets.Dataset
        See :func:`load_prompts`.
    out : str or path, keyword-only
        The run's folder (created; refused if it holds a run with other settings).
    draft, target : LanguageModel, keyword-only
        :class:`otspec.decoding.HFCausalLM`, :class:`otspec.decoding.CallableLM`,
        ... on any torch device (same vocabulary).
    models : callable, keyword-only
        Instead of ``draft``/``target``: a picklable ``models() -> (draft,
        target)``; needed with ``client`` (each dask worker builds the
        models once and keeps them).
    settings : ProfileSettings, keyword-only
        Or the same fields as keywords (``k_max=``, ``L_max=``, ...).
    tokenizer : callable, keyword-only
        For text prompts, tokenised raw (``add_special_tokens=False``, no chat template).
    chat_template : bool, keyword-only
        Apply the tokenizer's chat template to text prompts, each as one
        user message with the generation prompt (see :func:`load_prompts`).
    progress : bool or None, keyword-only
        A tqdm bar (profiled path tokens, tokens/s, time left); ``None``: on a terminal only.
    client : dask.distributed.Client, keyword-only
        Shard the prompts over its workers (``pip install 'otspec-verifiers[distributed]'``);
        the results are identical to the in-process run (per-prompt seeds).

    Returns
    -------
    ProfileRun

    Raises
    ------
    ValueError
        Bad settings (unknown verifier names with the closest one, ``k_max`` or
        ``L_max`` < 1, a setting above a limit on work or memory, naming it),
        a bad prompt (a JSONL line is named), different vocabularies, an
        empty ``out`` or one that cannot be created or written, an
        output folder holding a run with other settings, prompts or models
        (another fingerprint under the same name included) -- all before
        anything is written, and all but the fingerprints before any forward pass.
    TypeError
        Wrong types; ``client`` without ``models``, or not a dask client (no ``submit``).

    Examples
    --------
    >>> import tempfile
    >>> from otspec.profile import profile, summarize, toy_pair
    >>> draft, target = toy_pair(4, seed=0)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     run = profile([[0, 1], [2]], out=d, draft=draft, target=target, k_max=2, L_max=2,
    ...                   max_new_tokens=4, verifiers=["token", "optimal"], families=["token"])
    ...     s = summarize(d)
    >>> run.prompts, run.shards_written
    (2, 1)
    """
    t0 = time.perf_counter()
    if client is not None and models is None:
        raise TypeError("`client` needs `models`: a picklable models() -> (draft, target) each worker calls once")
    if models is not None:
        if draft is not None or target is not None:
            raise TypeError("pass either `models` or `draft` and `target`, not both")
        if not callable(models):
            raise TypeError(f"`models` must be callable () -> (draft, target), got {type(models).__name__}")
    if client is not None:  # what run_on_client calls, checked before the models are built or anything is written
        need = ("submit", "run", "scheduler_info") if takes_device(models) else ("submit",)
        lacking = [a for a in need if not callable(getattr(client, a, None))]
        if lacking:
            raise TypeError(f"`client` must be a dask.distributed.Client, got {type(client).__name__} (no "
                            f"{', '.join(lacking)})")
    settings = _settings(settings, options)
    if models is not None:
        draft, target = models()
    plan = prepare(prompts, out=out, draft=draft, target=target, settings=settings, tokenizer=tokenizer,
                   chat_template=chat_template)
    written, skipped = execute(plan, draft, target, progress=progress, client=client, models=models)
    return ProfileRun(out=plan.out, settings=plan.settings, prompts=len(plan.items), shards_written=written,
                      shards_skipped=skipped, wall_time=time.perf_counter() - t0)


def _settings(settings, options) -> ProfileSettings:
    check_installed("pyarrow", "a profile's Parquet shards", "profile")
    if settings is None:
        return ProfileSettings(**options)
    if options:
        raise TypeError(f"pass either `settings` or its fields as keywords, not both (got {sorted(options)})")
    if not isinstance(settings, ProfileSettings):
        raise TypeError(f"`settings` must be a ProfileSettings, got {type(settings).__name__}")
    return settings


@dataclass(frozen=True)
class Plan:
    """A checked profile run, ready to execute: nothing of it is written yet.

    Attributes
    ----------
    out : pathlib.Path
    settings : ProfileSettings
        Resolved for the models' vocabulary (:meth:`ProfileSettings.for_vocabulary`).
    items : list of (list of int, list of int or None)
        The prompts' token ids and references.
    manifest : dict
        The manifest to write (or the one found, for a resumed run).
    """

    out: Path
    settings: ProfileSettings
    items: list
    manifest: dict


def prepare(prompts, *, out, draft, target, settings: ProfileSettings, tokenizer=None,
            chat_template: bool = False) -> Plan:
    """Every check of :func:`profile`, in order, and the models' fingerprints; writes nothing.

    The two vocabularies, the settings at that vocabulary, the prompts (ids
    in range, text tokenised), the limits on memory
    (:func:`otspec.profile._settings.check_limits`), the output folder
    against the settings, prompts and model names, all before any model
    call; then one probe call per model (:func:`otspec.profile._store.fingerprint`)
    and the output folder against the fingerprints.
    """
    if draft is None or target is None:
        raise TypeError("`draft` and `target` are required (or `models`)")
    V = validate_language_model(target, "target")
    Vd = validate_language_model(draft, "draft")
    if Vd != V:
        raise ValueError(f"`draft` and `target` must share one vocabulary, got vocab_size {Vd} (draft) and {V} (target)")
    settings = settings.for_vocabulary(V)
    items = load_prompts(prompts, V, tokenizer=tokenizer, context=settings.context, chat_template=chat_template)
    check_limits(settings, V, [len(p) for p, _ in items])
    check_device_memory(settings, V, [len(p) for p, _ in items], analysis_device(target))
    check_tree_context(settings.tree_plan, draft, target, max((len(p) for p, _ in items), default=0),
                       settings.max_new_tokens)
    out = out_path(out)
    ids = {"draft": _model_id(draft), "target": _model_id(target)}
    check_folder(out, {"format": FORMAT, "settings": settings_entry(settings), "prompts": prompts_entry(items),
                       "models": ids})
    models = {role: dict(ids[role], fingerprint=fingerprint(lm)) for role, lm in (("draft", draft), ("target", target))}
    manifest = manifest_for(settings, models, items, devices={"draft": draft.device, "target": target.device})
    check_folder(out, manifest)
    return Plan(out=out, settings=settings, items=items, manifest=manifest)


def check_before_loading(out, settings: ProfileSettings, *, items=None, models=None, V=None) -> None:
    """The checks of the output folder (and, with ``V``, of the limits) that need no loaded model.

    Compares the run in ``out``, if any, with the settings (resolved at ``V``, or at the vocabulary the
    folder's run records), the prompts' digest (``items``: token ids, when no prompt is text) and
    ``models`` (a partial ``{"draft": {"name": ..., "class": ...}, "target": {...}}``). Writes nothing.
    """
    out = out_path(out)
    entry: dict = {"format": FORMAT}
    if V is None and (out / MANIFEST).is_file():
        try:
            V = int(json.loads((out / MANIFEST).read_text())["models"]["target"]["vocab_size"])
        except (ValueError, KeyError, TypeError):
            V = None  # unreadable: check_folder says so
    if V is not None:
        resolved = settings.for_vocabulary(V)
        entry["settings"] = settings_entry(resolved)
        if items is not None:
            check_limits(resolved, V, [len(p) for p, _ in items])
    if items is not None:
        entry["prompts"] = prompts_entry(items)
    if models is not None:
        entry["models"] = models
    check_folder(out, entry)


def execute(plan: Plan, draft, target, *, progress: bool | None = None, client=None, models=None) -> tuple[int, int]:
    """Write the manifest (a new run) and every missing shard of ``plan``; returns (written, skipped) shards."""
    out, settings, items, manifest = plan.out, plan.settings, plan.items, plan.manifest
    write_manifest(out, manifest)
    size = settings.shard_size
    todo = [s for s in range(manifest["shards"]) if not shard_path(out, s).is_file()]
    skipped = manifest["shards"] - len(todo)
    if client is not None:
        run_on_client(client, models, items, settings, todo, out)
    else:
        from tqdm.auto import tqdm

        T = settings.max_new_tokens
        per_prompt = (T + settings.stride - 1) // settings.stride
        total = sum(len(items[s * size:(s + 1) * size]) for s in todo) * per_prompt
        with tqdm(total=total, disable=(None if progress is None else not progress), unit="tok",
                  desc="profile", leave=False, dynamic_ncols=True) as bar:
            for s in todo:
                cols = run_shard(draft, target, items[s * size:(s + 1) * size], settings, s * size, bar=bar)
                write_shard(out, s, cols)
    return len(todo), skipped


def subsample_positions(settings: ProfileSettings, items: list) -> list[tuple[int, int]]:
    """The positions where the costly quantities run: ``(prompt index, path position)`` pairs, in order.

    Profiled position ``u`` (path position ``u * stride``) of prompt ``i`` is taken when ``u + i`` is a multiple
    of ``subsample`` (:func:`otspec.profile._collect.is_subsampled`); none with ``subsample = 0``.
    """
    every = settings.subsample
    if not every:
        return []
    out = []
    for i, (_, ref) in enumerate(items):
        P = -(-path_length(ref if settings.context == "reference" else None, settings) // settings.stride)
        out.extend((i, u * settings.stride) for u in range((-i) % every, P, every))
    return out


def subsample_text(settings: ProfileSettings, items: list, *, listed: int = 4) -> str:
    """What the subsample took, in words: the positions themselves when there are at most ``listed``, else how
    many of how many prompts' paths, and the rule.

    Examples
    --------
    >>> from otspec.profile import ProfileSettings
    >>> from otspec.profile._run import subsample_text
    >>> s = ProfileSettings(max_new_tokens=8, subsample=32)
    >>> print(subsample_text(s, [([1, 2], None)] * 3))  # doctest: +NORMALIZE_WHITESPACE
    position 0 of prompt 0 only (1 of 24 profiled positions; --subsample 32 takes profiled position u of prompt i
    when u + i is a multiple of 32)
    """
    taken = subsample_positions(settings, items)
    profiled = sum(-(-path_length(ref if settings.context == "reference" else None, settings) // settings.stride)
                   for _, ref in items)
    rule = (f"--subsample {settings.subsample} takes profiled position u of prompt i when u + i is a multiple of "
            f"{settings.subsample}")
    if not taken:
        return f"no position ({rule})"
    if len(taken) == profiled:
        return f"every profiled position ({profiled} of {profiled}; --subsample {settings.subsample})"
    count = f"{len(taken)} of {profiled} profiled positions"
    if len(taken) <= listed:
        where = ", ".join(f"position {t} of prompt {i}" for i, t in taken)
        return f"{where} only ({count}; {rule})"
    prompts = len({i for i, _ in taken})
    return f"{count}, on {prompts} of {len(items)} prompts ({rule})"
