"""Time the README's four tasks ("Four things you can do in five minutes") as a new user runs them.

Each fenced ```python block of README.md runs as its own script in a fresh process (interpreter
start and ``import otspec`` included), in an empty temporary directory, with this checkout on
PYTHONPATH. Run it from a fresh clone: the first run of each block is cold (no bytecode cache of
the clone yet), the second warm.

    python experiments/time_readme_tasks.py            # prints a Markdown table
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["exact optimal acceptance", "the papers' figures", "property-based validity tests",
         "an LP-optimal verifier in a small decoder"]


def main() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    print(f"{len(blocks)} blocks; python {sys.version.split()[0]}; {os.cpu_count()} CPUs\n")
    print("| task | cold run (s) | warm run (s) | printed |")
    print("|---|---|---|---|")
    for i, src in enumerate(blocks):
        times, out = [], ""
        for _ in range(2):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                res = subprocess.run([sys.executable, "-c", src], cwd=tmp, env=env, capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
            if res.returncode != 0:
                raise SystemExit(f"block {i + 1} failed:\n{res.stderr}")
            out = " / ".join(line.strip() for line in res.stdout.splitlines())
        name = TASKS[i] if i < len(TASKS) else f"block {i + 1}"
        print(f"| {i + 1}. {name} | {times[0]:.1f} | {times[1]:.1f} | {out or '(nothing)'} |")


if __name__ == "__main__":
    main()
