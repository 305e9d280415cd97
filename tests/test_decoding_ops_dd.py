"""The decoders' device routes issue a bounded number of aten ops and host reads per iteration outside the forwards.

On an accelerator a small pair's iteration outside its forward passes is launches (an eager kernel each, about
5-10 us) and synchronising host reads (20-50 us each). Both are counted here on CPU tensors taking the route an
accelerator takes (``engine="torch"`` with ``read_on_host`` off, the draws by CUDA's exponential race), every aten
op dispatched outside the models' forwards and the laws' softmax (views left out: no launch), and every host read
(``aten._local_scalar_dense`` and the Python calls that copy a tensor to the host), per target call
(``experiments/bench_decode_ops.py``). The tiny random pair (V = 64), one prompt, 20 new tokens, seed 0: the
decodes, hence the counts, are deterministic.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import bench_decode_ops as O  # noqa: E402

sys.path.remove(str(ROOT / "experiments"))

TOKENS = 20

#: (aten ops, host reads) per iteration, at most: measured (after) 46.43 / 1.286 (speculative sampling, L = 2),
#: 57.40 / 1.400 (L = 4), 146.00 / 1.500 (one-step block verification, L = 4), 221.16 / 1.263 (EAGLE-2 4,4,16),
#: 102.11 / 1.158 (top-k branching(2,2)), 110.75 / 1.375 (i.i.d. SpecInfer), 159.86 / 1.429 (without replacement,
#: Sequoia). The code before fails every op pin (53.86, 66.80, 165.50, 257.42, 122.47, 127.38, 180.71: 7 to 36 ops
#: over) and Sequoia's read pin (3.286: the kept roots' two laws read one at a time, 2 reads per root, now 8 roots a
#: copy). The reads above 1 are the decode's own, not the loop's: the seed drawn once from ``rng``, the logged
#: predictions read after the loop (once per tree shape drafted, and the i.i.d. tree's optima), over few
#: iterations here.
PINS = {
    "token L=2": (46.5, 1.29),
    "token L=4": (57.5, 1.40),
    "block-onestep L=4": (146.0, 1.50),
    "eagle2:4,4,16": (221.5, 1.27),
    "topk:branching(2,2)": (102.5, 1.16),
    "iid:branching(2,2):specinfer": (111.0, 1.38),
    "wor:branching(2,2):sequoia": (160.0, 1.43),
}


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    target, draft, prompts = O.pair("tiny")
    return target, draft, prompts[:1]


@pytest.mark.parametrize("decoder", list(PINS))
def test_ops_and_host_reads_per_iteration(pair, decoder):
    target, draft, prompts = pair
    got = O.count(target, draft, prompts, decoder, TOKENS)
    ops, reads = PINS[decoder]
    assert got["aten"] <= ops, (decoder, got["aten"], sorted(got["ops"].items(), key=lambda kv: -kv[1])[:8])
    assert got["reads"] <= reads, (decoder, got["reads"])
    # the loop's own reads: one per iteration (the decision and the emitted tokens together); the decode's few
    # others at most 5: the seed, and after the loop the logged predictions, one read per tree shape drafted (the
    # last iterations draft shortened trees: EAGLE-2 4,4,16 reads 4 there) -- a read per iteration more fails
    assert got["reads"] * got["iterations"] <= got["iterations"] + 5, (decoder, got["reads"], got["iterations"])


def test_counts_see_the_ops_and_reads_they_must():
    """The counter itself: an op outside the forwards is counted, a view is not, a ``tolist`` of one element is
    one read (not two: its ``_local_scalar_dense`` inside is the same read), and nothing inside a paused call."""
    c = O.Counts()
    x = torch.arange(6.0)
    with O.paused_forwards(c):
        y = x + 1.0  # one op
        y.view(2, 3)  # a view: none
        y[:1].tolist()  # one read
        int(y[2])  # one read
    assert (c.aten, c.reads) == (1, 2), (c.aten, c.reads, c.ops)
