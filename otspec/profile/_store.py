r"""One run = one folder: a JSON manifest beside Parquet shards, every file written atomically.

The layout of Hugging Face ``datasets``' cache and of Ray Data's file
writers: ``manifest.json`` (settings, models, prompts' digest, package
versions, per-prompt seeds) and ``shard-00000.parquet``, ... (one per
``shard_size`` prompts). A shard is written to a temporary name in the same
folder and renamed, so a killed run leaves whole shards only and a rerun
skips them; a folder whose manifest differs is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

from ._collect import COLUMNS, TIMING_KINDS

__all__ = ["MANIFEST", "write_atomic", "manifest_for", "check_or_write_manifest", "shard_path", "write_shard",
           "read_table", "iter_shards", "read_manifest"]

MANIFEST = "manifest.json"
#: Manifest entries that must agree for a folder to be reused (package versions are recorded, not compared).
_IDENTITY = ("format", "settings", "models", "prompts")
#: Settings of how a run executes, not of what it computes: left out of the manifest (a run may resume with others).
EXECUTION = ("batch_size",)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _versions() -> dict:
    out = {}
    for pkg in ("otspec", "numpy", "torch", "transformers", "pyarrow"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _model_id(lm) -> dict:
    d = {"name": str(getattr(lm, "name", type(lm).__name__)), "class": type(lm).__name__,
         "vocab_size": int(lm.vocab_size)}
    model = getattr(lm, "model", None)
    if model is not None and hasattr(model, "parameters"):
        d["parameters"] = int(sum(int(p.numel()) for p in model.parameters()))
    return d


def prompt_seeds(seed: int, n: int) -> list[int]:
    """The first 64 bits of each prompt's ``SeedSequence(seed).spawn(n)`` child (recorded, for reference)."""
    return [int(c.generate_state(1, np.uint64)[0]) for c in np.random.SeedSequence(seed).spawn(n)]


def manifest_for(settings, models: dict, prompts: list) -> dict:
    """The manifest of a run (its identity entries and its provenance)."""
    h = hashlib.sha256()
    for prompt, ref in prompts:
        h.update(json.dumps([prompt, ref]).encode())
    n = len(prompts)
    size = settings.shard_size
    return {
        "format": 1,
        "settings": {k: v for k, v in settings.to_dict().items() if k not in EXECUTION},
        "models": models,
        "prompts": {"count": n, "sha256": h.hexdigest()},
        "shards": (n + size - 1) // size,
        "seeds": {"root": settings.seed, "rule": "numpy.random.SeedSequence(root).spawn(count)[i] for prompt i",
                  "per_prompt": prompt_seeds(settings.seed, n)},
        "packages": _versions(),
    }


def read_manifest(out) -> dict:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise ValueError(f"`out` {str(out)!r} holds no profile run ({MANIFEST} missing)")
    return json.loads(path.read_text())


def check_or_write_manifest(out: Path, manifest: dict) -> None:
    """Refuse a folder holding another run (never mix runs); write the manifest of a new one."""
    out = Path(out)
    path = out / MANIFEST
    if path.is_file():
        old = json.loads(path.read_text())
        diff = [k for k in _IDENTITY if old.get(k) != manifest.get(k)]
        if diff:
            details = []
            for k in diff:
                a, b = old.get(k), manifest.get(k)
                if isinstance(a, dict) and isinstance(b, dict):
                    keys = sorted(x for x in set(a) | set(b) if a.get(x) != b.get(x))
                    details.append(f"{k} ({', '.join(f'{x}: {a.get(x)!r} there, {b.get(x)!r} here' for x in keys)})")
                else:
                    details.append(k)
            raise ValueError(f"`out` {str(out)!r} holds a run with other {'; '.join(details)}: "
                             "use another folder (runs are never mixed)")
        return
    if out.exists() and not out.is_dir():
        raise ValueError(f"`out` must be a folder, got the file {str(out)!r}")
    if out.is_dir() and any(p.name.startswith("shard-") for p in out.iterdir()):
        raise ValueError(f"`out` {str(out)!r} holds shards without a manifest: use another folder")
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


def shard_path(out: Path, s: int) -> Path:
    return Path(out) / f"shard-{s:05d}.parquet"


def _schema():
    import pyarrow as pa

    return pa.schema([("prompt", pa.int32()), ("pos", pa.int32()), ("kind", pa.string()), ("name", pa.string()),
                      ("k", pa.int16()), ("j", pa.int16()), ("m", pa.int16()), ("value", pa.float64())])


def write_shard(out: Path, s: int, cols: dict) -> None:
    """Write the columns of one shard atomically (Parquet, zstd)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({c: cols[c] for c in COLUMNS}, schema=_schema())
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    write_atomic(shard_path(out, s), sink.getvalue().to_pybytes())


def iter_shards(out):
    """The shards of a run, in order, one table at a time (bounded memory)."""
    import pyarrow.parquet as pq

    for path in sorted(Path(out).glob("shard-*.parquet")):
        yield pq.read_table(path)


def read_table(out, *, timing: bool = False):
    """All rows of a run as one ``pyarrow.Table`` (``timing=False`` drops the wall-time rows: the timers and the
    cost calibration, :data:`otspec.profile._collect.TIMING_KINDS`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tables = []
    for t in iter_shards(out):
        if not timing:
            t = t.filter(pc.invert(pc.is_in(t["kind"], value_set=pa.array(TIMING_KINDS))))
        tables.append(t)
    return pa.concat_tables(tables) if tables else _schema().empty_table()
