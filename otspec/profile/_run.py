r"""``profile``: validate everything, then collect shard by shard (in process or on a dask cluster)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .._deps import check_installed
from ..decoding._models import validate_language_model
from ._distributed import run_on_client
from ._prompts import load_prompts
from ._settings import ProfileSettings
from ._shard import run_shard
from ._store import _model_id, check_or_write_manifest, manifest_for, shard_path, write_shard

__all__ = ["ProfileRun", "profile"]


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
            tokenizer=None, progress: bool | None = None, client=None, **options) -> ProfileRun:
    r"""Profile a draft/target pair on prompts: every verifier's exact values on the same draft trees, stored.

    .. math::

        \text{for each prompt } i,\ \text{each profiled } t:\quad
        a_j(k),\ E[\tau_L \mid X] \quad (k \le k_{\max},\ L \le L_{\max},\ \text{every verifier}).

    Everything is checked before any forward pass (settings, prompts, the
    two vocabularies, the output folder); then the prompts run shard by shard
    (``settings.shard_size`` prompts each), each shard written atomically to
    ``out/shard-NNNNN.parquet``; shards already there are skipped (a killed
    run resumes, losing at most the shard in progress).

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
        For text prompts.
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
        ``L_max`` < 1), a bad prompt (a JSONL line is named), different
        vocabularies, an output folder holding a run with other settings --
        all before any forward pass and before anything is written.
    TypeError
        Wrong types; ``client`` without ``models``.

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
    check_installed("pyarrow", "a profile's Parquet shards", "profile")
    t0 = time.perf_counter()
    if settings is None:
        settings = ProfileSettings(**options)
    elif options:
        raise TypeError(f"pass either `settings` or its fields as keywords, not both (got {sorted(options)})")
    elif not isinstance(settings, ProfileSettings):
        raise TypeError(f"`settings` must be a ProfileSettings, got {type(settings).__name__}")
    if client is not None and models is None:
        raise TypeError("`client` needs `models`: a picklable models() -> (draft, target) each worker calls once")
    if models is not None:
        if draft is not None or target is not None:
            raise TypeError("pass either `models` or `draft` and `target`, not both")
        if not callable(models):
            raise TypeError(f"`models` must be callable () -> (draft, target), got {type(models).__name__}")
        draft, target = models()
    if draft is None or target is None:
        raise TypeError("`draft` and `target` are required (or `models`)")
    V = validate_language_model(target, "target")
    Vd = validate_language_model(draft, "draft")
    if Vd != V:
        raise ValueError(f"`draft` and `target` must share one vocabulary, got vocab_size {Vd} (draft) and {V} (target)")
    settings = settings.for_vocabulary(V)
    items = load_prompts(prompts, V, tokenizer=tokenizer, context=settings.context)
    out = Path(out)
    manifest = manifest_for(settings, {"draft": _model_id(draft), "target": _model_id(target)}, items)
    check_or_write_manifest(out, manifest)
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
    return ProfileRun(out=out, settings=settings, prompts=len(items), shards_written=len(todo),
                      shards_skipped=skipped, wall_time=time.perf_counter() - t0)
