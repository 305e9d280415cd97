"""Sphinx configuration for otspec (built with -W: warnings are errors)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "otspec"
author = "otspec developers"
copyright = "2026, otspec developers"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.doctest",
    "numpydoc",
]

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
autodoc_typehints = "none"
autodoc_member_order = "bysource"
exclude_patterns = ["_build"]
html_theme = "alabaster"
nitpicky = False
suppress_warnings = []
