"""Benchmarks, meant for a GPU; results go to ``out/`` unless ``--out`` says otherwise (``--out
data/…`` replaces the committed record that ``scripts/make_results.py`` reads, and says so).

- :mod:`.common`   the harness the timing drivers share: measurement, results files, provenance.
- :mod:`.ttft`     ``python -m mamba_edu bench``: TTFT, bubbles and syncs per tracking strategy.
- :mod:`.kernels`  ``python -m mamba_edu bench-kernels``: our GDN kernels vs flash-linear-attention.
"""
