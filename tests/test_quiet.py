"""Nothing prints unless asked: no HiGHS banner at the first LP of a process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

import otspec
from otspec.otm._highs import new_highs

ROOT = Path(__file__).resolve().parents[1]


def test_the_first_lp_of_a_process_prints_nothing():
    # a fresh process: highspy prints its banner once per process, at the first instance
    code = "import numpy as np, otspec; otspec.otm_lp(np.array([.5, .5]), np.array([.2, .8]), 2)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and out.stderr == ""


def test_no_banner_is_captured_in_process(capfd):
    res = otspec.otm_lp(np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6]), 2)
    new_highs().run()  # an empty model, run: still silent
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    np.testing.assert_allclose(res.alpha, 0.76, atol=1e-9)
