r"""Shards of a profile on a dask.distributed cluster, with the models held by each worker, one device per worker.

Each task is one shard (``shard_size`` prompts). A worker builds the models
once from the picklable ``models()`` factory and keeps them for every later
task (the worker-held-model pattern of batch inference), computes the
shard's rows and returns them; the client writes every shard atomically, so
the workers need no shared file system. Prompts carry their own seeds
(their index), so the tables equal the in-process run's whatever the number
of workers or the order of completion.

One worker per GPU: when the factory takes a ``device`` keyword, each
worker calls ``models(device=...)`` with a device of its own
(:func:`worker_devices`): the ``r``-th worker of a host (workers ordered by
address) gets ``cuda:{r mod n}``, ``n`` the GPUs it sees, and ``"cpu"`` where
it sees none -- so a cluster started with one worker per GPU of each host
(``dask worker --nworkers N``, or dask-cuda's ``LocalCUDACluster``, whose
workers each see one GPU as ``cuda:0``) loads each pair once onto its own
GPU, and the shards spread over the GPUs. Optional:
``pip install 'otspec-verifiers[distributed]'``.
"""

from __future__ import annotations

import inspect
import pickle

from .._deps import install_hint
from ._shard import run_shard
from ._store import write_shard

__all__ = ["run_on_client", "worker_devices", "takes_device"]

#: Models built on this worker process: ``(pickled factory, device, worker address) -> (draft, target)``.
_HELD: dict = {}


def takes_device(models) -> bool:
    """Whether the factory ``models`` takes a ``device`` keyword (then each worker passes its own)."""
    try:
        params = inspect.signature(models).parameters
    except (TypeError, ValueError):  # builtins and C callables without a signature
        return False
    return "device" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def worker_devices(workers) -> dict:
    """The device of every worker: one GPU per worker of each host, ``"cpu"`` on a host without GPU.

    Parameters
    ----------
    workers : iterable of (str, str, int)
        ``(address, host, gpus)`` of every worker: its address, its host, and the number of CUDA devices it sees.

    Returns
    -------
    dict
        ``address -> device``: the ``r``-th worker of a host, in address order, gets ``cuda:{r mod gpus}``
        (``cuda:0`` for every worker of a dask-cuda cluster, each seeing one GPU), ``"cpu"`` when ``gpus == 0``.

    Examples
    --------
    >>> from otspec.profile._distributed import worker_devices
    >>> worker_devices([("tcp://a:2", "a", 2), ("tcp://a:1", "a", 2), ("tcp://b:1", "b", 0)])
    {'tcp://a:1': 'cuda:0', 'tcp://a:2': 'cuda:1', 'tcp://b:1': 'cpu'}
    """
    by_host: dict = {}
    for address, host, gpus in workers:
        by_host.setdefault(host, []).append((str(address), int(gpus)))
    out = {}
    for host in sorted(by_host):
        for r, (address, gpus) in enumerate(sorted(by_host[host])):
            out[address] = f"cuda:{r % gpus}" if gpus > 0 else "cpu"
    return out


def _gpus_seen() -> int:
    """The CUDA devices this worker process sees (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of the models
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _cluster_devices(client) -> dict:
    """:func:`worker_devices` of the client's workers, each asked how many GPUs it sees."""
    seen = client.run(_gpus_seen)
    try:
        info = client.scheduler_info(n_workers=-1)["workers"]  # every worker, not the first few
    except TypeError:  # pragma: no cover - older distributed lists them all
        info = client.scheduler_info()["workers"]
    return worker_devices((address, info.get(address, {}).get("host", address), gpus) for address, gpus in seen.items())


def _own_device() -> str:
    """The device of a worker that joined after the devices were assigned: its first GPU, or the CPU."""
    return "cuda:0" if _gpus_seen() else "cpu"


def _factory_key(models):
    """The factory's identity across tasks: its pickle (by reference for a module's function or a partial of one),
    else its cloudpickle (a function defined in a script or a notebook, as dask itself ships it)."""
    try:
        return pickle.dumps(models)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle

        return cloudpickle.dumps(models)


def _held_models(models, device=None):
    """The pair this worker built from ``models`` (on ``device`` when given), built on first use."""
    address = _worker_address()
    key = (_factory_key(models), device, address)
    pair = _HELD.get(key)
    if pair is None:
        pair = _HELD[key] = models() if device is None else models(device=device)
    return pair


def _worker_address():
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):  # outside a worker (a direct call)
        return None


def _shard_task(models, items, settings, start, devices=None):
    device = None if devices is None else devices.get(_worker_address()) or _own_device()
    draft, target = _held_models(models, device)
    return run_shard(draft, target, items, settings, start)


def run_on_client(client, models, items, settings, todo, out) -> None:
    """Submit one task per unfinished shard; write each shard as it completes. With a factory that takes
    ``device``, each worker builds the models on its own device (:func:`worker_devices`)."""
    try:
        from distributed import as_completed
    except ImportError as exc:  # pragma: no cover - the extra is missing

        raise ImportError(f"a profile over a cluster needs dask.distributed: {install_hint('distributed')}") from exc

    devices = _cluster_devices(client) if todo and takes_device(models) else None
    size = settings.shard_size
    futures = {}
    for s in todo:
        f = client.submit(_shard_task, models, items[s * size:(s + 1) * size], settings, s * size, devices,
                          pure=False)
        futures[f] = s
    for f in as_completed(list(futures)):
        write_shard(out, futures[f], f.result())
