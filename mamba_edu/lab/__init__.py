"""The lab: variants of the package's kernels that were tried and lost, or were never timed.

Nothing outside this folder imports it (``tests/project/test_layering.py`` checks), and the package runs
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
  (``data/benchmarks/lab_chunk_loop.json``, timed by ``python -m mamba_edu.lab.bench_lab_arms``
  beside ours and the references).
- :mod:`.scan_builds_wu`: the three kernels with the preparation writing the chunk's inverse T
  instead of W and U, and the scan forming W and U per chunk: a fifth fewer bytes by the byte
  model at the breakdown's shapes, two more products on the serial path. Never timed on a GPU;
  its sm_90a resources and byte model are in ``data/benchmarks/sm90_resources_scan_builds_wu.json``.
- :mod:`.prologue_gemms`: projections that compute the RMSNorm, SwiGLU or gated output norm in
  their own GEMM's prologue, one launch instead of two. Never timed against cuBLAS on a GPU.

- :mod:`.fused_bytes`: the byte, FLOP and occupancy model of one fused chunk kernel against our
  three kernels and FlashInfer's measured times (``data/benchmarks/fused_byte_model.json``,
  ``docs/fused_design.md``): the bytes would allow about half of FlashInfer's time; the serial
  chunk loop's tensor-core share decides, which points to a warp-specialised single pass.

- :mod:`.workspace`: the prefill's per-layer intermediates (Γ, k̂, W, U, Ṽ, h) from one
  workspace that every GDN layer reuses, instead of fresh tensors in each (about 270 fewer
  allocations per forward of ``qwen3.5-tp8``). Faster in the CPU emulation
  (``data/bench/host_lab_workspace_*.json``), no faster on an H100 in the same-run eager A/B
  (``data/bench/lab_workspace_eager_*.json``); both by :mod:`.bench_lab_eager` (then named
  ``bench_lab_workspace``).
- :mod:`.prologue_norms`: each layer's two residual adds and norms and its SwiGLU in the
  prologue of the projection after them (:mod:`.prologue_gemms`' kernels): 3 launches fewer per
  layer, 179 of an eager forward's 690. Tested against the package's forward; not yet timed on a
  GPU (``ARMS="after prologue" bash scripts/gpu_lean.sh``).

Tools that measure the lab beside the package (the benchmarks' face, also never imported):

- :mod:`.bench_lab_arms`: the reference benchmark with the lab's prefills (the chunk loop, the
  scan that builds W and U) as more arms.
- :mod:`.bench_lab_eager`: a lab arm of the eager forward (``workspace``, ``prologue``) beside the
  package's, in bench-host's CPU emulation and as an arm of the GPU eager A/B.
- :mod:`.bench_sm90_resources`: registers, spills and shared memory of the three kernels, of
  ``scan_builds_wu``'s and of the chunk loop's tilings, compiled for sm_90a without a GPU, with
  each kernel's byte model (``data/benchmarks/sm90_resources*.json``): the chunk loop spills in
  every tiling tried.

Moved into the package after a same-run GPU measurement showed them faster:

- bound launches (now :mod:`mamba_edu.kernels.launcher`): each kernel call after the first of its
  kind straight to the compiled kernel's launcher, past Triton's ``JITFunction.run``. The lab arm
  beside the plain launches: ``data/bench/host_lab_bound_*.json`` (CPU emulation) and the ``bound``
  arm of ``data/bench/lean_eager_h100_*.json`` (an H100).

Tried and removed without a module here (their write-ups stay in ``data/``):

- programmatic dependent launch (PDL), every kernel opening with a ``griddepcontrol`` wait: it
  shortened chains of our own kernels but gave no TTFT gain in the 1 × 512 graph replay
  (``data/benchmarks/pdl_ab.md``);
- the inverse's doubling on full 64 × 64 tiles, and its tf32 operands: the 16 × 16 batch and
  fp16 operands were faster and are the default (``data/benchmarks/inverse_blocks/``);
- the scan on a transposed state, and the layer's measured floor
  (``data/benchmarks/layer_floor.md``).
"""
