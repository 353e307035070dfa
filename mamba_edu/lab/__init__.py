"""The lab: variants of the package's kernels that were tried and lost, or were never timed.

Nothing outside this folder imports it (``tests/test_layering.py`` checks), and the package runs
none of it: :mod:`mamba_edu.kernels` has exactly one path per operation and device. A variant
moves from here into the default path only with a same-run GPU measurement in ``data/`` that
shows it faster. Notebook 10 (the appendix) walks through each of them.

Modules (each built on the package's public kernels and helpers):

- :mod:`.one_launch`: the prefill's three kernels as roles of one grid, handing off through
  counters instead of kernel boundaries. Slower on the H200 than the three kernels at every
  batch measured, graph-replayed (``ours_graph_ms_other_launch_path`` in
  ``data/benchmarks/kernels.json``).
- :mod:`.output_fold`: the chunk output as an affine function of the chunk's start state,
  ``O = O_local + Q_h·h``, which would let the scan emit the output with one product beside its
  chain. As Triton kernels inside the prepare kernel and the scan it was slower than the separate
  output kernel at every shape (``data/benchmarks/output_fold/``, and
  ``ours_graph_ms_other_output_path`` in ``kernels.json``); the kernels were removed and the
  identity is kept here, in torch.
- :mod:`.chunk_loop`: the whole prefill in one program per (V-tile, sequence, value head),
  chunk after chunk, with W, U, h and Ṽ kept in registers (the dataflow of FlashInfer's SM90
  prefill, without its warp specialisation). Slower than the three kernels on the H200
  (``data/benchmarks/lab_chunk_loop.json``, timed by ``python -m mamba_edu.lab.bench_chunk_loop``
  beside ours and the references).
- :mod:`.prologue_gemms`: projections that compute the RMSNorm, SwiGLU or gated output norm in
  their own GEMM's prologue, one launch instead of two. Never timed against cuBLAS on a GPU.

Tools that measure the lab beside the package (the benchmarks' face, also never imported):

- :mod:`.bench_chunk_loop`: the reference benchmark with the chunk loop as one more arm.
- :mod:`.bench_sm90_resources`: registers, spills and shared memory of the three kernels and of
  the chunk loop's tilings, compiled for sm_90a without a GPU
  (``data/benchmarks/sm90_resources*.json``): the chunk loop spills in every tiling tried.

Tried and removed without a module here (their write-ups stay in ``data/``):

- programmatic dependent launch (PDL), every kernel opening with a ``griddepcontrol`` wait: it
  shortened chains of our own kernels but gave no TTFT gain in the 1 × 512 graph replay
  (``data/benchmarks/pdl_ab.md``);
- the inverse's doubling on full 64 × 64 tiles, and its tf32 operands: the 16 × 16 batch and
  fp16 operands were faster and are the default (``data/benchmarks/inverse_blocks/``);
- the scan on a transposed state, and the layer's measured floor
  (``data/benchmarks/layer_floor.md``).
"""
