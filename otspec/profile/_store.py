r"""One run = one folder: a JSON manifest beside Parquet shards, every file written atomically.

The layout of Hugging Face ``datasets``' cache and of Ray Data's file
writers: ``manifest.json`` (settings, models, prompts' digest, package
versions, per-prompt seeds) and ``shard-00000.parquet``, ... (one per
``shard_size`` prompts). A shard is written to a temporary name in the same
folder and renamed, so a killed run leaves whole shards only and a rerun
skips them; a folder whose manifest differs is refused, and nothing is written
before every check has passed. Each model is identified by a fingerprint: its
next-token laws on a fixed probe context, rounded and hashed (and, for models
up to :data:`MAX_WEIGHT_HASH_BYTES`, a hash of its weights), so a run never
resumes with another model under the same name.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import warnings
import weakref
from importlib import metadata
from pathlib import Path

import numpy as np

from .. import __version__
from ._collect import COLUMNS, TIMING_KINDS, path_length

__all__ = ["MANIFEST", "FORMAT", "write_atomic", "check_report_dest", "manifest_for", "check_folder", "write_manifest",
           "shard_path",
           "write_shard", "read_table", "iter_shards", "read_manifest", "fingerprint", "probe_ids", "prompts_entry",
           "settings_entry", "position_counts", "machine_entry", "PROBE_LENGTH", "FINGERPRINT_DIGITS", "FINGERPRINT_RTOL",
           "MAX_WEIGHT_HASH_BYTES", "ABSENT_BEFORE", "OldManifestWarning", "manifest_note"]

MANIFEST = "manifest.json"
#: Version of the manifest's layout (2: models carry a fingerprint; runs of another format are not resumed).
FORMAT = 2
#: Length of the fixed probe context of a model's fingerprint (token ids ``(7919 i + 1) mod V``).
PROBE_LENGTH = 8
#: Significant digits of the probe's next-token laws hashed into a fingerprint.
FINGERPRINT_DIGITS = 6
#: Relative tolerance on the probe's largest probabilities when two fingerprints' hashes differ: the same
#: model computed on another device or with other kernels differs by float32 rounding, which can move a
#: rounded digit; another model differs far more.
FINGERPRINT_RTOL = 1e-3
#: Number of largest probabilities (at the probe's last position) kept for that comparison.
FINGERPRINT_TOP = 8
#: Largest model (bytes of its state dict, shared tensors once) whose weights are hashed into its fingerprint:
#: SmolLM2-135M's 538 MB take 0.6 to 0.75 s on one CPU core (sha256 at about 700 MB/s on the shared 2-core test
#: machine; its 24-layer draft less); a larger model is identified by its laws alone.
MAX_WEIGHT_HASH_BYTES = 2**30
#: Manifest entries that must agree for a folder to be reused (package versions are recorded, not compared).
_IDENTITY = ("format", "settings", "models", "prompts")
#: Settings of how a run executes, not of what it computes: left out of the manifest (a run may resume with others).
EXECUTION = ("batch_size", "calibration_s")


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


#: The distribution that installs ``otspec`` (``pip install otspec-verifiers``).
DISTRIBUTION = "otspec-verifiers"


def _versions() -> dict:
    """Versions of otspec (its distribution's, else the imported package's ``__version__``) and of the packages
    behind the numbers (None: not installed)."""
    out = {}
    for pkg in ("otspec", "numpy", "torch", "transformers", "pyarrow"):
        try:
            out[pkg] = metadata.version(DISTRIBUTION if pkg == "otspec" else pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    if out["otspec"] is None:
        out["otspec"] = __version__
    return out


def machine_entry(devices: dict | None = None) -> dict:
    """Where and under what load a run's costs were timed: the models' devices, torch's threads, the load average.

    Returns
    -------
    dict
        ``devices`` (``{"draft": "cpu", "target": "cuda:0"}``, or None when not given), ``device_name`` (the
        accelerator's name where a CUDA device is used, else the processor), ``torch_threads``
        (``torch.get_num_threads()``, None without torch), ``cpu_count``, ``load_average`` (1, 5 and 15
        minutes, ``os.getloadavg()``; None where the system has none) and ``platform``.
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - the profile needs torch
        torch = None
    devs = {role: str(d) for role, d in devices.items()} if devices else None
    name = platform.processor() or platform.machine()
    if torch is not None and devs and any(d.startswith("cuda") for d in devs.values()):
        cuda = next(d for d in devs.values() if d.startswith("cuda"))
        try:
            name = torch.cuda.get_device_name(torch.device(cuda))
        except (RuntimeError, AssertionError):  # pragma: no cover - no driver
            pass
    try:
        load = [round(float(x), 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # pragma: no cover - Windows
        load = None
    return {"devices": devs, "device_name": name, "torch_threads": torch.get_num_threads() if torch else None,
            "cpu_count": os.cpu_count(), "load_average": load, "platform": platform.platform()}


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


def probe_ids(V: int) -> list[int]:
    """The fixed probe context of a fingerprint at vocabulary ``V``: ``(7919 i + 1) mod V``, ``i < PROBE_LENGTH``."""
    return [(7919 * i + 1) % int(V) for i in range(PROBE_LENGTH)]


def _law_digest(laws: np.ndarray) -> str:
    """sha256 of laws rounded to :data:`FINGERPRINT_DIGITS` significant digits (as integer mantissas and
    decimal exponents, so no float is formatted); values below 1e-290 count as 0, non-finite ones alike."""
    x = np.asarray(laws, dtype=np.float64)
    flat = x.ravel()
    D = FINGERPRINT_DIGITS
    keep = np.isfinite(flat) & (flat > 1e-290)
    e = np.zeros(flat.shape, dtype=np.int64)
    m = np.zeros(flat.shape, dtype=np.int64)
    e[keep] = np.floor(np.log10(flat[keep])).astype(np.int64)
    m[keep] = np.rint(flat[keep] / 10.0 ** (e[keep] - (D - 1))).astype(np.int64)
    carry = m >= 10**D  # 9.999995e-3 rounds to 1.00000e-2
    m[carry] //= 10
    e[carry] += 1
    m[~np.isfinite(flat)] = -1
    h = hashlib.sha256(str(x.shape).encode())
    h.update(m.tobytes())
    h.update(e.tobytes())
    return h.hexdigest()


#: Weights digests already computed in this process: ``id(module) -> (state key, weak reference, digest)``, the
#: state key naming
#: every tensor's storage, shape, dtype and version counter (an in-place write bumps it), so a digest is computed
#: once per run and per process, not once per ``profile`` call on the same loaded models.
_WEIGHTS_DIGESTS: dict = {}


def _weights_state(sd) -> tuple:
    """What identifies a state dict's current contents without reading them: names, storages, shapes, dtypes, devices
    and version counters (bumped by every in-place write through autograd's view of the tensor)."""
    return tuple((name, t.data_ptr(), tuple(t.shape), str(t.dtype), str(t.device), int(t._version))
                 for name, t in sd.items())


def _weights_digest(lm) -> str | None:
    """sha256 of a torch model's state dict (names, shapes, dtypes, bytes; a tensor shared by two names, as tied
    embeddings, hashed once), or None: no torch module, or above :data:`MAX_WEIGHT_HASH_BYTES`.

    Computed once per loaded model and process (:data:`_WEIGHTS_DIGESTS`): a later call on the same module with
    unchanged tensors (same storages, shapes, dtypes, devices and version counters) returns the digest already
    computed. A write that bypasses the version counter (``param.data[...] = ...``) is not seen by that key; the
    fingerprint's probe laws, recomputed at every call, still tell such a model apart."""
    model = getattr(lm, "model", None)
    if model is None or not callable(getattr(model, "state_dict", None)):
        return None
    sd = model.state_dict()
    state = _weights_state(sd)
    held = _WEIGHTS_DIGESTS.get(id(model))
    if held is not None and held[0] == state and held[1]() is model:
        return held[2]
    digest = _hash_state_dict(sd)
    try:
        ref = weakref.ref(model)
    except TypeError:  # pragma: no cover - torch modules take weak references
        return digest
    for key in [k for k, held in _WEIGHTS_DIGESTS.items() if held[1]() is None]:  # models since freed
        del _WEIGHTS_DIGESTS[key]
    _WEIGHTS_DIGESTS[id(model)] = (state, ref, digest)
    return digest


def _hash_state_dict(sd) -> str | None:
    import torch

    seen: dict = {}
    todo = []
    for name, t in sd.items():
        key = (t.data_ptr(), t.numel(), str(t.dtype), tuple(t.shape))
        todo.append((name, t, seen.get(key)))
        seen.setdefault(key, name)
    if sum(t.numel() * t.element_size() for _, t, same in todo if same is None) > MAX_WEIGHT_HASH_BYTES:
        return None
    h = hashlib.sha256()
    for name, t, same in todo:
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{same or ''};".encode())
        if same is None:  # the buffer itself, no copy when already on the CPU
            h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def fingerprint(lm) -> dict:
    r"""A model's fingerprint: its next-token laws on a fixed probe context, rounded and hashed.

    .. math::

        \mathrm{sha256}\big(\mathrm{round}_6\, \mathrm{softmax}(\ell(x_{1..t}))_{t = 1..8}\big),
        \qquad x_i = (7919\, i + 1) \bmod V,

    from one unbatched call on a fresh state (float64 softmax of the logits
    at temperature 1, rounded to :data:`FINGERPRINT_DIGITS` significant
    digits), plus the probe's last position's :data:`FINGERPRINT_TOP`
    largest probabilities, and for a torch model up to
    :data:`MAX_WEIGHT_HASH_BYTES` the sha256 of its weights.

    Returns
    -------
    dict
        ``probe``, ``laws_sha256``, ``top_ids``, ``top_probs``,
        ``weights_sha256`` (None when not hashed).

    Examples
    --------
    >>> from otspec.profile import toy_pair
    >>> from otspec.profile._store import fingerprint
    >>> draft, target = toy_pair(4, seed=0)
    >>> fingerprint(target)["laws_sha256"] == fingerprint(toy_pair(4, seed=0)[1])["laws_sha256"]
    True
    >>> fingerprint(target)["laws_sha256"] == fingerprint(toy_pair(4, seed=1)[1])["laws_sha256"]
    False
    """
    import torch

    ids = probe_ids(lm.vocab_size)
    with torch.no_grad():
        logits = lm.logits(lm.new_state(), torch.as_tensor([ids], dtype=torch.long).to(lm.device))
    laws = torch.softmax(torch.as_tensor(logits)[0].detach().to("cpu", torch.float64), dim=-1).numpy()
    last = laws[-1]
    top = np.argsort(-last, kind="stable")[:FINGERPRINT_TOP]
    return {"probe": ids, "laws_sha256": _law_digest(laws), "top_ids": [int(i) for i in top],
            "top_probs": [float(f"{float(v):.{FINGERPRINT_DIGITS}g}") for v in last[top]],
            "weights_sha256": _weights_digest(lm)}


def _same_fingerprint(a, b) -> bool:
    """Whether two fingerprints are of one model: equal weights where both were hashed, and equal law hashes
    or (other rounding) the same largest probabilities to :data:`FINGERPRINT_RTOL`."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a == b
    wa, wb = a.get("weights_sha256"), b.get("weights_sha256")
    if wa and wb and wa != wb:
        return False
    if a.get("laws_sha256") == b.get("laws_sha256"):
        return True
    pa, pb = dict(zip(a.get("top_ids", []), a.get("top_probs", []))), dict(zip(b.get("top_ids", []),
                                                                           b.get("top_probs", [])))
    return (a.get("probe") == b.get("probe") and bool(pa) and set(pa) == set(pb)
            and all(abs(pa[i] - pb[i]) <= FINGERPRINT_RTOL * max(abs(pa[i]), abs(pb[i])) for i in pa))


def settings_entry(settings) -> dict:
    """The manifest's ``settings``: every field but those of how the run executes (:data:`EXECUTION`)."""
    return {k: v for k, v in settings.to_dict().items() if k not in EXECUTION}


def prompts_entry(prompts: list) -> dict:
    """The manifest's ``prompts``: their count and the sha256 of their token ids (and references)."""
    h = hashlib.sha256()
    for prompt, ref in prompts:
        h.update(json.dumps([prompt, ref]).encode())
    return {"count": len(prompts), "sha256": h.hexdigest()}


def position_counts(settings, prompts: list) -> tuple[int, int]:
    """Profiled positions of a run, and those of them where the costly quantities run (the subsample)."""
    profiled = sub = 0
    every = settings.subsample
    for i, (_, ref) in enumerate(prompts):
        P = -(-path_length(ref if settings.context == "reference" else None, settings) // settings.stride)
        profiled += P
        if every:
            r = (-i) % every  # position u (the u-th profiled one) is subsampled when (u + i) % every == 0
            sub += 0 if r >= P else (P - 1 - r) // every + 1
    return profiled, sub


def manifest_for(settings, models: dict, prompts: list, *, devices: dict | None = None) -> dict:
    """The manifest of a run: its identity entries (``format``, ``settings``, ``models``, ``prompts``) and its
    provenance (``shards``, ``seeds``, ``packages`` with otspec's own version, ``machine``: the models'
    ``devices``, torch's threads and the load average when the run started (:func:`machine_entry`), and what
    was left out and where each quantity runs: ``skipped``, ``positions``). Provenance is recorded, never
    compared: a run may resume on another machine."""
    n = len(prompts)
    size = settings.shard_size
    profiled, sub = position_counts(settings, prompts)
    return {
        "format": FORMAT,
        "settings": settings_entry(settings),
        "models": models,
        "prompts": prompts_entry(prompts),
        "shards": (n + size - 1) // size,
        "seeds": {"root": settings.seed, "rule": "numpy.random.SeedSequence(root).spawn(count)[i] for prompt i",
                  "per_prompt": prompt_seeds(settings.seed, n)},
        "packages": _versions(),
        "machine": machine_entry(devices),
        "skipped": settings.skipped,
        "positions": dict(settings.positions(), profiled=profiled, subsampled=sub),
    }


#: What each older manifest format lacks, by format: a run of such a format is summarised (its settings, models'
#: names and shards are all a summary reads) with :class:`OldManifestWarning` saying so, never resumed.
ABSENT_BEFORE = {1: (("models' fingerprints", "it cannot be resumed: a rerun could not tell its models from others "
                      "of the same names"),
                     ("skipped", "the configurations the settings left out are not listed in its summary and "
                      "report"),
                     ("positions", "the settings' position rules and counts are not recorded; the summary counts "
                      "the positions from the shards, as for any run"))}


class OldManifestWarning(UserWarning):
    """A run's manifest is of an older format (:data:`ABSENT_BEFORE`): summarised, with entries absent."""


def manifest_note(man: dict) -> str | None:
    """What a manifest of an older format lacks and what that means for its summary, as one sentence; None for a
    manifest of the current :data:`FORMAT` (or one without a ``format`` entry: partial manifests of tests)."""
    fmt = man.get("format") if isinstance(man, dict) else None
    if fmt not in ABSENT_BEFORE:
        return None
    models = man.get("models")
    fingerprinted = (isinstance(models, dict) and bool(models) and
                     all(isinstance(m, dict) and "fingerprint" in m for m in models.values()))
    absent = [(what, why) for what, why in ABSENT_BEFORE[fmt]
              if not (fingerprinted if what == "models' fingerprints" else what in man)]
    if not absent:
        return None
    return (f"a run of manifest format {fmt} (this otspec writes format {FORMAT}): it has no "
            + "; no ".join(f"{what} ({why})" for what, why in absent)
            + ". Its estimates are read from its shards as for any run; profile it again into a new folder to "
              "record the missing entries")


def read_manifest(out) -> dict:
    """The manifest of the run in ``out``; a ValueError naming the file when it is missing, unreadable, of a format
    this otspec cannot read (newer than :data:`FORMAT`, or not an integer), or lacks the entries a summary reads
    (``settings``, ``models``, ``shards``). A manifest of an older format (:data:`ABSENT_BEFORE`) is read, with an
    :class:`OldManifestWarning` naming the file and what it lacks (:func:`manifest_note`)."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise ValueError(f"`out` {str(out)!r} holds no profile run ({MANIFEST} missing)")
    try:
        man = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{str(path)!r} cannot be read as a profile manifest ({exc})") from None
    missing = [k for k in ("settings", "models", "shards") if not isinstance(man, dict) or k not in man]
    if missing:
        raise ValueError(f"{str(path)!r} is not a profile manifest: it has no {', '.join(missing)} "
                         f"(format {FORMAT} holds them)")
    fmt = man.get("format", FORMAT)
    if isinstance(fmt, bool) or not isinstance(fmt, int) or not (1 <= fmt <= FORMAT):
        raise ValueError(f"{str(path)!r} is a profile manifest of format {fmt!r}, which this otspec "
                         f"({__version__}) cannot read: it reads formats 1 to {FORMAT}; "
                         + ("summarise it with the newer otspec that wrote it" if isinstance(fmt, int) and
                            not isinstance(fmt, bool) and fmt > FORMAT else "the file is damaged: profile again"))
    note = manifest_note(man)
    if note is not None:
        warnings.warn(f"{str(path)!r} is {note}", OldManifestWarning, stacklevel=2)
    return man


def _differences(old: dict, new: dict) -> list[str]:
    """The identity entries of ``new`` (those it has: a partial manifest is compared on what it holds) that
    differ in ``old``, described."""
    details = []
    for k in _IDENTITY:
        if k not in new or old.get(k) == new[k]:
            continue
        a, b = old.get(k), new[k]
        if k == "models" and isinstance(a, dict) and isinstance(b, dict):
            parts = []
            for role, m in b.items():
                o = a.get(role) if isinstance(a.get(role), dict) else {}
                for key, val in m.items():
                    if key == "fingerprint":
                        if not _same_fingerprint(o.get(key), val):
                            was = (o.get(key) or {}).get("laws_sha256") if isinstance(o.get(key), dict) else None
                            parts.append(f"{role} fingerprint: {str(was)[:12]} there, {val['laws_sha256'][:12]} "
                                         f"here: another {role} model, though named {m.get('name', o.get('name'))!r}")
                    elif o.get(key) != val:
                        parts.append(f"{role} {key}: {o.get(key)!r} there, {val!r} here")
            if parts:
                details.append(f"models ({'; '.join(parts)})")
        elif isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(x for x in set(a) | set(b) if a.get(x) != b.get(x))
            details.append(f"{k} ({', '.join(f'{x}: {a.get(x)!r} there, {b.get(x)!r} here' for x in keys)})")
        else:
            details.append(f"{k} ({a!r} there, {b!r} here)")
    return details


def check_folder(out, manifest: dict) -> None:
    """Refuse ``out`` when it cannot hold this run: a file, shards without a manifest, or a run whose identity
    entries differ from ``manifest``'s (only those ``manifest`` holds, so a command line can compare the
    settings, the prompts and the models' names before loading them), an empty name (``Path("")`` is the working
    folder) or a folder that cannot be created or written (:func:`_check_writable`). Writes nothing."""
    out = out_path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"`out` must be a folder, got the file {str(out)!r}")
    _check_writable(out)
    path = out / MANIFEST
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"`out` {str(out)!r} holds an unreadable {MANIFEST} ({exc}): use another folder") from None
        diff = _differences(old if isinstance(old, dict) else {}, manifest)
        if diff:
            raise ValueError(f"`out` {str(out)!r} holds a run with other {'; '.join(diff)}: "
                             "use another folder (runs are never mixed)")
    elif out.is_dir() and any(p.name.startswith("shard-") for p in out.iterdir()):
        raise ValueError(f"`out` {str(out)!r} holds shards without a manifest: use another folder")


def out_path(out) -> Path:
    """``out`` as a :class:`~pathlib.Path`, refusing what names no folder: another type, or an empty or blank name
    (``Path("")`` would be the working folder)."""
    if isinstance(out, Path):
        return out
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"`out` must be a folder path (str or os.PathLike), got {type(out).__name__}")
    if isinstance(out, str) and not out.strip():
        raise ValueError(f"`out` must name a folder, got {out!r}")
    return Path(out)


def _check_writable(out: Path) -> None:
    """Refuse ``out`` when it cannot be created or written: its nearest existing folder (``out`` itself, or the
    first ancestor that exists) must be a folder in which a folder can be made (tried with
    :func:`tempfile.mkdtemp` and removed at once, so that permissions, read-only mounts and pseudo file systems
    are all asked the same question ``mkdir`` will be)."""
    here = out.absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise ValueError(f"`out` {str(out)!r} cannot be created: {str(here)!r} is a file")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".otspec-probe-", dir=here))
    except OSError as exc:
        raise ValueError(f"`out` {str(out)!r} cannot be written: no folder can be made in {str(here)!r} "
                         f"({exc.strerror or exc})") from None


def write_manifest(out, manifest: dict) -> None:
    """Write the manifest of a new run (after :func:`check_folder` passed); a resumed run keeps its own."""
    out = Path(out)
    if (out / MANIFEST).is_file():
        return
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


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
    """The shards of a run, in order, one table at a time (bounded memory), each checked against the rows' schema.

    Raises
    ------
    ValueError
        A shard that cannot be read as Parquet, or whose columns are not the rows' (:data:`COLUMNS`: one missing,
        as in an older schema, or one unknown) or not of their types (numbers held as text are refused, not parsed:
        the message names the column, its type and the one expected); the message names the file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    for path in sorted(Path(out).glob("shard-*.parquet")):
        try:
            t = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"shard {str(path)!r} cannot be read as Parquet ({exc})") from None
        if t.schema != schema:
            missing = [c for c in schema.names if c not in t.column_names]
            unknown = [c for c in t.column_names if c not in schema.names]
            if missing or unknown:
                raise ValueError(f"shard {str(path)!r} does not hold a profile's rows: "
                                 + "; ".join(([f"no column {', '.join(missing)} (an older schema?)"] if missing else [])
                                             + ([f"unknown column {', '.join(unknown)}"] if unknown else []))
                                 + f"; expected the columns {', '.join(schema.names)}")
            for field in schema:  # numbers from numbers, text from text: the cast would parse "3" into 3
                got = t.schema.field(field.name).type
                numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
                ok = ((pa.types.is_integer(got) or pa.types.is_floating(got)) if numeric else
                      (pa.types.is_string(got) or pa.types.is_large_string(got)))
                if not ok:
                    raise ValueError(f"shard {str(path)!r} does not hold a profile's rows: its column `{field.name}` "
                                     f"holds {got}, expected {field.type}")
            try:
                t = t.select(schema.names).cast(schema)
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise ValueError(f"shard {str(path)!r} does not hold a profile's rows: its columns' types "
                                 f"{t.schema.types} are not {schema.types} ({exc})") from None
        yield t


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


def check_report_dest(out, dest) -> None:
    """Refuse to write the report of the run in ``out`` into ``dest`` when ``dest`` holds another run.

    ``dest`` may be None, the run's own folder, a folder without ``manifest.json``, or one holding a copy of
    the same run (the same identity entries: format, settings, models, prompts); a folder holding another run
    keeps its own report and figures.

    Raises
    ------
    ValueError
        ``dest`` holds the manifest of another run (the entries that differ are named), or one that cannot be
        read; ``dest`` (or a folder above it) is a file.
    """
    if dest is None:
        return
    out, dest = Path(out), Path(dest)
    blocked = next((p for p in (dest, *dest.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise ValueError(f"`dest` {str(dest)!r} must be a folder, but {str(blocked)!r} is a file: choose a folder "
                         "(it is created if missing)")
    theirs = dest / MANIFEST
    if not theirs.is_file() or (out.exists() and dest.exists() and dest.resolve() == out.resolve()):
        return
    ours = out / MANIFEST
    if not ours.is_file():
        return  # write_report says the run holds no manifest
    try:
        other = json.loads(theirs.read_text())
    except (OSError, ValueError):
        raise ValueError(f"`dest` {str(dest)!r} holds a {MANIFEST} that cannot be read: it may be another run's "
                         "folder; choose another `dest`") from None
    mine = json.loads(ours.read_text())
    differ = [k for k in _IDENTITY if not isinstance(other, dict) or other.get(k) != mine.get(k)]
    if differ:
        raise ValueError(f"`dest` {str(dest)!r} holds another profile run (its {MANIFEST} differs from that of "
                         f"`out` {str(out)!r} in {', '.join(differ)}): writing there would replace that run's "
                         "report and figures; choose an empty folder, or that run's own report")
