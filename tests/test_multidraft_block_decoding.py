"""speculative_decode with the multi-draft block verifiers ("multidraft-plan", "multidraft-one-token").

On a toy pair with V = 3, L = 2, k = 2: the first L + 1 tokens follow the target's exact law (chi-square,
false-failure rate 1e-4 per test) and the accepted length of the first iteration has the verifier's exact
mean (z-test, |z| < 4: false-failure rate about 6e-5); V**L above the limit is refused before any model call.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import otspec  # noqa: E402
import otspec.decoding as D  # noqa: E402
import otspec.profile._settings  # noqa: E402
from otspec.decoding._verifiers import MULTIBLOCK_MAX_BLOCKS  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from tests.toy_lm import toy_target_draft  # noqa: E402

ALPHA_FAIL = 1e-4
V, L, K = 3, 2, 2
PROMPT = [1, 2]
NAMES = ("multidraft-plan", "multidraft-one-token")


@pytest.fixture(scope="module")
def pair():
    return toy_target_draft(V, seed=0)


class _After:
    """otspec.models.Model view of a CallableLM after PROMPT (an independent route: direct logits)."""

    def __init__(self, lm):
        self.lm, self.vocab_size = lm, V

    def next_dist(self, prefix):
        logits = D.next_token_logits(self.lm, [PROMPT + list(prefix)])
        return torch.softmax(torch.as_tensor(logits, dtype=torch.float64).reshape(-1), 0).numpy()


def test_registry_lookup():
    for name, cls in zip(NAMES, (otspec.block.MultiDraftPlanVerifier, otspec.block.OneTokenVerifier)):
        spec = otspec.get_verifier(name)
        assert spec.kind == "block" and spec.build_multi is cls and not spec.single_draft
        assert name in D.VERIFIER_NAMES or name in otspec.decoding._verifiers.decoding_names()
    with pytest.raises(ValueError, match="did you mean 'multidraft-plan'"):
        otspec.get_verifier("multidraft-plam")
    assert "multidraft-plan" not in otspec.block.VERIFIERS  # not a single-block BlockVerifier
    from otspec.decoding._verifiers import resolve_scheme

    s = resolve_scheme(otspec.block.OneTokenVerifier, k=2, options=None, vocab_size=V)  # the class means its name
    assert (s.name, s.kind, s.lossless) == ("multidraft-one-token", "multiblock", True)
    assert "multidraft-plan" not in otspec.profile._settings.families()  # cannot run at a real vocabulary


# the one-token verifier re-solves its LP at every iteration (13 s for 800 decodes): `make test-slow`
@pytest.mark.parametrize("name", [NAMES[0], pytest.param(NAMES[1], marks=pytest.mark.slow)])
def test_lossless_and_mean_length(pair, name):
    target, draft = pair
    ver = otspec.get_verifier(name).build_multi(_After(draft), _After(target), L, K)
    law_tau = ver.tau_law()
    mean, var = float(law_tau @ np.arange(L + 1)), float(law_tau @ np.arange(L + 1) ** 2)
    var -= mean**2
    cells, law = D.exact_prefix_law(target, PROMPT, L + 1)
    idx = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells), dtype=np.int64)
    n = 800
    taus = np.empty(n)
    gen = torch.Generator().manual_seed(3)
    for i in range(n):
        r = D.speculative_decode(PROMPT, draft=draft, target=target, verifier=name, k=K, L=L,
                                 max_new_tokens=L + 1, rng=gen)
        counts[idx[tuple(r.tokens.tolist())]] += 1
        taus[i] = r.accepted[0]
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed
    z = (taus.mean() - mean) / math.sqrt(var / n)
    assert abs(z) < 4, (taus.mean(), mean, z)


def test_refused_before_any_model_call():
    calls = []

    def fn(ids):
        calls.append(1)
        return torch.zeros(ids.shape + (V,), dtype=torch.float64)

    lm = D.CallableLM(fn, V)
    L_big = 1 + int(math.log(MULTIBLOCK_MAX_BLOCKS, V))  # V**L_big > the limit
    for name in NAMES:
        with pytest.raises(ValueError, match=r"V\*\*L"):
            D.speculative_decode(PROMPT, draft=lm, target=lm, verifier=name, k=K, L=L_big, max_new_tokens=4)
    with pytest.raises(ValueError, match="MAX_MULTIDRAFT_VARIABLES"):  # V**L = 125 but the LP over sets of 3
        D.speculative_decode(PROMPT, draft=D.CallableLM(fn, 5), target=D.CallableLM(fn, 5), verifier=NAMES[0],
                             k=3, L=3, max_new_tokens=4)
    assert not calls
