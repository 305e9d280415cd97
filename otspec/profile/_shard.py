"""One shard of a profile: its prompts walked one by one, or batched (left-padded, or by length buckets).

Used in process by :func:`otspec.profile.profile` and on dask workers by
``_distributed`` (a module of its own so that neither imports the other).
"""

from __future__ import annotations

from ..decoding._models import supports_padding
from ._collect import COLUMNS, cost_rows, path_length, profile_bucket, profile_prompt
from ._renewal_hook import emission_rows
from ._settings import ProfileSettings
from ._summary import calibration_predictions

__all__ = ["buckets", "run_shard"]


def _merge(cols_list) -> dict:
    out = {c: [] for c in COLUMNS}
    for cols in filter(None, cols_list):
        for c in COLUMNS:
            out[c].extend(cols[c])
    return out


def buckets(items, settings: ProfileSettings, *, pad: bool = True) -> list[list[int]]:
    """Positions in ``items`` of the batches of one shard: prompts of equal path length (and, with
    ``pad=False``, equal token length: models that cannot left-pad), in order of first appearance, cut
    into groups of at most ``batch_size``."""
    groups: dict = {}
    for i, (prompt, ref) in enumerate(items):
        key = (0 if pad else len(prompt), path_length(ref if settings.context == "reference" else None, settings))
        groups.setdefault(key, []).append(i)
    size = settings.batch_size
    return [g[a:a + size] for g in groups.values() for a in range(0, len(g), size)]


def run_shard(draft, target, items, settings: ProfileSettings, start: int, bar=None) -> dict:
    """The rows of prompts ``start, start + 1, ...`` (``items`` their (ids, reference) pairs), in prompt order;
    with ``settings.batch_size > 1`` the shard's prompts run batched (:func:`profile_bucket`), left-padded when
    both models take ``new_state(pad=...)``, else by length buckets."""
    hook = emission_rows
    refs = [ref if settings.context == "reference" else None for _, ref in items]
    if settings.batch_size == 1:
        cols = [None] + [profile_prompt(draft, target, prompt, refs[i], settings, start + i, bar=bar, renewal=hook)
                         for i, (prompt, _) in enumerate(items)]
    else:
        cols = [None] * (1 + len(items))
        for batch in buckets(items, settings, pad=supports_padding(draft) and supports_padding(target)):
            got = profile_bucket(draft, target, [items[i][0] for i in batch], [refs[i] for i in batch], settings,
                                 [start + i for i in batch], bar=bar, renewal=hook)
            for i, c in zip(batch, got):
                cols[1 + i] = c
    if items and start == 0:  # the run's first shard calibrates the costs once per run, sized by its walk's rows
        cols[0] = cost_rows(draft, target, items[0][0], settings, start, walked=_merge(cols[1:]),
                            predict=calibration_predictions)
    return _merge(cols)
