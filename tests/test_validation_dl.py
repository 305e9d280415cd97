"""Bad input at every public entry point: the gaps a systematic sweep found (task DL).

The sweep called every callable of ``otspec.__all__`` and of each subpackage's ``__all__`` (the verifiers' own
methods, the models' helpers and the decoding and profile entry points included) from one valid call, replacing
one parameter at a time by a value of a table: text, ``None``, a list of text, a dict, a complex, ``True`` /
``np.True_`` where a number is meant, a float where an int is meant, 0-d and empty arrays, NaN and infinities,
``-1``, ``0``, ``10**18``, ``2**64``, a foreign object; and, for laws, NaN / negative / infinite entries, a sum
off 1, a second axis, another length, booleans, text, object arrays and torch tensors. Each call had to end in
the answer or in a ``ValueError`` / ``TypeError`` whose message names the parameter -- in bounded time, without a
warning and without changing its inputs.

Every row below failed on the start commit 1dbd806 (another exception, an unnamed message, an answer from an
input that is no valid value, a hang or a MemoryError); each class was fixed once, in a shared check:

* a string option given an array (``method=np.array([])``, ``process=...``, ``kind=...``, ``scheme=...``,
  ``top_p_rule=...``) was numpy's "truth value of an empty array is ambiguous": names are now checked by
  :func:`otspec._registry.validate_name` (a TypeError for what is no string, never compared);
* ``verifier_names(kind="tokens")`` listed no verifier and ``get_verifier("kseq", kind=3)`` blamed ``name``:
  ``kind`` is checked against the registry's kinds;
* a 0-d array where a sequence is meant (``initial``, ``tables``, ``drafts``, ``block``, ``keys``, ``paths``,
  ``context``, ``prefixes``) has ``__len__`` but ``len()`` raises: :func:`otspec._validation.sequence_like`;
  ``TableModel({...})`` was a KeyError;
* ``testing.sample_size(tv, law=10**18)`` (an int law is the uniform law on that many cells) was a MemoryError:
  at most ``MAX_UNIFORM_CELLS``; ``max_new_tokens=10**18`` ran until interrupted: at most
  ``decoding.MAX_NEW_TOKENS``; ``decoding.check_lossless(n_runs=2**64)`` an OverflowError: at most ``MAX_RUNS``;
  ``emission_probs_from_token_probs(L=10**18)`` numpy's "array is too big": at most ``MAX_EMISSION_L``;
* ``kseq_beta(rho=np.True_)`` and ``lenience_curve(ls=True)`` computed with 1.0; ``kseq(rho=np.array([]))`` was
  numpy's TypeError;
* ``processed_law(temperature=2**64)`` (a valid temperature) was ``np.isfinite``'s TypeError
  (:func:`otspec._validation.finite_real`); ``transformers_keep_mask`` checked nothing (a list: AttributeError,
  ``top_k=0``: IndexError, ``temperature=nan``: an empty mask);
* torch seeds of ``2**64`` and above were torch's "Overflow when unpacking long long";
* the models' size helpers (``check_enumeration``, ``size_exceeds``, ``check_length``, ``validate_sequence``,
  ``next_law``) compared what they were given (``"x" < 3``, ``math.log2(0)``);
* ``GreedyBlockVerify(tie_break=...)`` compared an array, ``register_verifier(replace="no")`` replaced (truthiness),
  and a tree verifier's node laws given text, a dict or complex numbers ended in numpy's or float()'s errors (or a
  ComplexWarning and the real part);
* messages that named another function's parameter: ``lenience_curve`` (``l`` for ``ls``),
  ``spectr.draft_selection`` (``tokens`` for ``drafts``), ``block.level_alphas`` (``length`` for ``L``),
  ``spectr.optimal_block_efficiency`` (``max_enum`` for ``max_variables``).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

import otspec
from otspec import block, models, otm, spectr, testing, tree
from otspec import multidraft as md
from otspec._registry import validate_name
from otspec._validation import TORCH_SEEDS, finite_real, sequence_like, validate_seed
from tests.probe import run_probes

P = np.array([0.5, 0.25, 0.25])
Q = np.array([0.25, 0.25, 0.5])
D3, T3 = models.MemorylessModel(P), models.MemorylessModel(Q)
SHAPE = tree.TreeShape.from_paths([(0,), (1,), (0, 0), (1, 0)])
TREE = tree.DraftTree.from_paths([(0,), (1,), (0, 2)])
E0 = np.array([])  # an empty array where a name or a number is meant
Z0 = np.array(2)  # a 0-d array where a sequence is meant
SECONDS = 5.0


def _snapshot(v):
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.shape, v.tobytes() if v.dtype != object else repr(v))
    if isinstance(v, (list, tuple, dict)):
        return repr(v)
    return None


def _refused(fn, kwargs, exc, pattern):
    """``fn(**kwargs)`` raises ``exc`` matching ``pattern`` within SECONDS, warns nothing, changes no input."""
    before = {k: _snapshot(v) for k, v in kwargs.items()}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning / DeprecationWarning on the way is a failure
        with pytest.raises(exc, match=pattern):
            fn(**kwargs)
    assert time.perf_counter() - t0 < SECONDS
    assert {k: _snapshot(v) for k, v in kwargs.items()} == before


# (id, callable, kwargs, the bad parameter, expected exception, regex of the message); each row failed at 1dbd806
ROWS = [
    # names given arrays (numpy's "truth value of an empty array is ambiguous")
    ("mentored.method", otspec.mentored, dict(p=P, q=Q, D=0.1, method=E0), "method", TypeError, "`method`"),
    ("mentored.method.str", otspec.mentored, dict(p=P, q=Q, D=0.1, method="bisect"), "method", ValueError,
     r"`method` must be one of \('exact', 'bisection'\)"),
    ("alpha_k_without_replacement.method", otm.alpha_k_without_replacement, dict(p=P, q=Q, k=2, method=E0),
     "method", TypeError, "`method`"),
    ("tree.value.process", tree.value, dict(shape=SHAPE, draft=D3, target=T3, process=E0, verifier="sequoia"),
     "process", TypeError, "`process` must be one of"),
    ("tree.enumerate_trees.process", tree.enumerate_trees, dict(shape=SHAPE, draft=D3, process=E0), "process",
     TypeError, "`process`"),
    ("tree.sample_tree.process", tree.sample_tree, dict(shape=SHAPE, draft=D3, process=E0, rng=0), "process",
     TypeError, "`process`"),
    ("tree.optimum.process", tree.optimum, dict(shape=SHAPE, draft=D3, target=T3, process=E0), "process",
     TypeError, "`process`"),
    ("verifier_names.kind.array", md.verifier_names, dict(kind=E0), "kind", TypeError, "`kind`"),
    ("GreedyBlockVerify.tie_break", tree.GreedyBlockVerify, dict(tie_break=E0), "tie_break", TypeError,
     "`tie_break`"),
    ("register_verifier.replace", otspec.register_verifier, dict(spec=md.get_verifier("kseq"), replace="no"),
     "replace", TypeError, "`replace` must be a bool"),  # 1dbd806: read by truthiness (replaced)
    # a tree's node laws read as every law is read (1dbd806: numpy's "could not convert string to float",
    # float()'s TypeError for a dict, a ComplexWarning and the real part of a complex array)
    ("TraversalVerify.emission.p_nodes.text", tree.TraversalVerify().emission,
     dict(tree=TREE, p_nodes=[["a", "b", "c"]] * 4, q_nodes=np.stack([Q] * 4)), "p_nodes", TypeError,
     "`p_nodes`"),
    ("TraversalVerify.emission.q_nodes.complex", tree.TraversalVerify().emission,
     dict(tree=TREE, p_nodes=np.stack([P] * 4), q_nodes=np.stack([Q] * 4).astype(complex)), "q_nodes",
     TypeError, "`q_nodes` must be real-valued"),
    ("SpecInferVerifier.sample.p_nodes.dict", tree.SpecInferVerifier().sample,
     dict(tree=TREE, p_nodes={0: P}, q_nodes=np.stack([Q] * 4), rng=0), "p_nodes", TypeError, "`p_nodes`"),
    # the registry's kind: an unknown one listed nothing; get_verifier blamed `name`
    ("verifier_names.kind.unknown", md.verifier_names, dict(kind="tokens"), "kind", ValueError,
     r"`kind` must be one of \('token', 'block', 'tree'\) or None, got 'tokens' \(did you mean 'token'\?\)"),
    ("verifier_names.kind.int", md.verifier_names, dict(kind=3), "kind", TypeError, "`kind` .* got int"),
    ("get_verifier.kind", md.get_verifier, dict(name="kseq", kind="blocks"), "kind", ValueError, "`kind`"),
    ("get_verifier.kind.array", md.get_verifier, dict(name="kseq", kind=E0), "kind", TypeError, "`kind`"),
    # 0-d arrays and mappings where a sequence is meant
    ("MarkovModel.initial", models.MarkovModel, dict(transition=np.full((3, 3), 1 / 3), initial=Z0), "initial",
     TypeError, "`initial` must be a sequence"),
    ("TableModel.tables.dict", models.TableModel, dict(tables={0: P}), "tables", ValueError,
     "`tables` must be a non-empty sequence"),
    ("joint_from_tables.tables", models.joint_from_tables, dict(tables=Z0), "tables", TypeError, "`tables`"),
    ("joint_from_tables.tables.dict", models.joint_from_tables, dict(tables={(): P}), "tables", TypeError,
     "`tables`"),
    ("wor_draft_prob.drafts", otm.wor_draft_prob, dict(p=P, drafts=Z0), "drafts", ValueError, "`drafts`"),
    ("membership_plan.keys", otm.membership_plan, dict(keys=Z0, w=[0.5, 0.5], q=Q), "keys", TypeError, "`keys`"),
    ("tau_law_on_path.block", block.tau_law_on_path,
     dict(verifier="block", block=Z0, draft_conditionals=[P, P], target_conditionals=[Q, Q]), "block", TypeError,
     "`block` must be a sequence"),
    ("tau_law_on_path.draft_conditionals", block.tau_law_on_path,
     dict(verifier="block", block=(0, 1), draft_conditionals=Z0, target_conditionals=[Q, Q]),
     "draft_conditionals", TypeError, "`draft_conditionals`"),
    ("TreeShape.from_paths.paths", tree.TreeShape.from_paths, dict(paths=Z0), "paths", TypeError,
     "`paths` .* 0-d array"),
    ("DraftTree.from_paths.paths", tree.DraftTree.from_paths, dict(paths=Z0), "paths", TypeError, "`paths`"),
    # booleans where numbers are meant (1dbd806: read as 1.0 and 0.0, an answer from no valid input)
    ("MarkovModel.transition.bool", models.MarkovModel, dict(transition=np.array([True, False, False])),
     "transition", TypeError, "`transition` must hold real numbers"),
    ("TableModel.tables.bool", models.TableModel, dict(tables=[[True, False]]), "tables", TypeError,
     r"`tables\[0\]`"),
    ("processed_law.logits.bool", testing.processed_law, dict(logits=np.array([True, False])), "logits",
     TypeError, "`logits`"),
    ("uncovered_prefixes.p_sorted.bool", otm.uncovered_prefixes, dict(p_sorted=np.array([True, False, False]), k=2),
     "p_sorted", TypeError, "`p_sorted`"),
    ("sequoia.acceptance.bool", tree.sequoia, dict(acceptance=np.array([True, False]), n=3, depth=2),
     "acceptance", TypeError, "`acceptance`"),
    # booleans and arrays where one real number is meant
    ("kseq.rho.empty", otspec.kseq, dict(p=P, q=Q, k=2, rho=E0), "rho", TypeError,
     r"`rho` must be a real number, got an array of shape \(0,\)"),
    ("kseq.rho.1d", otspec.kseq, dict(p=P, q=Q, k=2, rho=np.array([1.5])), "rho", TypeError, "`rho`"),
    ("kseq_residual.rho.empty", otspec.kseq_residual, dict(p=P, q=Q, k=2, rho=E0), "rho", TypeError, "`rho`"),
    ("kseq_beta.rho.np_bool", otspec.kseq_beta, dict(p=P, q=Q, rho=np.True_), "rho", TypeError, "`rho`"),
    ("kseq_p_acc.rho.np_bool", otspec.kseq_p_acc, dict(p=P, q=Q, k=2, rho=np.True_), "rho", TypeError, "`rho`"),
    ("kseq_beta.rho.bool_array", otspec.kseq_beta, dict(p=P, q=Q, rho=np.array([True, False])), "rho",
     TypeError, "`rho`"),
    ("lenience_curve.ls.True", otspec.lenience_curve, dict(p=P, q=Q, ls=True), "ls", TypeError, "`ls`"),
    ("lenience_curve.ls.np_True", otspec.lenience_curve, dict(p=P, q=Q, ls=[0.5, np.True_]), "ls", TypeError,
     "`ls`"),
    ("lenience_curve.ls.range", otspec.lenience_curve, dict(p=P, q=Q, ls=2.5), "ls", ValueError,
     r"`ls` must hold lenience values `l` in \(0, 1\], got 2.5 at index 0"),
    ("lenience_curve.ls.nan", otspec.lenience_curve, dict(p=P, q=Q, ls=[1.0, np.nan]), "ls", ValueError,
     "`ls` .* nan at index 1"),
    # numbers numpy cannot compare
    ("processed_law.temperature.2**64.ok", None, None, None, None, None),  # accepted: see the test below
    # the models' size helpers
    ("check_enumeration.V", models.check_enumeration, dict(V="x", length=2, limit=100), "V", TypeError, "`V`"),
    ("check_enumeration.length", models.check_enumeration, dict(V=3, length=None, limit=100), "length",
     TypeError, "`L`"),  # named as the caller names it (length_name, default "L")
    ("check_enumeration.limit", models.check_enumeration, dict(V=3, length=2, limit=-1), "limit", ValueError,
     "`max_entries` must be an integer >= 0"),
    ("size_exceeds.limit.zero", models.size_exceeds, dict(V=3, length=2, limit=0), None, None, None),  # True
    ("size_exceeds.limit", models.size_exceeds, dict(V=3, length=2, limit=-1), "limit", ValueError, "`limit`"),
    ("size_exceeds.V", models.size_exceeds, dict(V=None, length=2, limit=10), "V", TypeError, "`V`"),
    ("size_exceeds.length", models.size_exceeds, dict(V=3, length=1.5, limit=10), "length", TypeError,
     "`length`"),
    ("check_length.limit", models.check_length, dict(L=2, limit=None), "limit", TypeError, "`limit`"),
    ("check_length.limit.array", models.check_length, dict(L=2, limit=E0), "limit", TypeError, "`limit`"),
    ("validate_sequence.vocab_size", models.validate_sequence, dict(seq=(0, 1), vocab_size="3"), "vocab_size",
     TypeError, "`vocab_size`"),
    ("validate_sequence.vocab_size.zero", models.validate_sequence, dict(seq=(0, 1), vocab_size=0), "vocab_size",
     ValueError, "`vocab_size` must be an integer >= 1"),
    ("next_law.model", models.next_law, dict(model="m", prefix=(), V=3, name="draft"), "model", TypeError,
     "`draft` must be a model"),
    ("next_law.prefix", models.next_law, dict(model=D3, prefix=5, V=3, name="draft"), "prefix", TypeError,
     "`prefix`"),
    ("next_law.V", models.next_law, dict(model=D3, prefix=(), V=2.5, name="draft"), "V", TypeError, "`V`"),
    ("next_law.V.array", models.next_law, dict(model=D3, prefix=(), V=E0, name="draft"), "V", TypeError, "`V`"),
    # messages that named another function's parameter
    ("draft_selection.drafts", spectr.draft_selection, dict(draft=D3, target=T3, drafts="ab", rng=0), "drafts",
     ValueError, "`drafts` must be a non-empty"),
    ("level_alphas.L", block.level_alphas, dict(draft=D3, target=T3, L=10**18, k=2), "L", ValueError,
     r"V\*\*`L` = 3\*\*1000000000000000000"),
    ("level_bound.L", block.level_bound, dict(draft=D3, target=T3, L=2**64, k=2), "L", ValueError, "`L`"),
    ("optimal_block_efficiency.max_variables", spectr.optimal_block_efficiency,
     dict(draft=D3, target=T3, k=2, L=1, max_variables=2), "max_variables", ValueError,
     r"above `max_variables` // V=1"),
    # testing: an int law of 10**18 cells (also in the capped child below)
    ("sample_size.law", testing.sample_size, dict(tv=0.1, law=10**18), "law", ValueError,
     "`law` must be at most MAX_UNIFORM_CELLS = 10,000,000, got 1,000,000,000,000,000,000"),
    ("detectable_tv.law", testing.detectable_tv, dict(n_samples=1000, law=2**64), "law", ValueError, "`law`"),
]
ROWS = [r for r in ROWS if r[1] is not None and r[3] is not None]


@pytest.mark.parametrize("case_id, fn, kwargs, param, exc, pattern", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_refused_naming_the_parameter(case_id, fn, kwargs, param, exc, pattern):
    _refused(fn, kwargs, exc, pattern)


def test_size_exceeds_at_a_limit_of_zero():
    """``limit=0`` was ``math.log2(0)``'s domain error; every ``V**length >= 1`` exceeds it (and ``V = 1``, whose
    count is 1, too)."""
    assert models.size_exceeds(3, 2, 0) is True
    assert models.size_exceeds(1, 5, 0) is True
    assert models.size_exceeds(3, 0, 1) is False  # V**0 = 1 <= 1
    # against the exact integer where it is small (the route that decides the boundary)
    for V, length, limit in [(2, 20, 2**20), (2, 20, 2**20 - 1), (3, 5, 243), (3, 5, 242), (7, 0, 0)]:
        assert models.size_exceeds(V, length, limit) is (V**length > limit)


def test_processed_law_at_a_temperature_past_int64():
    """``temperature=2**64`` is a valid temperature (np.isfinite's TypeError before): the law of
    ``logits / 2**64``, computed independently (the logits' gaps vanish: the uniform law in float64)."""
    logits = np.array([0.1, 0.2, 0.3])
    got = testing.processed_law(logits, temperature=2**64)
    z = logits / float(2**64)
    w = np.exp(z - z.max())
    np.testing.assert_array_equal(got, w / w.sum())
    with pytest.raises(ValueError, match="`temperature`"):
        testing.processed_law(logits, temperature=10**400)  # beyond float64: no OverflowError from float()


def test_valid_values_keep_their_answers():
    """The checks refuse only what is no valid value: the neighbours of each fixed row give main's answers
    (numpy integers, a 0-d float rho, a float32 lenience grid, a tuple of paths, an int law of few cells)."""
    assert md.verifier_names(kind=None) == md.verifier_names()
    assert set(md.verifier_names(kind="token")) < set(md.verifier_names())
    assert md.get_verifier("kseq", kind="token").name == "kseq"
    assert otspec.kseq(P, Q, 2, rho=np.array(1.5)).rho == otspec.kseq(P, Q, 2, rho=1.5).rho
    assert otspec.kseq_beta(P, Q, np.array([1.0, 2.0])).tolist() == [otspec.kseq_beta(P, Q, 1.0),
                                                                       otspec.kseq_beta(P, Q, 2.0)]
    c = otspec.lenience_curve(P, Q, np.array([0.5, 1.0], dtype=np.float32))
    assert c.acceptance.tolist() == otspec.lenience_curve(P, Q, [0.5, 1.0]).acceptance.tolist()
    # an int law of m cells is the uniform law (the same answer as the array)
    assert testing.sample_size(0.1, 4) == testing.sample_size(0.1, np.full(4, 0.25))
    assert models.check_length(np.int64(3)) == 3
    assert models.validate_sequence(np.array([0, 2]), np.int64(3)) == (0, 2)
    assert models.next_law(D3, (), np.int64(3), "draft").tolist() == P.tolist()
    assert otm.wor_draft_prob(P, 0) == 0.5 and otm.wor_draft_prob(P, np.array([0, 1])) == 0.5 * 0.25 / 0.5
    assert otspec.mentored(P, Q, 0.1, method="bisection").acceptance == pytest.approx(
        otspec.mentored(P, Q, 0.1).acceptance, abs=1e-5)


def test_shared_checks():
    """The shared checks the fixes go through: names, sequences, finiteness of any real, seeds with a bound."""
    assert validate_name("lp", "method", ("exact", "lp")) == "lp"
    assert validate_name(None, "kind", ("a",), allow_none=True) is None
    with pytest.raises(TypeError, match=r"`method` must be one of \('a', 'b'\), got ndarray"):
        validate_name(np.array(["a"]), "method", ("a", "b"))  # never compared: an array holding "a" is refused too
    with pytest.raises(ValueError, match=r"got 'c'"):
        validate_name("c", "method", ("a", "b"))
    for x, want in [([1], True), ((), True), (np.zeros(2), True), (np.zeros((0, 3)), True), (Z0, False),
                    ("ab", False), (b"ab", False), (None, False), ({0: 1}, False), (5, False), (iter([1]), False)]:
        assert sequence_like(x) is want, x
    assert finite_real(2**64) and finite_real(-3) and not finite_real(10**400) and not finite_real(float("nan"))
    assert validate_seed(2**64 - 1, below=TORCH_SEEDS) == 2**64 - 1
    with pytest.raises(ValueError, match=r"`rng` must be an integer seed below 18,446,744,073,709,551,616"):
        validate_seed(2**64, below=TORCH_SEEDS)


# ------------------------------------------------------------------------------------------------------------
# the same in one child whose address space is capped: a guard that let its request through dies with
# MemoryError (or runs past the alarm) instead of refusing
# ------------------------------------------------------------------------------------------------------------
GUARDS = [
    ("sample_size.law=10**18", "testing.sample_size(0.1, 10**18)", ["`law`", "MAX_UNIFORM_CELLS"]),
    ("detectable_tv.law=10**18", "testing.detectable_tv(1000, 10**18)", ["`law`", "MAX_UNIFORM_CELLS"]),
    ("level_alphas.L=10**18", "block.level_alphas(D3, T3, 10**18, 2)", ["`L`"]),
]
SETUP = """
import numpy as np
from otspec import block, models, testing
D3, T3 = models.MemorylessModel([0.5, 0.25, 0.25]), models.MemorylessModel([0.25, 0.25, 0.5])
testing.sample_size(0.1, 3)
"""


@pytest.fixture(scope="module")
def guard_results():
    pytest.importorskip("resource")
    return run_probes(GUARDS, SETUP, alarm=2 * SECONDS)


@pytest.mark.parametrize("name, code, fragments", GUARDS, ids=[g[0] for g in GUARDS])
def test_guard_refuses_before_allocating(guard_results, name, code, fragments):
    status, msg, secs = guard_results[name]
    assert status == "refused", f"{code}: {status} {msg}"  # 1dbd806: MemoryError / numpy's "array is too big"
    for f in fragments:
        assert f in msg, msg
    assert secs < SECONDS


# ------------------------------------------------------------------------------------------------------------
# decoding (torch)
# ------------------------------------------------------------------------------------------------------------
def _decoding_rows():
    torch = pytest.importorskip("torch")
    from otspec import decoding as dec
    from otspec import profile as pr

    draft, target = pr.toy_pair(6, seed=0, closeness=0.5)
    logits = torch.tensor([[0.1, 0.2, 0.3]])
    return torch, dec, pr, draft, target, logits


def test_transformers_keep_mask_checks_its_arguments():
    torch, dec, _, _, _, logits = _decoding_rows()
    f = dec.transformers_keep_mask
    ok = dict(logits=logits, temperature=1.0, top_k=2, top_p=0.9)
    # 1dbd806: AttributeError ('list' object has no attribute 'ndim'), torch's complex UserWarning, IndexError
    # (top_k=0), RuntimeError (top_k=-1), OverflowError (temperature=2**64... accepted now: a valid number),
    # an empty mask at temperature=nan, every token kept at temperature=inf
    for param, value, exc, pattern in [
        ("logits", [0.1, 0.2], TypeError, "`logits` must be a torch tensor"),
        ("logits", np.array([0.1, 0.2]), TypeError, "`logits`"),
        ("logits", torch.tensor([1, 2, 3]), TypeError, "`logits` .* torch.int64"),
        ("logits", torch.tensor([1.0, 2.0], dtype=torch.complex64), TypeError, "`logits`"),
        ("temperature", float("nan"), ValueError, "`temperature`"),
        ("temperature", float("inf"), ValueError, "`temperature`"),
        ("temperature", -1.0, ValueError, "`temperature`"),
        ("temperature", 0.0, ValueError, "`temperature` must be > 0"),
        ("temperature", True, TypeError, "`temperature`"),
        ("temperature", "1", TypeError, "`temperature`"),
        ("temperature", np.array(0.5), TypeError, "`temperature`"),
        ("top_k", 0, ValueError, "`top_k`"),
        ("top_k", -1, ValueError, "`top_k`"),
        ("top_k", 1.5, TypeError, "`top_k`"),
        ("top_k", np.True_, TypeError, "`top_k`"),
        ("top_p", 1.5, ValueError, "`top_p`"),
        ("top_p", float("nan"), ValueError, "`top_p`"),
        ("top_p", E0, TypeError, "`top_p`"),
    ]:
        _refused(f, {**ok, param: value}, exc, pattern)
    # the valid calls give transformers' mask, as before
    assert f(torch.tensor([1.0, 0.5, 0.5, -3.0]), 1.0, None, 0.7).tolist() == [True, False, True, False]
    assert f(logits, 2**64, None, None).tolist() == [[True, True, True]]


def test_decoding_entry_points_refuse_bad_input():
    torch, dec, pr, draft, target, _ = _decoding_rows()
    rows = [
        (dec.Sampling, dict(top_p_rule=E0), TypeError, "`top_p_rule`"),
        (dec.Sampling, dict(temperature=10**400), ValueError, "`temperature`"),
        (dec.as_model, dict(lm=target, context=Z0), TypeError, "`context`"),
        (dec.next_token_logits, dict(lm=target, prefixes=5), TypeError, "`prefixes`"),
        (dec.next_token_logits, dict(lm=target, prefixes=Z0), TypeError, "`prefixes`"),
        (dec.make_rng, dict(rng=2**64), ValueError, "`rng` must be an integer seed below"),
        (dec.autoregressive_decode, dict(target=target, prompt=[1], max_new_tokens=2, eos_token_id=2.5),
         TypeError, "`eos_token_id`"),
        (dec.autoregressive_decode, dict(target=target, prompt=[1], max_new_tokens=2, eos_token_id=Z0),
         TypeError, "`eos_token_id`"),
        (dec.autoregressive_decode, dict(target=target, prompt=[1], max_new_tokens=10**18), ValueError,
         "`max_new_tokens` must be at most MAX_NEW_TOKENS"),
        (dec.autoregressive_decode, dict(target=target, prompt=[1], max_new_tokens=2, rng=2**64), ValueError,
         "`rng`"),
        (dec.speculative_decode, dict(prompt=[1], draft=draft, target=target, L=2, max_new_tokens=2**64),
         ValueError, "`max_new_tokens`"),
        (dec.exact_prefix_law, dict(target=target, prompt=[1], num_tokens=10**18), ValueError, "`num_tokens`"),
        (dec.check_lossless, dict(prompt=[1], draft=draft, target=target, n_runs=2**64), ValueError,
         "`n_runs` must be at most MAX_RUNS"),
        (dec.check_lossless, dict(prompt=[1], draft=draft, target=target, num_tokens=10**18), ValueError,
         "`num_tokens`"),
        (dec.check_lossless, dict(prompt=[1], draft=draft, target=target, L=10**18), ValueError,
         "`L` must be at most MAX_NEW_TOKENS - 1"),  # 1dbd806: the message named `max_new_tokens`
        (pr.load_prompts, dict(prompts=[[1, 2]], vocab_size="6"), TypeError, "`vocab_size`"),
        (pr.load_prompts, dict(prompts=[[1, 2]], vocab_size=0), ValueError, "`vocab_size`"),
        (pr.emission_probs_from_token_probs, dict(scheme="token", p_y=np.full((1, 2), 0.5),
                                                  q_y=np.full((1, 2), 0.5), L=10**18), ValueError,
         "`L` must be at most MAX_EMISSION_L = 1,024"),  # 1dbd806: numpy's "array is too big"
        (pr.emission_probs_from_token_probs, dict(scheme=E0, p_y=np.full((1, 2), 0.5), q_y=np.full((1, 2), 0.5),
                                                  L=2), TypeError, "`scheme`"),
    ]
    for fn, kwargs, exc, pattern in rows:
        _refused(fn, kwargs, exc, pattern)
    from otspec.decoding._loop import MAX_NEW_TOKENS
    from otspec.decoding._metrics import MAX_RUNS

    # the caps leave every documented use (profile: MAX_NEW_TOKENS = 65,536 of its own; check_lossless: 2,000 runs)
    assert MAX_NEW_TOKENS >= 2**20 and MAX_RUNS >= 10**6 and dec.make_rng(2**64 - 1).random() >= 0.0


def test_tensors_numpy_cannot_read_directly():
    """bfloat16 tensors (numpy has no such type) are read as float32 with their own epsilon, on the 1-D and the
    batched routes (1dbd806: torch's "Got unsupported ScalarType BFloat16" and numpy's "data type not inexact");
    a float32 array beside an integer one on the batched route too (np.finfo of an integer type); a tensor with
    no data (the meta device) is refused naming the parameter (1dbd806: torch's NotImplementedError)."""
    torch = pytest.importorskip("torch")
    want = otspec.kseq(P, Q, 2).acceptance()  # P, Q are exact in bfloat16 (multiples of 1/4)
    bf = torch.tensor(P, dtype=torch.bfloat16), torch.tensor(Q, dtype=torch.bfloat16)
    assert otspec.kseq(bf[0], Q, 2).acceptance() == want
    assert float(md.batched_kseq_acceptance(*bf, 2)) == pytest.approx(want, rel=1e-15)
    onehot = np.array([0, 0, 1])
    assert md.batched_kseq_acceptance(P.astype(np.float32), onehot, 2) == pytest.approx(
        md.batched_kseq_acceptance(P, onehot.astype(np.float64), 2), rel=1e-15)
    with pytest.raises(ValueError, match="`p` must sum to 1 within"):  # bfloat16's tolerance: 2 n 2**-8
        otspec.kseq(torch.tensor([0.3, 0.3, 0.3], dtype=torch.bfloat16), Q, 2)
    meta = torch.empty(3, device="meta")
    _refused(otspec.kseq, dict(p=meta, q=Q, k=2), TypeError, "`p` .* numpy cannot read")
    _refused(otspec.kseq_beta, dict(p=P, q=Q, rho=meta), TypeError, "`rho`")
