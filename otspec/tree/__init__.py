r"""Draft trees: shapes, draft processes, tree verifiers and their exact values.

A draft tree puts draft tokens on the nodes of a rooted tree whose root is
the context; one target call with a tree attention mask scores every node,
and a tree verifier accepts a root path and emits one more token. This
subpackage holds the tree types (:class:`TreeShape`, :class:`DraftTree`,
:class:`Eagle2Params`), the draft processes that fill a shape with tokens
(:func:`sample_tree`, :func:`enumerate_trees`, :func:`tree_laws`), the
per-node verifiers (SpecInfer, Sequoia, target-only, SpecTr over a tree;
registered with ``kind="tree"``) with their exact laws, and :func:`value`,
the exact expected number of accepted draft tokens.

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
from ._value import TreeCheck, check_lossless, output_law, value
from ._verifiers import (
    SequoiaVerifier,
    SpecInferVerifier,
    SpecTrTreeVerifier,
    TargetOnlyVerifier,
    TreeVerifier,
    make_tree_verifier,
)

__all__ = [
    "DETERMINISTIC_PROCESSES",
    "MAX_TREES",
    "MAX_TREE_NODES",
    "PROCESSES",
    "DraftTree",
    "Eagle2Params",
    "SequoiaVerifier",
    "SpecInferVerifier",
    "SpecTrTreeVerifier",
    "TargetOnlyVerifier",
    "TreeCheck",
    "TreeShape",
    "TreeVerifier",
    "check_lossless",
    "enumerate_trees",
    "make_tree_verifier",
    "output_law",
    "sample_tree",
    "tree_laws",
    "value",
]
