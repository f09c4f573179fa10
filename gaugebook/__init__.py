"""gaugebook: gauge symmetries of Transformers, and breaking them to train better.

Attention and its symmetries:

* :mod:`~gaugebook.attention`: per-head attention: MHA, GQA, MQA, RoPE, gated RoPE
* :mod:`~gaugebook.rope`: rotary position embedding
* :mod:`~gaugebook.lie`: the one form of every symmetry (factors with their action, inverse,
  Lie algebra and exponential), tangent vectors, momentum maps and the dimension counts
* :mod:`~gaugebook.gauge`: the attention gauge group as factors acting on modules
* :mod:`~gaugebook.gpt_gauge`: the LayerNorm, residual, MLP and embedding symmetries of a GPT
* :mod:`~gaugebook.redundancy`: Jacobian-rank redundancy and the theory's prediction
* :mod:`~gaugebook.gpt_redundancy`: the prediction for a whole GPT, term by term
* :mod:`~gaugebook.projection`: the source's random-projection estimate and a sketched rank
* :mod:`~gaugebook.commutant`: commutants of matrix sets (the gauge that survives RoPE)
* :mod:`~gaugebook.linalg`: random group elements of a chosen condition number

Training and breaking:

* :mod:`~gaugebook.gpt`: a reduced GPT-2 whose attention keeps per-head weights
* :mod:`~gaugebook.breaking`: the unlearned, batch-resampled query/value biases
* :mod:`~gaugebook.mechanics`: Noether charges and gradient-flow invariants
* :mod:`~gaugebook.optim`: Energy Conserving Descent, and every optimizer by name
* :mod:`~gaugebook.baselines`: the baselines: AdamW, SGD with momentum, Muon, SOAP
* :mod:`~gaugebook.ecd_kernels`: ECD's device step as two fused Triton kernels
* :mod:`~gaugebook.data`: the default corpus, logic-puzzle probes, tiny Shakespeare
* :mod:`~gaugebook.run_config`: what defines one training run, and which runs batch together
* :mod:`~gaugebook.training`: the trainer: one run, or several as one batched model
* :mod:`~gaugebook.run_files`: a run's files: provenance, atomic writes, locks, reading back
* :mod:`~gaugebook.step_graph`: a whole training step captured once as a CUDA graph, replayed
* :mod:`~gaugebook.fitting`: the chapters' short training loop (any optimizer, ECD included)
* :mod:`~gaugebook.experiment`: the presets and the command-line runner
* :mod:`~gaugebook.results`: loading and comparing result files at equal steps
* :mod:`~gaugebook.stats`: t-intervals and rank correlations (permutation, bootstrap, power)
* :mod:`~gaugebook.decision_plots`: the decisive experiment's seed bands and decision table
* :mod:`~gaugebook.interpret`: the query-offset factor and key alignment by token category
* :mod:`~gaugebook.moe`: a top-k mixture-of-experts layer and its symmetries
* :mod:`~gaugebook.sharpness`: Hessian sharpness and its minimum over the gauge orbit
* :mod:`~gaugebook.alignment`: aligning and merging two GPTs (heads, frames, residual, MLP)
* :mod:`~gaugebook.orbit`: tangent vectors of gauge orbits, balancing
* :mod:`~gaugebook.landscapes`: toy loss landscapes, integrators and the reference ECD map
* :mod:`~gaugebook.noether_widgets`: Noether charges of one head under shifted landscapes

Book helpers:

* :mod:`~gaugebook.plots`: the shared figure style (readable in print, colour-blind safe)
* :mod:`~gaugebook.widgets`: interactive explorers, each with a static fallback
* :mod:`~gaugebook.interactive`: interactive figures without a kernel (precomputed frames)
* :mod:`~gaugebook.explorers`: the precomputed interactive figures of chapters 5, 15 and 16
* :mod:`~gaugebook.diagrams`: the book's schematic diagrams, drawn by code
* :mod:`~gaugebook.notebook`: helpers for the notebooks (Colab and plain Jupyter too)
* :mod:`~gaugebook.checks`: validation of scalar settings, one wording for every module
"""
__version__ = "0.2.0"
