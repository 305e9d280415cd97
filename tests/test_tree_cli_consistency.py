"""The tree command line and API agree: one text and one node limit for the profile and the decoder, empty trees
refused before anything is written, EAGLE-2's parameters by SGLang's names, exact sizes, ``report --dest`` that
keeps another run's report, and a plan that says what it took."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("pyarrow")

import otspec.__main__ as cli  # noqa: E402
import otspec.decoding as D  # noqa: E402
import otspec.tree as T  # noqa: E402
from otspec.decoding._tree_loop import tree_plan  # noqa: E402
from otspec.profile import ProfileSettings, toy_pair  # noqa: E402
from otspec.profile._run import check_report_dest, subsample_positions, subsample_text  # noqa: E402
from otspec.profile._trees import resolve_trees  # noqa: E402
from otspec.tree import MAX_DRAFT_TREE_NODES, parse_tree_spec  # noqa: E402
from tests import test_cli  # noqa: E402

SMALL = test_cli.SMALL
prompts = test_cli.prompts  # the command line's fixture (no_loading: the shared one of tests/conftest.py)

def _profile(prompts, out, *extra):
    return cli.main(["profile", "--draft", "toy:3", "--target", "toy:3", "--prompts", str(prompts), "--out",
                     str(out), *SMALL, *extra])


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


# --------------------------------------------------------------------------- empty and degenerate trees
@pytest.mark.parametrize("tree", ["topk:[]", "topk:[[]]", "wor:[]:sequoia", "iid:[[]]"])
def test_empty_tree_is_refused_before_anything_is_written(tmp_path, prompts, no_loading, capsys, tree):
    out = tmp_path / "r"
    assert _profile(prompts, out, "--trees", tree) == 2
    err = _error(capsys)
    assert "`--trees[0]`: a shape must have at least one draft node, got the root alone" in err
    assert not out.exists()  # no manifest.json left behind (it used to be written, then KeyError)


@pytest.mark.parametrize("tree", ["topk:[]", "topk:[[]]"])
def test_empty_tree_is_refused_by_the_decoder_too(tree):
    d, t = toy_pair(3)
    with pytest.raises(ValueError, match="`tree`: a shape must have at least one draft node"):
        D.speculative_decode([0], draft=d, target=t, tree=tree, max_new_tokens=2)
    with pytest.raises(ValueError, match="`tree_universe`: a shape must have at least one draft node"):
        ProfileSettings(tree_universe="[]")
    with pytest.raises(ValueError, match="`trees\\[0\\]`: a tree must have at least one draft node"):
        ProfileSettings(trees=[("topk", T.TreeShape([]))])


# --------------------------------------------------------------------------- EAGLE-2 by SGLang's names
@pytest.mark.parametrize("tree", ["iid:branching(2,2):", "iid:branching(2,2):specinfer,", "wor:chains(2,2):sequoia,,traversal"])
def test_an_empty_verifier_name_is_refused_in_both(tmp_path, prompts, no_loading, capsys, tree):
    # a trailing ':' or ',' used to be dropped silently: the family ran the default verifiers, or fewer
    out = tmp_path / "r"
    assert _profile(prompts, out, "--trees", tree) == 2
    assert "`--trees[0]`: the verifiers after the second ':' must be comma-separated names" in _error(capsys)
    assert not out.exists()
    d, t = toy_pair(3)
    with pytest.raises(ValueError, match="`tree`: the verifiers after the second ':' must be comma-separated"):
        D.speculative_decode([0], draft=d, target=t, tree=tree, max_new_tokens=2)


def test_eagle2_params_take_sglangs_keywords():
    e = T.Eagle2Params(num_steps=3, topk=2, num_draft_tokens=6)
    assert e == T.Eagle2Params(3, 2, 6) == T.Eagle2Params(depth=3, top_k=2, total_tokens=6)
    assert (e.num_steps, e.topk, e.num_draft_tokens, e.n) == (3, 2, 6, 5)
    assert (e.depth, e.top_k, e.total_tokens) == (3, 2, 6)  # EAGLE's names stay attributes
    assert repr(e) == "Eagle2Params(num_steps=3, topk=2, num_draft_tokens=6)"
    with pytest.raises(ValueError, match=r"`topk` must be an integer >= 1, got 0"):
        T.Eagle2Params(num_steps=3, topk=0, num_draft_tokens=6)
    with pytest.raises(ValueError, match=r"`num_draft_tokens` - 1 = 7 draft nodes exceeds the 6 nodes proposed "
                                         r"\(topk \+ \(num_steps - 1\) \* topk\*\*2 with num_steps=2, topk=2\)"):
        T.Eagle2Params(num_steps=2, topk=2, num_draft_tokens=8)
    with pytest.raises(TypeError, match="`num_steps` or its alias `depth`, not both"):
        T.Eagle2Params(num_steps=2, depth=2, topk=2, num_draft_tokens=3)
    with pytest.raises(TypeError, match="needs `topk` \\(or its alias `top_k`\\)"):
        T.Eagle2Params(num_steps=2, num_draft_tokens=3)


@pytest.mark.parametrize("tree,match", [
    ("eagle2:3,0,6", r"`topk` must be an integer >= 1, got 0"),
    ("eagle2:2,2,9", r"`num_draft_tokens` - 1 = 8 draft nodes exceeds the 6 nodes proposed \(topk \+ "
                     r"\(num_steps - 1\) \* topk\*\*2 with num_steps=2, topk=2\)"),
    ("eagle2:0,2,3", r"`num_steps` must be an integer >= 1, got 0"),
])
def test_eagle2_errors_name_sglangs_parameters_not_the_sampling_flag(tmp_path, prompts, no_loading, capsys, tree,
                                                                      match):
    assert _profile(prompts, tmp_path / "r", "--top-k", "3", "--trees", tree) == 2
    err = _error(capsys)
    assert re.search(match, err), err
    assert "--top-k" not in err and "depth" not in err and "total_tokens" not in err


# --------------------------------------------------------------------------- exact sizes
@pytest.mark.parametrize("tree,nodes", [("branching(64,64,64)", "266,304"), ("branching(8,8,8,8)", "4,680"),
                                        ("chains(100,64)", "6,400"), ("branching(1025)", "1,025")])
def test_size_errors_give_the_true_size(tmp_path, prompts, no_loading, capsys, tree, nodes):
    assert _profile(prompts, tmp_path / "r", "--trees", f"topk:{tree}") == 2
    assert f"{tree} has {nodes} draft nodes, above the limit MAX_DRAFT_TREE_NODES = 1,024" in _error(capsys)
    with pytest.raises(ValueError, match=f"has {nodes} draft nodes"):
        D.speculative_decode([0], draft=toy_pair(3)[0], target=toy_pair(3)[1], tree=f"topk:{tree}")


def test_a_huge_branching_is_sized_without_building_it():
    with pytest.raises(ValueError, match=r"branching\(1000,1000,1000,1000\) has 1,001,001,001,000 draft nodes"):
        parse_tree_spec("topk:branching(1000,1000,1000,1000)")


# --------------------------------------------------------------------------- one language, one limit
def _decoded(tree, **kw):
    d, t = toy_pair(6, seed=1)
    return D.speculative_decode([0, 1], draft=d, target=t, tree=tree, max_new_tokens=10, rng=3, **kw).tokens


@pytest.mark.parametrize("text,tree,kw", [
    ("eagle2:3,2,6", T.Eagle2Params(3, 2, 6), {}),
    ("topk:branching(2,2):target-only", T.TreeShape.branching(2, 2), {"process": "topk"}),
    ("iid:chains(2,2)", T.TreeShape.chains(2, 2), {"process": "iid"}),
    ("wor:[[0],[1],[0,0]]:sequoia", [(0,), (1,), (0, 0)], {"process": "wor", "verifier": "sequoia"}),
])
def test_the_decoder_reads_the_profiles_text(text, tree, kw):
    np.testing.assert_array_equal(_decoded(text), _decoded(tree, **kw))
    ProfileSettings(trees=[text])  # the profile takes the same text


def test_text_and_keywords_must_agree():
    with pytest.raises(ValueError, match="names the verifier 'sequoia' and `verifier` is 'traversal'"):
        _decoded("wor:chains(2,2):sequoia", verifier="traversal")
    with pytest.raises(ValueError, match="names 2 verifiers"):
        _decoded("wor:chains(2,2):sequoia,traversal")
    assert _decoded("eagle2:2,2,4", process="eagle2").shape == _decoded(T.Eagle2Params(2, 2, 4)).shape


def test_one_node_limit_for_profile_and_decoder():
    d, t = toy_pair(3)
    big, fits = T.TreeShape.chains(MAX_DRAFT_TREE_NODES + 1, 1), T.TreeShape.chains(MAX_DRAFT_TREE_NODES, 1)
    for call in (lambda s: ProfileSettings(trees=[("iid", s)]),
                 lambda s: tree_plan(s, process="iid", verifier=None, options=None, allow_lossy=False, target=t, V=3,
                                     sampling=D.Sampling())):
        with pytest.raises(ValueError, match="1,025 draft nodes is above the limit MAX_DRAFT_TREE_NODES = 1,024"):
            call(big)
        call(fits)
    assert MAX_DRAFT_TREE_NODES == 1024


def test_deterministic_tree_takes_a_lossless_verifier_in_both():
    fam = resolve_trees(["topk:branching(2,2):target-only"]).families[0]
    assert fam.spec == "topk:branching(2,2)" and fam.verifiers == ()  # one value, whichever lossless rule
    with pytest.raises(ValueError, match="repeats the family"):
        resolve_trees(["topk:branching(2,2)", "topk:branching(2,2):target-only"])
    assert resolve_trees(["eagle2:2,2,4:target-only"]).families[0].spec == "eagle2:2,2,4"
    # a rule that is not lossless on the process: both refuse, with the reason
    with pytest.raises(ValueError, match="'specinfer' is not lossless on 'topk' trees.*processes \\('iid',\\)"):
        ProfileSettings(trees=["topk:branching(2,2):specinfer"])
    with pytest.raises(ValueError, match="'specinfer' is not lossless on process='topk'"):
        _decoded("topk:branching(2,2):specinfer")
    with pytest.raises(ValueError, match="SpecHub's pairs are drafted by otspec.decoding.speculative_decode only"):
        ProfileSettings(trees=["spechub:chains(2,1)"])


# --------------------------------------------------------------------------- report --dest
def _fake_run(folder, seed):
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "settings": {"seed": seed}, "models": {},
                                                      "prompts": {"count": 1}}))
    (folder / "report.md").write_text(f"report of run {seed}\n")
    return folder


def test_report_dest_refuses_a_folder_holding_another_run(tmp_path, capsys):
    a, b = _fake_run(tmp_path / "a", 0), _fake_run(tmp_path / "b", 1)
    assert cli.main(["report", str(a), "--dest", str(b), "--no-figures"]) == 2
    err = _error(capsys)
    assert f"`--dest` '{b}' holds another profile run" in err and "in settings" in err
    assert (b / "report.md").read_text() == "report of run 1\n"  # untouched
    check_report_dest(a, a)  # its own folder
    check_report_dest(a, tmp_path / "new")  # a new folder
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "manifest.json").write_text((a / "manifest.json").read_text())
    check_report_dest(a, copy)  # a copy of the same run


def test_write_report_refuses_a_folder_holding_another_run(tmp_path):
    from otspec.profile import write_report

    a, b = _fake_run(tmp_path / "a", 0), _fake_run(tmp_path / "b", 1)
    with pytest.raises(ValueError, match="`dest` .* holds another profile run"):
        write_report(a, dest=b, figures=False)
    assert (b / "report.md").read_text() == "report of run 1\n"  # untouched


@pytest.mark.parametrize("below", ["", "sub"])
def test_report_dest_that_is_a_file_is_refused_with_its_flag(tmp_path, capsys, below):
    # it used to end in "[Errno 17] File exists" (or "Not a directory"), naming no parameter
    a = _fake_run(tmp_path / "a", 0)
    f = tmp_path / "notes.txt"
    f.write_text("mine\n")
    dest = f / below if below else f
    assert cli.main(["report", str(a), "--dest", str(dest), "--no-figures"]) == 2
    err = _error(capsys)
    assert f"`--dest` '{dest}' must be a folder, but '{f}' is a file" in err
    assert f.read_text() == "mine\n"
    with pytest.raises(ValueError, match="`dest` .* must be a folder"):
        check_report_dest(a, dest)


# --------------------------------------------------------------------------- the plan's words
def test_plan_quotes_the_runs_vocabulary(tmp_path, prompts, capsys):
    assert _profile(prompts, tmp_path / "r") == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("without-replacement"))
    assert "this run's vocabulary has 3 tokens" in line
    assert "the subsample, position 0 of prompt 0 only (1 of 6 profiled positions" in out
    assert "every 32nd position" not in out


def test_subsample_text_says_what_was_taken():
    s = ProfileSettings(max_new_tokens=8, subsample=4)
    items = [([1], None)] * 3
    assert subsample_positions(s, items) == [(0, 0), (0, 4), (1, 3), (1, 7), (2, 2), (2, 6)]
    assert subsample_text(s, items).startswith("6 of 24 profiled positions, on 3 of 3 prompts")
    assert subsample_text(ProfileSettings(max_new_tokens=8, subsample=8), items).startswith(
        "position 0 of prompt 0, position 7 of prompt 1, position 6 of prompt 2 only (3 of 24")
    assert subsample_text(ProfileSettings(max_new_tokens=8, subsample=1), items).startswith("every profiled position")


@pytest.mark.parametrize("text", ["iid:branching(2,2):spec infer", "t opk:branching(2,2)", "topk:branching(4 2)",
                                  "wor:chains(2,3):sequoia, tra versal", "eagle2:3 2,6"])
def test_blanks_inside_a_name_or_a_number_are_refused_not_dropped(text):
    # blanks were removed everywhere: 'spec infer' was read as 'specinfer' and 'branching(4 2)' as branching(42)
    with pytest.raises(ValueError, match="no blanks inside|separated by commas"):
        parse_tree_spec(text)


def test_blanks_around_separators_and_between_a_shapes_numbers_are_kept_out():
    a = parse_tree_spec(" iid : branching(4, 2) : specinfer , spectr-tree ")
    b = parse_tree_spec("iid:branching(4,2):specinfer,spectr-tree")
    assert a == b and a.verifiers == ("specinfer", "spectr-tree")


def test_an_unknown_verifier_in_the_decoders_tree_text_is_named_by_tree():
    # the message spoke of `verifier`, a keyword the user did not give
    d, t = toy_pair(6, seed=0)
    with pytest.raises(ValueError, match=r"`tree` 'iid:branching\(2,2\):specnfer' names the verifier 'specnfer', "
                                         r"which is no tree verifier.*specinfer"):
        D.speculative_decode([0, 1], draft=d, target=t, tree="iid:branching(2,2):specnfer", max_new_tokens=4, rng=0)
