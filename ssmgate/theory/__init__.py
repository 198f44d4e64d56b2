"""Pure float64 numpy/scipy theory of the papers' toy models.

`ssmgate.theory.gating`: the gating paper's short-context flow and long-context Bayes limits
(protocol §2.3-2.4; P1 §2, App. B). Import the functions from the submodule.
"""
