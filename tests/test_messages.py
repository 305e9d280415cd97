"""Error messages: plain numbers (no numpy reprs), the row of a batched input, "did you mean" for names."""

from __future__ import annotations

import numpy as np
import pytest

import otspec
import otspec.block
import otspec.spectr
from otspec._registry import suggest, unknown_name_message
from otspec._validation import number_text


def test_numbers_are_plain_in_messages():
    assert number_text(np.float64(-0.1)) == "-0.1" and number_text(np.int64(3)) == "3"
    with pytest.raises(ValueError, match=r"`p` must be non-negative, got minimum -0\.1 at index 1$") as exc:
        otspec.alpha_k(np.array([1.1, -0.1]), np.array([0.5, 0.5]), 2)
    assert "np." not in str(exc.value)
    with pytest.raises(ValueError, match=r"`tv` must lie in \(0, 1\], got 1\.5$"):
        otspec.testing.check_sampler(lambda d, r: 0, [0.5, 0.5], [0.5, 0.5], tv=np.float64(1.5))
    with pytest.raises(ValueError, match=r"got minimum -0\.2 at prefix \(1,\), token 0$"):
        otspec.models.TableModel([np.array([0.5, 0.5]), np.array([[0.5, 0.5], [-0.2, 1.2]])])


def test_a_batched_input_error_names_the_row():
    good = np.full((3, 2), 0.5)
    neg = good.copy()
    neg[2] = [1.1, -0.1]
    with pytest.raises(ValueError, match=r"got minimum -0\.1 \(first negative entry in row \(2,\)\)"):
        otspec.alpha_k(neg, good, 2)
    off = good.copy()
    off[1] = [0.6, 0.6]
    with pytest.raises(ValueError, match=r"got row \(1,\) off by 0\.2"):
        otspec.alpha_k(good, off, 2)
    nan = np.full((2, 2, 2), 0.5)
    nan[1, 0, 1] = np.nan
    with pytest.raises(ValueError, match=r"1 non-finite entries, the first in row \(1, 0\)"):
        otspec.alpha_k(nan, np.full((2, 2, 2), 0.5), 2)


@pytest.mark.parametrize("typo,meant", [("kseg", "kseq"), ("Optimal_Verifier", "optimal"), ("topk", "top-k"),
                                         ("block_onestep", "block-onestep")])
def test_a_misspelt_verifier_name_gets_a_suggestion(typo, meant):
    with pytest.raises(ValueError, match=rf"got {typo!r} \(did you mean {meant!r}"):
        otspec.get_verifier(typo)


def test_a_name_of_the_wrong_kind_is_explained():
    with pytest.raises(ValueError, match=r"'block' is registered but is a block-level verifier not accepted here"):
        otspec.get_verifier("block", kind="token")
    with pytest.raises(ValueError, match=r"must be one of .*got 'zzz'$"):
        otspec.get_verifier("zzz")


# ---------------------------------------------------------------------------
# unknown names: one message (otspec._registry.unknown_name_message), one suggestion rule
# ---------------------------------------------------------------------------

ALL = otspec.multidraft.verifier_names()
SPECTR = otspec.spectr.VERIFIER_NAMES


@pytest.mark.parametrize("name,allowed,meant", [
    ("k-seq", ALL, ["kseq"]),  # separators folded
    ("KSeq", ALL, ["kseq"]),  # case folded
    ("K_SEQ", SPECTR, ["kseq"]),
    ("kseg", ALL, ["kseq"]),  # one letter off
    ("ksqe", ALL, ["kseq"]),  # two letters swapped
    ("kseqq", ALL, ["kseq"]),
    ("topk", ALL, ["top-k"]),
    ("block_onestep", ALL, ["block-onestep"]),
    ("blok", ALL, ["block"]),
    ("Optimal_Verifier", ALL, ["optimal"]),  # an allowed name is a prefix of it
    ("greedy", ALL, ["greedy-drafts"]),  # it is a prefix of an allowed name
    ("multidraft", ALL, ["multidraft-plan", "multidraft-one-token"]),
    ("top-k", SPECTR, []),  # not 'token': a different name, not a typo of it
    ("topk", SPECTR, []),
    ("spectr", ALL, ["spectr-tree"]),  # a prefix of the tree verifier "SpecTr over a tree"
    ("spectre", ("token", "kseq"), []),
    ("zzz", ALL, []),
    ("", ALL, []),
    ("lp", ("exact", "highs"), []),
    ("Exact", ("exact", "lp", "lp-tuples"), ["exact"]),
    ("lp_tuples", ("exact", "lp", "lp-tuples"), ["lp-tuples"]),
])
def test_the_suggestion_table(name, allowed, meant):
    expected = f" (did you mean {' or '.join(repr(m) for m in meant)}?)" if meant else ""
    assert suggest(name, allowed) == expected


def test_the_one_unknown_name_message():
    msg = unknown_name_message("verifier", "k-seq", ("token", "kseq"), alternative=" or a callable")
    assert msg == "`verifier` must be one of ('token', 'kseq') or a callable, got 'k-seq' (did you mean 'kseq'?)"
    assert unknown_name_message("methods", "otn", ["otm"], entries=True) == (
        "`methods` entries must be among ('otm',), got 'otn' (did you mean 'otm'?)")
    assert unknown_name_message("method", 3, ("exact",)) == "`method` must be one of ('exact',), got int"


def _message(call):
    with pytest.raises(ValueError) as exc:
        call()
    return str(exc.value)


def _models():
    from otspec.models import MemorylessModel

    return MemorylessModel([0.5, 0.5]), MemorylessModel([0.3, 0.7])


@pytest.mark.parametrize("entry", [
    lambda: otspec.get_verifier("k-seq"),
    lambda: otspec.get_verifier("k-seq", kind="token"),
    lambda: otspec.multidraft.get_verifier("k-seq"),
    lambda: otspec.spectr.resolve_verifier("k-seq"),
    lambda: otspec.spectr.block_efficiency(*_models(), 2, 2, verifier="k-seq"),
    lambda: otspec.spectr.spectr_step(*_models(), 2, 2, verifier="k-seq", rng=0),
])
def test_every_token_level_name_lookup_suggests_kseq_for_k_seq(entry):
    assert "got 'k-seq' (did you mean 'kseq'?)" in _message(entry)


def test_speculative_decode_suggests_kseq_for_k_seq():
    pytest.importorskip("torch")
    import otspec.decoding as D
    from tests.toy_lm import toy_target_draft

    target, draft = toy_target_draft(3)
    msg = _message(lambda: D.speculative_decode([0], draft=draft, target=target, verifier="k-seq", rng=0))
    assert "or a callable, got 'k-seq' (did you mean 'kseq'?)" in msg
    msg = _message(lambda: D.speculative_decode([0], draft=draft, target=target, verifier="Top_K", rng=0))
    assert "got 'Top_K'; 'top-k' is registered but assumes 'deterministic' drafts" in msg
    with pytest.raises(ValueError, match=r"got unknown keys \['Rho'\] \(did you mean 'rho'\?\)"):
        D.speculative_decode([0], draft=draft, target=target, verifier="kseq", verifier_options={"Rho": 1.0}, rng=0)
    with pytest.raises(ValueError, match=r"`top_p_rule` must be one of .*got 'Transformers' \(did you mean 'transformers'"):
        D.Sampling(top_p_rule="Transformers")


@pytest.mark.parametrize("entry", [
    lambda v: otspec.block.make_verifier(*_models(), 2, v),
    lambda v: otspec.block.expected_length(*_models(), 2, v),
    lambda v: otspec.block.check_lossless(*_models(), 2, v),
    lambda v: otspec.get_verifier(v, block=True),
])
def test_block_name_lookups_explain_kseq_and_suggest_block_names(entry):
    # k-Seq verifies k drafts at one position: a block entry point says so instead of suggesting it
    msg = _message(lambda: entry("k-seq"))
    assert "got 'k-seq'; 'kseq' is registered but is a token-level verifier that does not run along a block" in msg
    assert "got 'block_onestep' (did you mean 'block-onestep'?)" in _message(lambda: entry("block_onestep"))


def test_spectr_does_not_suggest_token_for_top_k():
    msg = _message(lambda: otspec.spectr.block_efficiency(*_models(), 2, 2, verifier="top-k"))
    assert "did you mean" not in msg and "'token'?" not in msg
    assert msg.endswith("got 'top-k'; 'top-k' is registered but SpecTr cannot run it "
                        "(assumes 'deterministic' drafts, not i.i.d.)")
    msg = _message(lambda: otspec.spectr.block_efficiency(*_models(), 2, 2, verifier="Mentored"))
    assert "'mentored' is registered but SpecTr cannot run it (lossy)" in msg


@pytest.mark.parametrize("entry,typo,meant", [
    (lambda m: otspec.alpha_k([0.5, 0.5], [0.3, 0.7], 2, method=m), "LP", "lp"),
    (lambda m: otspec.alpha_k([0.5, 0.5], [0.3, 0.7], 2, method=m), "lp_tuples", "lp-tuples"),
    (lambda m: otspec.otm.alpha_k_without_replacement([0.5, 0.5], [0.3, 0.7], 2, method=m), "Exact", "exact"),
    (lambda m: otspec.optimal_verifier([0.5, 0.5], [0.3, 0.7], 2, method=m), "col-gen", "colgen"),
    (lambda m: otspec.mentored([0.5, 0.5], [0.3, 0.7], 0.1, method=m), "bisect", "bisection"),
    (lambda m: otspec.block.compare_schemes(*_models(), 2, 2, schemes=[m]), "spectr-k-seq", "spectr-kseq"),
])
def test_every_other_name_parameter_suggests(entry, typo, meant):
    assert f"got {typo!r} (did you mean {meant!r}?)" in _message(lambda: entry(typo))


def test_plotting_method_names_suggest():
    pytest.importorskip("matplotlib")
    from otspec.plotting.multidraft import acceptance_curves

    msg = _message(lambda: acceptance_curves([0.5, 0.5], [0.3, 0.7], [1, 2], methods=("otm", "k-seq")))
    assert msg.startswith("`methods` entries must be among") and "got 'k-seq' (did you mean 'kseq'?)" in msg
