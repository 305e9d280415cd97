r"""Shards of a profile on a dask.distributed cluster, with the models held by each worker.

Each task is one shard (``shard_size`` prompts). A worker builds the models
once from the picklable ``models()`` factory and keeps them for every later
task (the worker-held-model pattern of batch inference), computes the
shard's rows and returns them; the client writes every shard atomically, so
the workers need no shared file system. Prompts carry their own seeds
(their index), so the tables equal the in-process run's whatever the number
of workers or the order of completion. Optional: ``pip install 'otspec-verifiers[distributed]'``.
"""

from __future__ import annotations

import pickle

from .._deps import install_hint
from ._shard import run_shard
from ._store import write_shard

__all__ = ["run_on_client"]

#: Models built on this worker process, by the pickled factory.
_HELD: dict = {}


def _held_models(models):
    key = pickle.dumps(models)
    pair = _HELD.get(key)
    if pair is None:
        pair = _HELD[key] = models()
    return pair


def _shard_task(models, items, settings, start):
    draft, target = _held_models(models)
    return run_shard(draft, target, items, settings, start)


def run_on_client(client, models, items, settings, todo, out) -> None:
    """Submit one task per unfinished shard; write each shard as it completes."""
    try:
        from distributed import as_completed
    except ImportError as exc:  # pragma: no cover - the extra is missing

        raise ImportError(f"a profile over a cluster needs dask.distributed: {install_hint('distributed')}") from exc

    size = settings.shard_size
    futures = {}
    for s in todo:
        f = client.submit(_shard_task, models, items[s * size:(s + 1) * size], settings, s * size, pure=False)
        futures[f] = s
    for f in as_completed(list(futures)):
        write_shard(out, futures[f], f.result())
