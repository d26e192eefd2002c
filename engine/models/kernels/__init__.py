"""The kernels wing of engine.models: the modules of engine.models that import Triton.

- paged_attention.py: the Triton paged attention that `engine.models.attention.paged_attention`
  runs on CUDA (the front imports it lazily, only there).
"""
