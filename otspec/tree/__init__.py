r"""Draft trees: shapes, draft processes, tree verifiers and their exact values.

A draft tree puts draft tokens on the nodes of a rooted tree whose root is
the context; one target call with a tree attention mask scores every node,
and a tree verifier accepts a root path and emits one more token. This
subpackage holds the tree types (:class:`TreeShape`, :class:`DraftTree`,
:class:`Eagle2Params`), the draft processes that fill a shape with tokens
(:func:`sample_tree`, :func:`enumerate_trees`, :func:`tree_laws`), the
per-node verifiers (SpecInfer, Sequoia, target-only, SpecTr over a tree)
and the published tree and multi-path rules (Traversal Verification, greedy
block verification, hierarchical speculative decoding, SpecHub), all
registered with ``kind="tree"``, with their exact laws; :func:`value`, the
exact expected number of accepted draft tokens; :func:`optimum`, the best any
lossless verifier of a draft process can do (LPs); and the choice of a tree
(:func:`best_shape`, Sequoia's dynamic program :func:`sequoia`); the text of a
tree that the profile and the decoder read (:func:`parse_tree_spec`, with
the one node limit :data:`MAX_DRAFT_TREE_NODES`).

Notation: ``p`` is the draft law and ``q`` the target law at a node.
"""

from . import _bound_union  # noqa: F401 - registers bound(method="union") (above _bound: no import runs back up)
from ._bound import MAX_BOUND_BUDGET, TreeBound, bound
from ._choose import (
    MAX_CHOOSE_WORK,
    MAX_SEQUOIA_WORK,
    SequoiaGap,
    SequoiaTree,
    ShapeChoice,
    acceptance_vector,
    best_shape,
    greedy_shape,
    sequoia,
    sequoia_gap,
)
from ._optimum import MAX_TREE_LP_VARIABLES, OptimalTreeVerifier, TreeOptimum, TreePlan, optimum
from ._process import (
    DETERMINISTIC_PROCESSES,
    MAX_TREES,
    PROCESSES,
    enumerate_trees,
    sample_tree,
    tree_laws,
)
from ._published import (
    MAX_SPECHUB_TREES,
    GreedyBlockVerify,
    HierarchicalVerify,
    SpecHubVerify,
    TraversalVerify,
    check_spechub_lossless,
    enumerate_spechub_trees,
    sample_spechub_tree,
    spechub_optimum,
    spechub_pair_law,
)
from ._spec import MAX_DRAFT_TREE_NODES, TreeSpec, parse_tree_spec
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
    "MAX_BOUND_BUDGET",
    "MAX_DRAFT_TREE_NODES",
    "MAX_CHOOSE_WORK",
    "MAX_SEQUOIA_WORK",
    "MAX_SPECHUB_TREES",
    "MAX_TREES",
    "MAX_TREE_LP_VARIABLES",
    "MAX_TREE_NODES",
    "PROCESSES",
    "DraftTree",
    "Eagle2Params",
    "GreedyBlockVerify",
    "HierarchicalVerify",
    "OptimalTreeVerifier",
    "SequoiaGap",
    "SequoiaTree",
    "SequoiaVerifier",
    "ShapeChoice",
    "SpecHubVerify",
    "SpecInferVerifier",
    "SpecTrTreeVerifier",
    "TargetOnlyVerifier",
    "TreeBound",
    "TraversalVerify",
    "TreeCheck",
    "TreeOptimum",
    "TreePlan",
    "TreeShape",
    "TreeSpec",
    "TreeVerifier",
    "acceptance_vector",
    "best_shape",
    "bound",
    "check_lossless",
    "check_spechub_lossless",
    "enumerate_spechub_trees",
    "enumerate_trees",
    "greedy_shape",
    "make_tree_verifier",
    "optimum",
    "output_law",
    "parse_tree_spec",
    "sample_spechub_tree",
    "sample_tree",
    "sequoia",
    "sequoia_gap",
    "spechub_optimum",
    "spechub_pair_law",
    "tree_laws",
    "value",
]
