"""The kernels wing of engine.sampling: every module of `engine` that imports Triton.

- accept.py, categorical.py, rng.py: the Triton backends of `speculative_accept`, `categorical`
  and `uniform_blocks` (their fronts, engine/sampling/{accept,categorical,rng}.py, import them
  lazily when the Triton backend is used);
- probabilities/: the Triton backend of `batched_probabilities`, one module per stage;
- launcher.py (enqueue below Triton's runner), launch_overlap.py (programmatic dependent
  launch), cross_compile.py (sm_90 compilation without a GPU, for the compile check and the
  SASS counts).

Nothing here imports a front module: the layouts both sides share are Triton-free modules
below them (engine/sampling/accept_result.py, engine/sampling/philox.py). The algorithms:
docs/sampling.md; the measurements: docs/notes/performance-notebook.md.
"""
