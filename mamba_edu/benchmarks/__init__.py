"""Benchmarks, meant for a GPU; results go to ``data/benchmarks/``.

- :mod:`.ttft`     ``python -m mamba_edu bench``: TTFT, bubbles and syncs per tracking strategy.
- :mod:`.kernels`  ``python -m mamba_edu bench-kernels``: our GDN kernels vs flash-linear-attention.
"""
