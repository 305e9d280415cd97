"""Load a script of experiments/ as a module, for tests of its functions (the folder is no package)."""

import importlib.util
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def load_experiment(name: str):
    """The module ``experiments/<name>.py``, freshly executed."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
