"""Every size guard refuses *before allocating* (issue 15).

The probes run in one child process whose address space is capped with
``resource.setrlimit(RLIMIT_AS)`` at what the interpreter already holds plus
``HEADROOM`` bytes (:func:`tests.probe.run_probes`): a guard that let its
request through would die with MemoryError instead of raising the ValueError
that names the parameter and the limit. Each probe must also answer within
``PROBE_SECONDS`` (a bignum ``V**L`` or an O(L) loop would not; one past twice
that is stopped and reported as a hang). docs/reliability.rst lists the same
table.
"""

from __future__ import annotations

import pytest

from tests.probe import HEADROOM, run_probes

resource = pytest.importorskip("resource")  # POSIX only

PROBE_SECONDS = 5.0

#: (name, code evaluated in the child, a fragment the message must contain)
PROBES = [
    ("otm_lp n=2000 k=2", "otspec.otm_lp(U(2000), D(2000), 2)", "MAX_LP_BYTES"),
    ("otm_lp k=10**6", "otspec.otm_lp(U(3), D(3), 10**6)", "`k`"),
    ("otm_lp_tuples k=10**6", "otspec.otm_lp_tuples(U(3), D(3), 10**6)", "`k`"),
    ("multiround k=10**12", "otspec.multiround(U(3), D(3), 10**12)", "`k`"),
    ("kseq sample_drafts k=10**9", "otspec.kseq(U(3), D(3), 10**9).sample_drafts(rng=0)", "`k`"),
    ("check_lossless k=10**12", "otspec.check_lossless(otspec.kseq(U(3), D(3), 10**12))", "`max_tuples`"),
    ("block.expected_length L=10**18", "otspec.block.expected_length(M2, T2, 10**18)", "`L`"),
    ("block.theorem1_length L=10**18", "otspec.block.theorem1_length(M2, T2, 10**18)", "`L`"),
    ("block.theorem2_length L=25", "otspec.block.theorem2_length(M2, T2, 25)", "`max_entries`"),
    ("block.ot_optimum L=10**12", "otspec.block.ot_optimum(M2, T2, 10**12)", "`max_variables`"),
    ("block.check_lossless L=10**12", "otspec.block.check_lossless(M2, T2, 10**12)", "`L`"),
    ("block.make_verifier L=10**12", "otspec.block.make_verifier(M2, T2, 10**12)", "`L`"),
    ("block verifier tau_law L=25", "otspec.block.make_verifier(M2, T2, 25).tau_law()", "`max_entries`"),
    ("bernoulli_block_length near-equal", "otspec.block.bernoulli_block_length(0.3, 0.3001, 10**15)", "`L`"),
    ("spectr.block_efficiency K=10**12", "otspec.spectr.block_efficiency(M2, T2, 10**12, 2)", "`k`"),
    ("spectr.block_efficiency L=10**12", "otspec.spectr.block_efficiency(M2, T2, 2, 10**12)", "`L`"),
    ("spectr.block_efficiency kseq K=1000",
     "otspec.spectr.block_efficiency(M2, T2, 1000, 2, verifier='kseq')", "MAX_SEQUENTIAL_WORK"),
    ("spectr.block_efficiency lp K=10**5", "otspec.spectr.block_efficiency(M2, T2, 10**5, 2)", "MAX_ENUM_CELLS"),
    ("spectr.block_efficiency lp V=6 K=60", "otspec.spectr.block_efficiency(M6, T6, 60, 2)", "`max_enum`"),
    ("spectr.decoded_law L=40", "otspec.spectr.decoded_law(M2, T2, 1, 40)", "`max_sequences`"),
    ("spectr.check_lossless L=40", "otspec.spectr.check_lossless(M2, T2, 1, 40)", "`max_sequences`"),
    ("spectr.optimal_block_efficiency K=10**6",
     "otspec.spectr.optimal_block_efficiency(M2, T2, 10**6, 2)", "max"),
    ("spectr.iid_drafts K=10**12", "otspec.spectr.iid_drafts(M2, 10**12, 2, rng=0)", "`k`"),
    ("spectr.prefix_tree_drafts", "otspec.spectr.prefix_tree_drafts(M2, (10**6, 10**6), rng=0)", "`k`"),
    ("spectr.block_efficiency_mc K=10**12",
     "otspec.spectr.block_efficiency_mc(M2, T2, 10**12, 2, n_samples=10, rng=0)", "`k`"),
    ("spectr.spectr_step L=10**12", "otspec.spectr.spectr_step(M2, T2, 2, 10**12, rng=0)", "`L`"),
    # the first position's verifier is built before the drafts are drawn (9e81b77 drew 3 * 10**5 draft tokens,
    # 2.4 s and more, before the OTM LP refused k = 10**5; 10**6 tokens ran past the alarm)
    ("spectr.spectr_step lp K=10**5", "otspec.spectr.spectr_step(M3, M3, 10**5, 3, rng=0)", "MAX_REDUCED_SIZE"),
    ("spectr.spectr_step lp K=10**6", "otspec.spectr.spectr_step(M3, M3, 10**6, 3, rng=0)", "MAX_REDUCED_SIZE"),
    ("spectr.spectr_step lp branching (10**5, 1)",
     "otspec.spectr.spectr_step(M3, M3, 10**5, 2, branching=(10**5, 1), rng=0)", "MAX_REDUCED_SIZE"),
    ("spectr.block_efficiency_mc lp K=10**5",
     "otspec.spectr.block_efficiency_mc(M3, M3, 10**5, 3, n_samples=10, rng=0)", "MAX_REDUCED_SIZE"),
    # a branching is read for at most L + 1 entries and its product is capped as it runs (9e81b77 listed a
    # range(10**12) or an endless generator: MemoryError or a hang; validated 10**5 entries and built their
    # product, a 2-million-bit integer, before refusing)
    ("spectr.block_efficiency branching=range(10**12)",
     "otspec.spectr.block_efficiency(M2, T2, 1, 10, branching=range(10**12))", "`branching`"),
    ("spectr.length_law branching=generator",
     "otspec.spectr.length_law(M2, T2, 1, 10, branching=(1 for _ in iter(int, 1)))", "`branching`"),
    ("spectr.spectr_step branching=generator",
     "otspec.spectr.spectr_step(M2, T2, 1, 10, branching=(1 for _ in iter(int, 1)), rng=0)", "`branching`"),
    ("spectr.prefix_tree_drafts range(1, 10**12)",
     "otspec.spectr.prefix_tree_drafts(M2, range(1, 10**12), rng=0)", "MAX_LENGTH"),
    ("spectr.prefix_tree_drafts [10**6] * 10**5",
     "otspec.spectr.prefix_tree_drafts(M2, [10**6] * 10**5, rng=0)", "MAX_DRAFT_TOKENS"),
    ("spectr.block_efficiency_mc branching [2] * 10**5",
     "otspec.spectr.block_efficiency_mc(M2, T2, 2, 10**5, branching=[2] * 10**5, n_samples=2, rng=0)",
     "multiply to k=2"),
    ("models.random_table_model", "otspec.models.random_table_model(2, 10**18, rng=0)", "`max_len`"),
    ("models.random_markov_model", "otspec.models.random_markov_model(2, 10**18, rng=0)", "order"),
    ("models.conditional_tables", "otspec.models.conditional_tables(M2, 10**18)", "`length`"),
    ("models.joint_law", "otspec.models.joint_law(M2, 25)", "`max_entries`"),
]

SETUP = """
import numpy as np
import otspec
import otspec.block, otspec.spectr, otspec.models
from otspec.models import MemorylessModel

def U(n):
    return np.full(n, 1.0 / n)

def D(n):
    return np.random.default_rng(0).dirichlet(np.ones(n))

M2, T2 = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])
M3 = MemorylessModel([0.5, 0.3, 0.2])
M6, T6 = MemorylessModel(U(6)), MemorylessModel(D(6))
otspec.otm_lp(U(2), D(2), 2)  # load HiGHS and scipy before the cap
otspec.spectr.block_efficiency(M2, T2, 2, 2)
otspec.spectr.block_efficiency_mc(M2, T2, 2, 2, n_samples=2, rng=0)
otspec.block.bernoulli_block_length(0.5, 0.25, 2)
"""


@pytest.fixture(scope="module")
def probe_results():
    return run_probes(PROBES, SETUP, headroom=HEADROOM, alarm=2 * PROBE_SECONDS)


@pytest.mark.parametrize("name,code,fragment", PROBES, ids=[p[0] for p in PROBES])
def test_guard_refuses_before_allocating(probe_results, name, code, fragment):
    status, msg, secs = probe_results[name]
    assert status == "refused", f"{code}: {status} {msg}"
    assert fragment in msg, msg
    assert secs < PROBE_SECONDS, f"{code} took {secs:.1f} s to refuse"


def test_guard_limits_are_stated():
    """The limits the messages cite are public constants (docs/reliability.rst's guard table)."""
    import otspec.models as models
    from otspec.spectr import _common, _exact

    assert models.MAX_LENGTH == 100_000 and models.MAX_AXES == 32
    assert _common.MAX_DRAFT_TOKENS == 10_000_000
    assert _exact.MAX_SEQUENTIAL_WORK == 30_000_000
