"""gaugebook: gauge symmetries of Transformers, and breaking them to train better.

Modules: :mod:`~gaugebook.attention` (per-head attention: MHA, GQA, MQA, RoPE, gated RoPE),
:mod:`~gaugebook.gauge` (the gauge group acting on modules), :mod:`~gaugebook.redundancy`
(Jacobian-rank redundancy and the theory's prediction).
"""
__version__ = "0.1.0"
