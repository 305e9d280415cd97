r"""Draft trees: shapes, draft processes, tree verifiers and their exact values.

A draft tree puts draft tokens on the nodes of a rooted tree whose root is
the context; one target call with a tree attention mask scores every node,
and a tree verifier accepts a root path and emits one more token. This
subpackage holds the tree types (:class:`TreeShape`, :class:`DraftTree`,
:class:`Eagle2Params`), the draft processes that fill a shape with tokens
(:func:`sample_tree`, :func:`enumerate_trees`, :func:`tree_laws`), the
per-node verifiers (SpecInfer, Sequoia, target-only, SpecTr over a tree)
with their exact laws, and :func:`value`, the exact expected number of
accepted draft tokens.

Notation: ``p`` is the draft law and ``q`` the target law at a node.
"""

from ._process import (
    DETERMINISTIC_PROCESSES,
    MAX_TREES,
    PROCESSES,
    enumerate_trees,
    sample_tree,
    tree_laws,
)
from ._tree import MAX_TREE_NODES, DraftTree, Eagle2Params, TreeShape

__all__ = [
    "DETERMINISTIC_PROCESSES",
    "MAX_TREES",
    "MAX_TREE_NODES",
    "PROCESSES",
    "DraftTree",
    "Eagle2Params",
    "TreeShape",
    "enumerate_trees",
    "sample_tree",
    "tree_laws",
]
