"""Exact tokens per target pass of tree shapes vs a chain of the same node count, on toy Markov chains.

Recursive rejection sampling's exact expected accepted length (specverify.core.tree_exact) + 1, averaged
over random chains.  Run: PYTHONPATH=$PWD python3 benchmarks/tree_tokens_per_pass.py
"""
import numpy as np

from specverify.core import tree_exact
from specverify.core.chains import random_markov_chain
from specverify.testing.tree_strategies import (
    binary_shape,
    chain_shape,
    eagle_shape,
    star_shape,
)

shapes = {"chain N=6": chain_shape(6), "binary N=6": binary_shape(6), "eagle(2,3,1) N=6": eagle_shape(2,3,1),
          "star N=6": star_shape(6)}
for closeness in (0.5, 0.8):
    rows=[]
    for name, shape in shapes.items():
        vals=[tree_exact.expected_tree_accepted_length(random_markov_chain(16, 1, seed=s, closeness=closeness,
                                                                           concentration=0.3), shape,
                                                                           "deterministic")+1 for s in range(20)]
        rows.append(f"{name}: {np.mean(vals):.3f}")
    print(f"deterministic top-k, V=16 order-1, concentration 0.3, closeness {closeness}, mean of 20 chains:",
          "; ".join(rows))
shapes4 = {"chain N=4": chain_shape(4), "binary N=4": binary_shape(4), "star N=4": star_shape(4)}
for scheme in ("independent", "without_replacement"):
    rows=[]
    for name, shape in shapes4.items():
        vals=[tree_exact.expected_tree_accepted_length(random_markov_chain(4, 1, seed=s, closeness=0.5), shape,
                                                       scheme)+1 for s in range(10)]
        rows.append(f"{name}: {np.mean(vals):.3f}")
    print(f"{scheme}, V=4 order-1, closeness 0.5, mean of 10 chains:", "; ".join(rows))
