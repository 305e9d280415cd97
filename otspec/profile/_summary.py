r"""Summaries of a profile run: means per depth, tokens per target call, paired differences, speed-ups.

Every interval is a 95 % percentile bootstrap over prompts (the prompts are
the independent units; positions along one path are not), with the
estimates as ratios of sums over the resampled prompts. Paired differences
use the same resamples for both verifiers, so the variation the two share
(the contexts, the drawn drafts) cancels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._collect import is_subsampled
from ._renewal import starts_recursion
from ._settings import costly
from ._store import iter_shards, read_manifest

__all__ = ["ProfileSummary", "Estimate", "summarize", "prompt_sums"]

#: Bootstrap resamples of every interval.
N_BOOT = 2000


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95 % bootstrap interval over prompts."""

    value: float
    lo: float
    hi: float

    @property
    def half_width(self) -> float:
        return 0.5 * (self.hi - self.lo)

    def __format__(self, spec: str) -> str:
        spec = spec or ".3f"
        return f"{self.value:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}]"


@dataclass(frozen=True)
class ProfileSummary:
    r"""What a profile says about a draft/target pair.

    Attributes
    ----------
    acceptance : dict
        ``(verifier, k, depth) -> Estimate``: mean exact acceptance per depth.
    gaps : dict
        ``("tv" | "kl", verifier, k, depth) -> Estimate`` for the lossy rules.
    tokens_per_call : dict
        ``(family, k, L) -> Estimate``: expected tokens per target call, the
        ratio of sums over profiled positions of the exact expected tokens
        emitted and target calls given the drawn drafts.
    differences : dict
        ``((family, k, L), (reference, k', L')) -> Estimate``: paired
        differences of tokens per call.
    speedup : dict
        ``(family, k, L) -> float``: predicted wall-clock speed-up of the cost model.
    draft_cost : float
        Cost of one draft step relative to one target call, measured (or given).
    renewal : dict
        ``(family, k, L) -> Estimate``: the renewal tokens-per-call estimator
        from the emission tables along the text (empty when not recorded).
    renewal_differences : dict
        Paired differences of the renewal estimates with the reference scheme (same resamples).
    palm : dict
        ``(family, k, L) -> Estimate``: the Palm average, the profiled
        positions' expected tokens per call weighted by their start
        probabilities :math:`r(t)` (:func:`otspec.profile.palm_tokens_per_call`;
        consistent for the long-run tokens per call of real decoding).
    position_bias : dict
        ``(family, k, L) -> Estimate``: ``tokens_per_call / palm - 1``, the
        relative bias of the per-position average (the inspection paradox of
        docs/theory/profile.rst), on the same resamples.
    positions, prompts : int
    settings : dict
    models : dict
    """

    acceptance: dict
    gaps: dict
    tokens_per_call: dict
    differences: dict
    speedup: dict
    draft_cost: float
    score_cost: float
    positions: int
    prompts: int
    settings: dict
    models: dict
    renewal: dict = field(default_factory=dict)
    renewal_differences: dict = field(default_factory=dict)
    palm: dict = field(default_factory=dict)
    position_bias: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"ProfileSummary(prompts={self.prompts}, positions={self.positions}, "
                f"verifiers={len({v for v, *_ in self.acceptance})}, families={len({f for f, *_ in self.tokens_per_call})})")


def _boot(S: np.ndarray, C: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Point estimates ``sum S / sum C`` per column and their resampled values ``(B, K)``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        point = S.sum(axis=0) / C.sum(axis=0)
        res = (W @ S) / (W @ C)
    return point, res


def _interval(point: float, res: np.ndarray) -> Estimate:
    lo, hi = np.nanpercentile(res, [2.5, 97.5]) if np.isfinite(res).any() else (np.nan, np.nan)
    return Estimate(float(point), float(lo), float(hi))


def prompt_sums(table, kinds, prompts=None):
    """Per-prompt sums and counts of each ``(kind, name, k, j)`` key: ``(keys, prompts, S (N, K), C (N, K))``.

    ``prompts`` (sorted indices) fixes the rows, e.g. to those of the whole run for a subset of positions.
    """
    import pyarrow.compute as pc

    t = table.filter(pc.is_in(table["kind"], value_set=__import__("pyarrow").array(list(kinds))))
    prompt = t["prompt"].to_numpy()
    kind = np.asarray(t["kind"].to_pylist(), dtype=object)
    name = np.asarray(t["name"].to_pylist(), dtype=object)
    k = t["k"].to_numpy()
    j = t["j"].to_numpy()
    v = t["value"].to_numpy()
    if prompts is None:
        prompts, pi = np.unique(prompt, return_inverse=True)
    else:
        pi = np.searchsorted(prompts, prompt)
    keys = sorted({(a, b, int(c), int(d)) for a, b, c, d in zip(kind, name, k, j)})
    index = {key: i for i, key in enumerate(keys)}
    ki = np.fromiter((index[(a, b, int(c), int(d))] for a, b, c, d in zip(kind, name, k, j)), dtype=np.int64,
                     count=len(v))
    S = np.zeros((len(prompts), len(keys)))
    C = np.zeros((len(prompts), len(keys)))
    np.add.at(S, (pi, ki), v)
    np.add.at(C, (pi, ki), 1.0)
    return keys, prompts, S, C


def _emitted_and_calls(keys, S, C):
    """Per prompt, expected tokens emitted and target calls of every (scheme, k, L): ``(keys, E (N, K), C (N, K))``.

    ``E[emitted] = E[tau_L | X] + 1`` per position (``L + 1`` for Sun et al.'s block verification,
    whose expected calls are recorded), one call per position otherwise.
    """
    col = {key: i for i, key in enumerate(keys)}
    out_keys, Es, Cs = [], [], []
    for key, i in col.items():
        kind, name, k, L = key
        if kind != "tau":
            continue
        n = C[:, i]
        if name == "block":
            Es.append((L + 1) * n)
            Cs.append(S[:, col[("calls", name, k, L)]])
        else:
            Es.append(S[:, i] + n)
            Cs.append(n)
        out_keys.append((name, k, L))
    if not out_keys:
        return [], np.zeros((S.shape[0], 0)), np.zeros((S.shape[0], 0))
    return out_keys, np.stack(Es, axis=1), np.stack(Cs, axis=1)


def _timing(out) -> tuple[float, float]:
    """Seconds per draft step and per target call, over the whole run."""
    import pyarrow.compute as pc


    sums = {"draft": np.zeros(2), "target": np.zeros(2)}
    for t in iter_shards(out):
        t = t.filter(pc.equal(t["kind"], "time"))
        for name, j, v in zip(t["name"].to_pylist(), t["j"].to_pylist(), t["value"].to_pylist()):
            sums[name][j - 1] += v
    d = sums["draft"][0] / max(sums["draft"][1], 1.0)
    q = sums["target"][0] / max(sums["target"][1], 1.0)
    return d, q


def summarize(out, *, draft_cost: float | None = None, score_cost: float = 1.0, reference: str | None = None,
              reference_multi: str | None = "optimal", n_boot: int = N_BOOT, seed: int = 0) -> ProfileSummary:
    r"""Summarise a profile run: acceptance per depth, tokens per target call, paired differences, speed-ups.

    .. math::

        \widehat{\text{tpc}}(f, k, L) = \frac{\sum_{i, t} E[\text{emitted}_{i,t}]}{\sum_{i, t} E[\text{calls}_{i,t}]},
        \qquad
        \widehat{S}(f, k, L) = \frac{\widehat{\text{tpc}}}{L\,c + s},

    with ``E[emitted] = E[\tau_L | X] + 1`` (``L + 1`` for Sun et al.'s
    block verification, whose residual costs ``E[calls] - 1`` extra target
    calls), ``c`` the cost of one draft step relative to one target call and
    ``s`` the cost of scoring ``L + 1`` tokens relative to one target call of
    the baseline (1 when the target is memory-bound, as on a GPU).

    Parameters
    ----------
    out : str or path
        The run's folder.
    draft_cost : float or None, keyword-only
        ``c``; ``None`` measures it from the run (seconds per draft step /
        seconds per target scoring call, both batched over ``k_max``).
    score_cost : float, keyword-only
        ``s``.
    reference : str or None, keyword-only
        The family every other is compared with (paired) at ``k = 1``; default
        ``"token"`` if profiled, else the first family.
    reference_multi : str or None, keyword-only
        The family compared with at the same ``k`` when ``k > 1`` (default the
        optimal verifier, the ceiling; the same drafts on both sides, so the
        interval is narrow); ``None``, or not profiled: ``reference`` at ``k = 1``.
    n_boot : int, keyword-only
        Bootstrap resamples.
    seed : int, keyword-only
        Seed of the resampling (the summary is a function of the run and ``seed``).

    Returns
    -------
    ProfileSummary

    Raises
    ------
    ValueError
        ``out`` holds no run, or no finished shard; ``draft_cost`` or ``score_cost`` negative.

    Examples
    --------
    See :func:`profile`.
    """
    man = read_manifest(out)
    for nm, val in (("draft_cost", draft_cost), ("score_cost", score_cost)):
        if val is not None and not (np.isfinite(val) and val >= 0):
            raise ValueError(f"`{nm}` must be a finite number >= 0, got {val!r}")
    sums = _stream_sums(out, man["settings"])
    if sums is None:
        raise ValueError(f"`out` {str(out)!r} holds no finished shard yet")
    keys, prompts, S, C = sums["all"]
    N = len(prompts)
    rng = np.random.default_rng(seed)
    W = rng.multinomial(N, np.full(N, 1.0 / N), size=n_boot).astype(np.float64)
    col = {key: i for i, key in enumerate(keys)}
    point, res = _boot(S, C, W)
    acceptance, gaps = {}, {}
    for key, i in col.items():
        kind, name, k, j = key
        if kind == "acc":
            acceptance[(name, k, j)] = _interval(point[i], res[:, i])
        elif kind in ("tv", "kl"):
            gaps[(kind, name, k, j)] = _interval(point[i], res[:, i])
    tokens, diffs, speed = {}, {}, {}
    tpc_keys, E, Cm = _emitted_and_calls(keys, S, C)
    if tpc_keys:
        tp, tres = _boot(E, Cm, W)
        for i, key in enumerate(tpc_keys):
            tokens[key] = _interval(tp[i], tres[:, i])
        fams = list(dict.fromkeys(f for f, _, _ in tpc_keys))
        ref = reference if reference is not None else ("token" if "token" in fams else fams[0])
        if ref not in fams:
            raise ValueError(f"`reference` must be a profiled family {tuple(fams)}, got {ref!r}")
        # the costly schemes are profiled at every `subsample`-th position: their paired differences
        # compare both schemes on those positions only

        skeys, _, sS, sC = sums["sub"]
        s_keys, sE, sCm = _emitted_and_calls(skeys, sS, sC)
        sp, sres = _boot(sE, sCm, W)
        for (f, k, L) in tpc_keys:
            other = (reference_multi, k, L) if k > 1 and (reference_multi, k, L) in tpc_keys else (ref, 1, L)
            if f == other[0]:
                continue
            src, srcp, srcr = (s_keys, sp, sres) if costly("tau", f) or costly("tau", other[0]) else (
                tpc_keys, tp, tres)
            if other not in src or (f, k, L) not in src:
                continue
            i, r = src.index((f, k, L)), src.index(other)
            diffs[((f, k, L), other)] = _interval(srcp[i] - srcp[r], srcr[:, i] - srcr[:, r])
        if draft_cost is None:
            d, q = _timing(out)
            draft_cost = d / q if q > 0 else float("nan")
        for i, (f, k, L) in enumerate(tpc_keys):
            extra = float(Cm[:, i].sum() / max(C[:, col[("tau", f, k, L)]].sum(), 1.0)) - 1.0
            speed[(f, k, L)] = float(tp[i] * (1.0 + extra) / (L * draft_cost + score_cost + extra))
    renewal, ren_res = _renewal_estimates(sums["T_n"], sums["starts"], W)
    palm, bias = {}, {}
    for key, (num, den) in sums["palm"].items():
        if key not in tokens:
            continue
        pp, pres = _boot(num[:, None], den[:, None], W)
        palm[key] = _interval(pp[0], pres[:, 0])
        i = tpc_keys.index(key)
        bias[key] = _interval(tp[i] / pp[0] - 1.0, tres[:, i] / pres[:, 0] - 1.0)
    ren_diffs = {}
    if renewal:
        fams = list(dict.fromkeys(f for f, _, _ in renewal))
        rref = reference if reference in fams else ("token" if "token" in fams else fams[0])
        for (f, k, L), e in renewal.items():
            r = (rref, 1, L)
            if f != rref and r in renewal:
                ren_diffs[((f, k, L), r)] = _interval(e.value - renewal[r].value, ren_res[(f, k, L)] - ren_res[r])
    return ProfileSummary(acceptance=acceptance, gaps=gaps, tokens_per_call=tokens, differences=diffs,
                          speedup=speed, draft_cost=float(draft_cost) if draft_cost is not None else float("nan"),
                          score_cost=float(score_cost), positions=int(C[:, 0].sum()) if C.size else 0, prompts=N,
                          settings=man["settings"], models=man["models"], renewal=renewal,
                          renewal_differences=ren_diffs, palm=palm, position_bias=bias)


def _merge_sums(parts):
    """Stack per-shard ``(keys, prompts, S, C)`` (disjoint prompts) on the union of their keys."""
    keys = sorted({k for p in parts for k in p[0]})
    col = {k: i for i, k in enumerate(keys)}
    prompts = np.concatenate([p[1] for p in parts])
    S = np.zeros((len(prompts), len(keys)))
    C = np.zeros((len(prompts), len(keys)))
    row = 0
    for pk, pp, pS, pC in parts:
        idx = [col[k] for k in pk]
        S[row:row + len(pp), idx] = pS
        C[row:row + len(pp), idx] = pC
        row += len(pp)
    return keys, prompts, S, C


def _stream_sums(out, settings: dict):
    """Per-prompt sums of a run, reading one shard at a time (memory: one shard plus the ``(N, keys)`` sums).

    Returns ``{"all": (keys, prompts, S, C), "sub": ... on the costly subsample, "T_n": (N,),
    "starts": {(scheme, k, L): (N,)}, "palm": {(scheme, k, L): ((N,), (N,))}}`` (the renewal starts per
    prompt; the Palm sums over the profiled positions), or None without shards.
    """
    import pyarrow as pa
    import pyarrow.compute as pc


    alls, subs, T_parts, start_parts, palm_parts = [], [], [], [], []
    for t in iter_shards(out):
        t = t.filter(pc.not_equal(t["kind"], "time"))
        if t.num_rows == 0:
            continue
        part = prompt_sums(t, ("acc", "tv", "kl", "tau", "calls"))
        prompts = part[1]
        alls.append(part)
        mask = [is_subsampled(p, i, settings) for p, i in zip(t["pos"].to_pylist(), t["prompt"].to_pylist())]
        subs.append(prompt_sums(t.filter(pa.array(mask, type=pa.bool_())), ("tau", "calls"), prompts))
        T_n, starts, palm = _renewal_starts(t, prompts)
        T_parts.append(T_n)
        start_parts.append(starts)
        palm_parts.append(palm)
    if not alls:
        return None
    skeys = sorted({k for st in start_parts for k in st})
    starts = {k: np.concatenate([st.get(k, np.zeros(len(a[1]))) for st, a in zip(start_parts, alls)]) for k in skeys}
    pkeys = sorted({k for pa_ in palm_parts for k in pa_})
    zeros = [(np.zeros(len(a[1])),) * 2 for a in alls]
    palm = {k: tuple(np.concatenate([pa_.get(k, z)[c] for pa_, z in zip(palm_parts, zeros)]) for c in (0, 1))
            for k in pkeys}
    return {"all": _merge_sums(alls), "sub": _merge_sums(subs), "T_n": np.concatenate(T_parts), "starts": starts,
            "palm": palm}


def _renewal_starts(table, prompts: np.ndarray) -> tuple[np.ndarray, dict, dict]:
    r"""Per prompt of one shard: the text length :math:`T_n`, :math:`\sum_t r_n(t)` of every recorded scheme,
    and the Palm sums :math:`(\sum_t r_n(t)\, m_n(t), \sum_t r_n(t))` over the positions where the scheme's
    :math:`m = E[\tau_L \mid X] + 1` is recorded.

    ``r`` is :func:`otspec.profile.starts_recursion` of the prompt's emission tables.
    """
    import pyarrow as pa
    import pyarrow.compute as pc


    t = table.filter(pc.is_in(table["kind"], value_set=pa.array(["e", "logq"])))
    T_n = np.zeros(len(prompts))
    if t.num_rows == 0:
        return T_n, {}, {}
    tau = table.filter(pc.equal(table["kind"], "tau"))
    tau_cols = {c: tau[c].to_numpy() for c in ("prompt", "pos", "k", "j", "value")}
    tau_name = np.asarray(tau["name"].to_pylist(), dtype=object)
    prompt = t["prompt"].to_numpy()
    kind = np.asarray(t["kind"].to_pylist(), dtype=object)
    name = np.asarray(t["name"].to_pylist(), dtype=object)
    pos, k, j, m, v = (t[c].to_numpy() for c in ("pos", "k", "j", "m", "value"))
    row = {p: i for i, p in enumerate(prompts.tolist())}
    lq_mask = kind == "logq"
    logq = {}
    for p in np.unique(prompt[lq_mask]):
        sel = lq_mask & (prompt == p)
        order = np.argsort(pos[sel])
        logq[int(p)] = v[sel][order]
        T_n[row[int(p)]] = sel.sum()
    e_mask = ~lq_mask
    starts, palm = {}, {}
    for key in sorted({(a, int(b), int(c)) for a, b, c in zip(name[e_mask], k[e_mask], m[e_mask])}):
        f, kk, L = key
        sel0 = e_mask & (name == f) & (k == kk) & (m == L)
        tsel0 = (tau_name == f) & (tau_cols["k"] == kk) & (tau_cols["j"] == L)
        S_n, num, den = np.zeros(len(prompts)), np.zeros(len(prompts)), np.zeros(len(prompts))
        for p, lq in logq.items():
            sel = sel0 & (prompt == p)
            E = np.zeros((lq.shape[0], L + 1))
            E[pos[sel], j[sel] - 1] = v[sel]
            r = starts_recursion(E, lq)
            S_n[row[p]] = r.sum()
            tsel = tsel0 & (tau_cols["prompt"] == p)
            rt = r[tau_cols["pos"][tsel]]
            num[row[p]] = float(rt @ (tau_cols["value"][tsel] + 1.0))
            den[row[p]] = float(rt.sum())
        starts[key] = S_n
        if den.any():
            palm[key] = (num, den)
    return T_n, starts, palm


def _renewal_estimates(T_n: np.ndarray, starts: dict, W: np.ndarray) -> tuple[dict, dict]:
    r"""Tokens per call by the renewal estimator: :math:`\sum_n T_n / \sum_n \sum_t r_n(t)` over prompts.

    The interval resamples prompts with the same weights ``W`` as every other estimate.
    """
    out, resampled = {}, {}
    for key, S_n in starts.items():
        with np.errstate(invalid="ignore", divide="ignore"):
            point = T_n.sum() / S_n.sum()
            res = (W @ T_n) / (W @ S_n)
        out[key] = _interval(point, res)
        resampled[key] = res
    return out, resampled
