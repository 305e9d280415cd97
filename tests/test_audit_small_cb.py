"""Small input and message findings of the last audits, fixed at their root (task CB).

Each test failed on main a3dbc22:

1. ``alpha_k_lower_bound``'s size guard named ``alpha_k_upper_bound`` (a copy of the message): every size guard
   below must name the function called or one of its parameters, and no other public function as its subject.
2. ``get_verifier``'s messages named ``verifier`` instead of its parameter ``name``: every public getter of the
   registries names the parameter as its signature spells it.
3. ``seed_for(np.int64(3)) != seed_for(3)``: a numpy scalar gives the seed of the Python value it equals, and the
   seeds of Python values are unchanged (pinned below).
4. A law of booleans was accepted on the 1-D route and refused on the batched one: now refused on both, with a
   TypeError naming the parameter.
5. ``toy_pair(vocab_size=2**63)`` (and a bad seed or closeness) reached numpy's own error.
6. Messages of ``uncovered_prefixes``, ``chi2_gof`` (counts), ``processed_law`` (logits) and
   ``emission_probs_from_token_probs`` (``p_y``, ``q_y``) did not state what came.
7. A shard column of numbers held as text was parsed by the cast.
8. A manifest of format 1 was summarised without a word; one of a newer format too.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import warnings

import numpy as np
import pytest

import otspec
from otspec import models, otm, testing, tree
from otspec import multidraft as md

P = np.array([0.5, 0.25, 0.125, 0.125, 0.0])
Q = np.array([0.125, 0.25, 0.5, 0.0, 0.125])
U40 = np.full(40, 1 / 40)
D4 = models.MemorylessModel([0.25, 0.25, 0.25, 0.25])


def _public_functions() -> set[str]:
    import otspec.profile as prof
    import otspec.spectr as spt

    names = set()
    for mod in (otspec, otm, testing, models, tree, md, prof, spt):
        names |= {n for n in getattr(mod, "__all__", ()) if callable(getattr(mod, n, None)) and "_" in n}
    return names


# --------------------------------------------------------------------------------------------- 1. size guards
# (function, call that trips its size guard, the parameters it may name)
SIZE_GUARDS = {
    "alpha_k_upper_bound": (lambda: otspec.alpha_k_upper_bound(P, Q, 40), ("k",)),
    "alpha_k_lower_bound": (lambda: otspec.alpha_k_lower_bound(P, Q, 40), ("k",)),
    "otm_lp_tuples": (lambda: otspec.otm_lp_tuples(P, Q, 40), ("k",)),
    "otm_lp": (lambda: otspec.otm_lp(U40, U40, 30), ("k",)),
    "without_replacement_verifier": (lambda: otspec.without_replacement_verifier(U40, U40, 20), ("k",)),
    "wor_lp": (lambda: otm.wor_lp(U40, U40, 20), ("k", "max_tuples")),
    "check_block_sampler": (lambda: testing.check_block_sampler(lambda *a: None, D4, D4, L=30, rng=0), ("L",)),
    "random_memoryless_model": (lambda: models.random_memoryless_model(10**9, rng=0), ("V",)),
    "joint_law": (lambda: models.joint_law(D4, 40), ("length", "max_entries")),
    "check_lossless": (lambda: otspec.check_lossless(otspec.kseq(U40, U40, 8)), ("max_tuples",)),
}


@pytest.mark.parametrize("name", list(SIZE_GUARDS))
def test_a_size_guard_names_the_function_called(name):
    call, params = SIZE_GUARDS[name]
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert name in msg or any(f"`{p}`" in msg for p in params), msg
    for other in _public_functions() - {name}:
        for m in re.finditer(rf"(?<![\w`.]){re.escape(other)}(?![\w])", msg):
            # another public function may be named only as the alternative to use
            assert re.search(r"(use|or|/)\s*$", msg[:m.start()]), f"{name}'s guard names {other}: {msg}"


def test_the_lower_bound_guard_no_longer_names_the_upper_bound():
    with pytest.raises(ValueError, match=r"^alpha_k_lower_bound enumerates 2\*\*n \* n\*\*k = 2\*\*5 \* 5\*\*40 "):
        otspec.alpha_k_lower_bound(P, Q, 40)
    assert otspec.alpha_k_lower_bound(P, Q, 2) == otspec.closed_form.lemma3_constant(2) * otspec.alpha_k_upper_bound(
        P, Q, 2)


# ------------------------------------------------------------------------------------------- 2. getters' names
def _block_make_verifier(v):
    from otspec.block import make_verifier

    return make_verifier(v, D4, D4, 2)


def _block_expected_length(v):
    from otspec.block import expected_length

    return expected_length(D4, D4, 2, v)


def _spectr_resolve(v):
    from otspec.spectr import resolve_verifier

    return resolve_verifier(v)


# (label, the function (for its signature), a call of it with the bad value, the parameter)
GETTERS = [
    ("otspec.get_verifier", otspec.get_verifier, lambda v: otspec.get_verifier(v), "name"),
    ("multidraft.get_verifier", md.get_verifier, lambda v: md.get_verifier(v, kind="token"), "name"),
    ("tree.make_tree_verifier", tree.make_tree_verifier, lambda v: tree.make_tree_verifier(v), "verifier"),
    ("spectr.resolve_verifier", None, _spectr_resolve, "verifier"),
    ("block.make_verifier", None, _block_make_verifier, "verifier"),
    ("block.expected_length", None, lambda v: _block_expected_length(v), "verifier"),
    ("alpha_k.method", otspec.alpha_k, lambda v: otspec.alpha_k(P, Q, 2, method=v), "method"),
    ("optimal_verifier.method", otspec.optimal_verifier, lambda v: otspec.optimal_verifier(P, Q, 2, method=v),
     "method"),
    ("mentored.method", otspec.mentored, lambda v: otspec.mentored(P, Q, 0.1, method=v), "method"),
]


@pytest.mark.parametrize("label", [g[0] for g in GETTERS])
@pytest.mark.parametrize("bad", ["k-seqq", 3])
def test_a_getter_names_its_parameter_as_its_signature_spells_it(label, bad):
    _, fn, call, param = next(g for g in GETTERS if g[0] == label)
    if fn is None:
        import otspec.block as blk
        import otspec.spectr as spt

        fn = {"block.make_verifier": blk.make_verifier, "block.expected_length": blk.expected_length,
              "spectr.resolve_verifier": spt.resolve_verifier}[label]
    assert param in inspect.signature(fn).parameters
    with pytest.raises((ValueError, TypeError)) as info:
        call(bad)
    assert f"`{param}`" in str(info.value), str(info.value)


def test_get_verifier_names_name_and_the_tree_getter_keeps_verifier():
    with pytest.raises(ValueError, match=r"^`name` must be one of .*got 'k-seq' \(did you mean 'kseq'\?\)"):
        otspec.get_verifier("k-seq")
    with pytest.raises(TypeError, match=r"^`name` must be one of .*got int$"):
        otspec.get_verifier(3)
    with pytest.raises(ValueError, match=r"^`name` must be one of .*'kseq' is registered but is a token-level"):
        otspec.get_verifier("kseq", kind="tree")
    with pytest.raises(ValueError, match=r"^`verifier` must be one of .*'kseq' is registered but is a token-level"):
        tree.make_tree_verifier("kseq")


# ------------------------------------------------------------------------------------------------- 3. seed_for
def test_seed_for_of_python_values_is_unchanged():
    """The digests of main a3dbc22 (recorded results and hypothesis reruns depend on them)."""
    assert testing.seed_for(3) == 3820372412057981123
    assert testing.seed_for(True) == 5240368430241660447
    assert testing.seed_for(0.5) == 304885659468788545
    assert testing.seed_for(True) != testing.seed_for(1)  # a bool is a part of its own, as it always was


@pytest.mark.parametrize(("scalar", "value"), [
    (np.int64(3), 3), (np.int32(3), 3), (np.uint8(3), 3), (np.int16(-2), -2), (np.uint64(2**64 - 1), 2**64 - 1),
    (np.float64(0.1), 0.1), (np.float32(0.5), 0.5), (np.float16(0.25), 0.25), (np.float32(0.1), float(np.float32(0.1))),
    (np.bool_(True), True), (np.bool_(False), False), (np.str_("a"), "a"), (np.bytes_(b"a"), b"a"),
])
def test_seed_for_of_a_numpy_scalar_is_that_of_the_python_value(scalar, value):
    assert scalar == value
    assert testing.seed_for(scalar) == testing.seed_for(value)
    assert testing.seed_for(P, scalar, 2) == testing.seed_for(P, value, 2)
    assert testing.seed_for((scalar, "x")) == testing.seed_for((value, "x"))


# --------------------------------------------------------------------------------------------- 4. bool laws
def test_a_law_of_booleans_is_refused_on_both_routes_with_its_name():
    b, half = np.array([True, False]), np.array([0.5, 0.5])
    for args, name in (((b, half), "p"), ((half, b), "q")):
        with pytest.raises(TypeError, match=rf"^`{name}` must hold real numbers, got dtype bool$"):
            otspec.alpha_k(*args, 2)
        with pytest.raises(TypeError, match=rf"^`{name}` must hold real numbers, got dtype bool$"):
            otspec.alpha_k(*(a[None] for a in args), 2)  # the batched route: the same words
    with pytest.raises(TypeError, match=r"`p` must hold real numbers, got dtype bool"):
        otspec.kseq([True, False], half, 2)  # a list of bools too
    assert otspec.alpha_k(np.array([1.0, 0.0]), half, 2) == 0.5  # the same values as floats: accepted


def test_every_law_taking_function_refuses_booleans_by_name():
    pytest.importorskip("torch")  # the audit's tables live in a module that needs torch
    from tests.test_audit_inputs_bx import ARRAY_FUNCTIONS, LAWS, PAIR_FUNCTIONS, PAIR_NAMES

    problems = []
    for name, fn in PAIR_FUNCTIONS.items():
        names = PAIR_NAMES.get(name, ("p", "q"))
        for i, x in enumerate((P, Q)):
            args = [P, Q]
            args[i] = x == x.max()
            try:
                fn(*args)
                problems.append(f"{name} ({names[i]}): accepted booleans")
            except TypeError as exc:
                if f"`{names[i]}`" not in str(exc):
                    problems.append(f"{name}: {exc}")
            except Exception as exc:  # noqa: BLE001 - anything else is the finding
                problems.append(f"{name}: {type(exc).__name__}: {exc}")
    for name in sorted(LAWS):
        fn, x0, param = ARRAY_FUNCTIONS[name]
        try:
            fn(x0 == x0.max())
            problems.append(f"{name}: accepted booleans")
        except TypeError as exc:
            if f"`{param}`" not in str(exc):
                problems.append(f"{name}: {exc}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------- 5. toy_pair
@pytest.mark.parametrize(("args", "kwargs", "exc", "match"), [
    ((2**63,), {}, ValueError, r"`vocab_size` must be at most MAX_TOY_VOCAB = 8192 .*got 9223372036854775808"),
    ((10**5,), {}, ValueError, r"`vocab_size` must be at most MAX_TOY_VOCAB = 8192 .*got 100000"),
    ((1,), {}, ValueError, r"`vocab_size` must be an integer >= 2, got 1"),
    (("6",), {}, TypeError, r"`vocab_size` must be an integer, got str"),
    ((6.0,), {}, TypeError, r"`vocab_size` must be an integer, got the float 6.0"),
    ((True,), {}, TypeError, r"`vocab_size` must be an integer, got bool"),
    ((6,), {"seed": -1}, ValueError, r"`seed` must be a non-negative integer seed, got -1"),
    ((6,), {"seed": 1.5}, TypeError, r"`seed` must be an integer seed, got float"),
    ((6,), {"seed": "1"}, TypeError, r"`seed` must be an integer seed, got str"),
    ((6,), {"closeness": 0}, ValueError, r"`closeness` must lie in \(0, 1\], got 0"),
    ((6,), {"closeness": 1.5}, ValueError, r"`closeness` must lie in \(0, 1\], got 1.5"),
    ((6,), {"closeness": float("nan")}, ValueError, r"`closeness` must lie in \(0, 1\], got nan"),
    ((6,), {"closeness": "0.5"}, TypeError, r"`closeness` must be a real number, got str"),
    # (1 - c) / c overflows the draft's logits to infinities below the smallest closeness the command line takes
    ((6,), {"closeness": 1e-320}, ValueError, r"`closeness` must be at least MIN_TOY_CLOSENESS = 1e-300, got 1e-320"),
])
def test_toy_pair_refuses_bad_input_by_name_before_allocating(monkeypatch, args, kwargs, exc, match):
    from otspec.profile import toy_pair

    monkeypatch.setattr(np.random, "default_rng", lambda *a, **k: pytest.fail("drew before the checks"))
    with pytest.raises(exc, match=match):
        toy_pair(*args, **kwargs)


def test_toy_pair_at_the_smallest_closeness_has_finite_laws():
    from otspec.__main__ import MIN_TOY_CLOSENESS as cli_min
    from otspec.profile._toy import MIN_TOY_CLOSENESS, toy_pair

    assert cli_min == MIN_TOY_CLOSENESS        # the command line's toy models take the function's own limit
    d, _ = toy_pair(6, closeness=MIN_TOY_CLOSENESS)
    assert np.isfinite(d.fn.table).all()


def test_toy_pair_of_numpy_integers_is_the_pair_of_the_ints():
    from otspec.profile import toy_pair

    a, b = toy_pair(np.int64(5), seed=np.uint8(3), closeness=np.float64(0.25)), toy_pair(5, seed=3, closeness=0.25)
    for x, y in zip(a, b):
        assert x.name == y.name and x.vocab_size == y.vocab_size == 5
        assert np.array_equal(x.fn.table, y.fn.table)


# --------------------------------------------------------------------------------- 6. received values in messages
E3 = np.array([[[1.0, 0.5, 0.25], [1.0, 0.25, 0.125], [1.0, 0.5, 0.0]]])  # (n_texts, T, L + 1)
E3_BAD = E3.copy()
E3_BAD[0, 1, 1] = -0.25
LOG_Q = np.log(np.array([[0.5, 0.25, 0.5]]))


def _starts(e, log_q):
    from otspec.profile import starts_recursion

    return starts_recursion(e, log_q)


@pytest.mark.parametrize(("call", "exc", "match"), [
    (lambda: otm.uncovered_prefixes(np.array([0.5, 0.25, 0.25]), 2, step=0), ValueError, r"`step` .*got 0$"),
    (lambda: otm.uncovered_prefixes(np.array([0.5, 0.25, 0.25]), 2, step="a"), TypeError, r"`step` .*got str$"),
    (lambda: otm.uncovered_prefixes(np.array([0.5, 0.25, 0.25]), 0), ValueError, r"`k` .*got 0$"),
    (lambda: otm.uncovered_prefixes(np.array([0.5, -0.125]), 2), ValueError, r"`p_sorted` .*got -0.125 at index 1$"),
    (lambda: otm.uncovered_prefixes(np.array([0.5, np.nan]), 2), ValueError, r"`p_sorted` .*got nan at index 1$"),
    (lambda: otm.uncovered_prefixes(np.array([[0.5]]), 2), ValueError, r"`p_sorted` .*got shape \(1, 1\)$"),
    (lambda: testing.chi2_gof([1, -2, 3], [0.2, 0.3, 0.5]), ValueError, r"`counts` .*got -2 at index 1$"),
    (lambda: testing.chi2_gof([1, 2.5, 3], [0.2, 0.3, 0.5]), ValueError, r"`counts` .*got 2.5 at index 1$"),
    (lambda: testing.chi2_gof([1, np.nan, 3], [0.2, 0.3, 0.5]), ValueError, r"`counts` .*got nan at index 1$"),
    (lambda: testing.chi2_gof([1.0, 2.0, 3.0], [0.2, 0.3, 0.5]), ValueError,
     r"`counts` .*got whole numbers of dtype float64 \(cast them to int\)$"),
    (lambda: testing.chi2_gof([1, 2, 3, 4], [0.2, 0.3, 0.5]), ValueError, r"`counts` .*got \(4,\)$"),
    (lambda: testing.processed_law([0.5, np.nan]), ValueError, r"`logits` .*got nan at index 1$"),
    (lambda: testing.processed_law([-np.inf, -np.inf]), ValueError, r"`logits` .*got all 2 -inf$"),
    (lambda: otspec.min_cut(P, Q, [1, 2]), TypeError, r"`k` must be a single integer .*got a sequence of 2$"),
    (lambda: otspec.speculative.expected_acceptance(np.zeros((0, 2)), np.zeros((0, 2))), ValueError,
     r"`p` and `q` must hold at least one context, got shape \(0, 2\)$"),
    (lambda: _starts(E3_BAD, LOG_Q), ValueError, r"`e` must be finite and non-negative, got -0.25 at index \(0, 1, 1\)$"),
    (lambda: _starts(E3, np.array([[0.0, -np.inf, 0.0]])), ValueError, r"`log_q` .*got -inf at index \(0, 1\)$"),
])
def test_a_message_states_what_came(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("which", ["p_y", "q_y"])
@pytest.mark.parametrize(("bad", "shown"), [(-0.5, r"-0.5 at index \(0, 1\)"), (1.5, r"1.5 at index \(0, 1\)"),
                                            (np.inf, r"inf at index \(0, 1\)")])
def test_p_y_and_q_y_messages_state_the_entry(which, bad, shown):
    from otspec.profile import emission_probs_from_token_probs

    good = np.array([[0.25, 0.5, 0.125]])
    x = good.copy()
    x[0, 1] = bad
    args = {"p_y": x, "q_y": good} if which == "p_y" else {"p_y": good, "q_y": x}
    with pytest.raises(ValueError, match=rf"^`{which}` must hold probabilities in \[0, 1\], got {shown}$"):
        emission_probs_from_token_probs("token", args["p_y"], args["q_y"], L=2)


def test_uncovered_prefixes_takes_a_numpy_step_as_its_value():
    p = np.array([0.5, 0.25, 0.25])
    assert np.array_equal(otm.uncovered_prefixes(p, 2, step=np.float32(0.5)), otm.uncovered_prefixes(p, 2, step=0.5))
    assert np.array_equal(otm.uncovered_prefixes(p, 2, step=1), otm.uncovered_prefixes(p, 2, step=1.0))


def test_validate_distribution_out_states_what_came():
    from otspec._validation import validate_distribution

    for out, got in ((np.zeros(2, np.float32), "a 1-D float32 ndarray"), (np.zeros(4)[::2], "a strided 1-D float64"),
                     ([0.0, 0.0], "list")):
        with pytest.raises(TypeError, match=rf"^`out` must be a writable C-contiguous 1-D float64 ndarray, got {got}"):
            validate_distribution([0.5, 0.5], "p", out=out)


def test_first_bad_entry():
    from otspec._validation import first_bad_entry

    x = np.array([[0.5, -1.0], [np.nan, 2.0]])
    assert first_bad_entry(x, x < 0) == "-1.0 at index (0, 1)"
    assert first_bad_entry(x, np.isnan(x)) == "nan at index (1, 0)"
    assert first_bad_entry(np.array([1, 2, 3]), np.array([False, False, True])) == "3 at index 2"
    assert first_bad_entry(np.array([1.0]), np.array([False])) == "no such entry"


# ------------------------------------------------------------------------------------- 7-8. shards and manifests

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("pyarrow")
    pytest.importorskip("torch")
    from otspec.profile import profile, toy_pair

    out = tmp_path_factory.mktemp("cb") / "run"
    d, t = toy_pair(5, seed=4)
    profile([[0, 1], [2, 3, 4], [1], [3, 0]], out=out, draft=d, target=t, k_max=2, L_max=2, max_new_tokens=3,
            verifiers=["token"], families=["token", "kseq"], subsample=1, shard_size=2, progress=False)
    return out


def _copy(run, tmp_path, name="v"):
    out = tmp_path / name
    shutil.copytree(run, out)
    return out


@pytest.mark.parametrize(("column", "expected"), [("k", "int16"), ("value", "double"), ("prompt", "int32")])
def test_a_shard_column_of_numbers_as_text_is_refused_by_file_and_column(run, tmp_path, column, expected):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otspec.profile import read_table, summarize

    out = _copy(run, tmp_path)
    path = out / "shard-00001.parquet"
    t = pq.read_table(path)
    i = t.column_names.index(column)
    t = t.set_column(i, column, pa.array([str(v) for v in t[column].to_pylist()], type=pa.string()))
    assert t[column].cast(pq.read_table(run / "shard-00001.parquet")[column].type).equals(
        pq.read_table(run / "shard-00001.parquet")[column])  # the text holds the very numbers: a cast would pass
    pq.write_table(t, path)
    match = (rf"^shard '.*shard-00001\.parquet' does not hold a profile's rows: its column `{column}` holds string, "
             rf"expected {expected}$")
    with pytest.raises(ValueError, match=match):
        read_table(out)
    with pytest.raises(ValueError, match=match):
        summarize(out, n_boot=20)


def test_a_shard_of_other_numeric_types_is_still_read(run, tmp_path):
    """Numbers of another width (an int64 ``k``, a float32 ``value`` of exact values) are cast as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otspec.profile import read_table

    out = _copy(run, tmp_path)
    path = out / "shard-00000.parquet"
    t = pq.read_table(path)
    t = t.set_column(t.column_names.index("k"), "k", t["k"].cast(pa.int64()))
    pq.write_table(t, path)
    assert read_table(out).equals(read_table(run))


def _format_1(run, tmp_path):
    out = _copy(run, tmp_path, "old")
    man = json.loads((out / "manifest.json").read_text())
    man["format"] = 1  # as written before the fingerprints: no fingerprints, skipped, positions, machine
    for m in man["models"].values():
        del m["fingerprint"]
    for key in ("skipped", "positions", "machine"):
        man.pop(key, None)
    (out / "manifest.json").write_text(json.dumps(man))
    return out


def test_a_format_1_run_is_summarised_with_a_note_of_what_it_lacks(run, tmp_path):
    from otspec.profile import summarize, write_report
    from otspec.profile._store import OldManifestWarning, read_manifest

    old = _format_1(run, tmp_path)
    with pytest.warns(OldManifestWarning) as caught:
        s = summarize(old, n_boot=40, seed=1)
    msg = str(caught[0].message)
    assert re.match(rf"^'{re.escape(str(old / 'manifest.json'))}' is a run of manifest format 1 \(this otspec "
                    r"writes format 2\): it has no models' fingerprints \(it cannot be resumed", msg), msg
    assert "no skipped" in msg and "no positions" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the current format: no note
        new = summarize(run, n_boot=40, seed=1)
        read_manifest(run)
    for key in new.tokens_per_call:
        assert new.tokens_per_call[key].value == s.tokens_per_call[key].value
    with pytest.warns(OldManifestWarning):
        report = write_report(old, figures=False, n_boot=40)
    assert report.is_file()


@pytest.mark.parametrize(("fmt", "match"), [
    (3, r"of format 3, which this otspec .* cannot read: it reads formats 1 to 2; summarise it with the newer otspec"),
    ("2", r"of format '2', which this otspec .* cannot read: .* the file is damaged"),
    (True, r"of format True, which this otspec .* cannot read"),
    (0, r"of format 0, which this otspec .* cannot read"),
])
def test_a_manifest_of_an_unknown_format_is_refused_by_file_and_format(run, tmp_path, fmt, match):
    from otspec.profile import summarize

    out = _copy(run, tmp_path)
    man = json.loads((out / "manifest.json").read_text())
    man["format"] = fmt
    (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ValueError, match=rf"^'.*manifest\.json' is a profile manifest {match}"):
        summarize(out, n_boot=20)


def test_manifest_note_lists_only_what_is_absent():
    from otspec.profile._store import manifest_note

    assert manifest_note({"format": 2, "models": {}}) is None
    assert manifest_note({"settings": {}}) is None
    full = {"format": 1, "models": {"draft": {"fingerprint": {}}, "target": {"fingerprint": {}}}, "skipped": {},
            "positions": {}}
    assert manifest_note(full) is None
    part = dict(full, models={"draft": {"fingerprint": {}}, "target": {}})
    note = manifest_note(part)
    assert "models' fingerprints" in note and "no skipped" not in note
