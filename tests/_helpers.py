"""Helpers shared by several test files (not a test module: pytest collects nothing here)."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import torch

from mamba_edu.__main__ import main


def run_main(capsys, *argv) -> tuple[int, str, str]:
    """``main(argv)`` in process: its exit code (returned or raised by argparse) and output."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def call_during_decode(engine, call):
    """Run ``call()`` in this thread while another thread's ``engine.decode(1)`` is inside the
    model (held there by a forward hook until ``call`` returns or raises); returns what ``call``
    returned."""
    started, release = threading.Event(), threading.Event()

    def hold(module, args):
        started.set()
        release.wait(10)

    handle = engine.model.register_forward_pre_hook(hold)
    worker = threading.Thread(target=lambda: engine.decode(1))
    worker.start()
    started.wait(10)
    try:
        return call()
    finally:
        release.set()
        worker.join()
        handle.remove()


def check_prefill_against_reference(inputs, lengths, o, ckpt, pool, pool0, slots, track, meta,
                                    tol: float = 1e-4) -> None:
    """A prefill's outputs, checkpoints, final states and tracked states (``track = (track
    slots, track chunks)``, -1 = none) equal the chunked reference from ``pool0[slots]``, and the
    pool's last (spare) slot is untouched."""
    from mamba_edu.gdn import chunk_gated_delta_rule, cu_offsets
    from mamba_edu.testing import rel_err
    ref = chunk_gated_delta_rule(**inputs, initial_state=pool0[slots],
                                 cu_seqlens=cu_offsets(lengths), use_qk_l2norm=True,
                                 output_checkpoints=True)
    assert rel_err(o, ref.o) <= tol
    assert rel_err(ckpt, ref.checkpoints) <= tol
    assert rel_err(pool[slots], ref.final_state) <= tol
    for n, (slot, chunk) in enumerate(zip(*track)):
        if chunk < 0:
            expected = pool0[slot]
        elif chunk == -(-lengths[n] // 64):
            expected = ref.final_state[n]
        else:
            expected = ref.checkpoints[meta.offsets[n] + chunk]
        assert rel_err(pool[slot], expected) <= tol, (n, chunk)
    assert torch.equal(pool[-1], pool0[-1])


def draw_prefill_case(data, lengths: list[int], heads: tuple[int, int]):
    """A hypothesis-drawn prefill batch at K = 16, V = 32: ``(inputs, slots, (track_slots,
    track_chunks))``, each sequence tracked at a drawn chunk (-1: not tracked), slots 0..N-1 for the
    states and N..2N-1 for the tracked copies."""
    from hypothesis import strategies as st

    from mamba_edu.kernels.inputs import random_prefill_inputs

    H, HV = heads
    N = len(lengths)
    chunks = [data.draw(st.integers(-1, -(-n // 64)), label=f"track chunk {i}") for i, n in enumerate(lengths)]
    inputs = random_prefill_inputs(lengths, H, HV, 16, 32, seed=data.draw(st.integers(0, 99)))
    return inputs, list(range(N)), (list(range(N, 2 * N)), chunks)


def launch_prefill(fn, inputs, pool, lengths, slots, track, **kw):
    """Run a prefill with the package's signature (``prefill_triton`` or a lab variant) with
    checkpoints and tracking: ``(o, checkpoints, meta)``; ``track = (track slots, track chunks)``."""
    from mamba_edu.kernels import build_chunk_meta_with_indices
    meta, idx = build_chunk_meta_with_indices(lengths, inputs["q"].device, state_indices=slots,
                                              track_slots=track[0], track_chunks=track[1])
    q = inputs["q"]
    o, ckpt = fn(q, inputs["k"], inputs["v"], inputs["g"], inputs["beta"], pool,
                 idx["state_indices"], meta, q.shape[-1] ** -0.5, True, output_checkpoints=True,
                 track_slots=idx["track_slots"], track_chunks=idx["track_chunks"], **kw)
    return o, ckpt, meta


def compare_with_three_kernels(fn, dtype, slots=(0, 1, 2)):
    """``fn`` (a prefill with the package's signature) against ``prefill_triton`` on one batch
    with raw gate projections and the gated output norm inside (lengths 70, 1, 130; K = 16,
    V = 32), tracked, from a random pool: asserts outputs, checkpoints and pools agree
    (fp32 1e-5, else 5e-3) and returns ``(pool before, pool after fn)``."""
    from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
    from mamba_edu.kernels.prefill import prefill_triton
    from mamba_edu.testing import rel_err
    lengths, H, HV, K, V = [70, 1, 130], 2, 4, 16, 32
    T, N = sum(lengths), len(lengths)
    gen = torch.Generator().manual_seed(4)
    inputs = random_prefill_inputs(lengths, H, HV, K, V, dtype=dtype, seed=2)
    inputs["g"], inputs["beta"] = torch.randn(2, T, HV, generator=gen)  # raw a, b
    gating = (torch.rand(HV, generator=gen) * 2, torch.randn(HV, generator=gen))
    norm = (torch.randn(T, HV * V, generator=gen).to(dtype), torch.rand(V, generator=gen).to(dtype), 1e-6)
    track = (list(range(N, 2 * N)), [1, 0, 2])
    base = random_pool(2 * N + 1, HV, K, V)
    runs = []
    for prefill in (prefill_triton, fn):
        pool = base.clone()
        runs.append((*launch_prefill(prefill, inputs, pool, lengths, list(slots), track, gating=gating,
                                     output_norm=norm)[:2], pool))
    (o, ckpt, pool), (o2, ckpt2, pool2) = runs
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    assert rel_err(o2.float(), o.float()) <= tol
    assert rel_err(ckpt2, ckpt) <= tol and rel_err(pool2, pool) <= tol
    return base, pool2


def compare_with_three_kernels_on_gpu(fn, lengths, heads):
    """``fn`` against ``prefill_triton`` in bf16 on the GPU (K = V = 128), each sequence tracked
    at its first chunk boundary: outputs, checkpoints and pools within 1e-2."""
    from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
    from mamba_edu.kernels.prefill import prefill_triton
    from mamba_edu.testing import rel_err
    H, HV = heads
    N = len(lengths)
    inputs = random_prefill_inputs(lengths, H, HV, 128, 128, dtype=torch.bfloat16, device="cuda")
    track = (list(range(N, 2 * N)), [min(1, -(-n // 64)) for n in lengths])
    base = random_pool(2 * N + 1, HV, 128, 128, device="cuda")
    runs = []
    for prefill in (prefill_triton, fn):
        pool = base.clone()
        runs.append((*launch_prefill(prefill, inputs, pool, lengths, list(range(N)), track)[:2], pool))
    torch.cuda.synchronize()
    (o, ckpt, pool), (o2, ckpt2, pool2) = runs
    err = rel_err(o2.float(), o.float())
    if err > 1e-2:  # which of the two is off: each against the fp32 chunked reference
        from mamba_edu.gdn import chunk_gated_delta_rule, cu_offsets
        ref = chunk_gated_delta_rule(**{name: x.float() for name, x in inputs.items()},
                                     initial_state=base[:N].float(), cu_seqlens=cu_offsets(lengths),
                                     use_qk_l2norm=True).o
        raise AssertionError(f"outputs differ by {err:.3g} (> 1e-2); against the fp32 reference: "
                             f"prefill_triton {rel_err(o.float(), ref):.3g}, {fn.__name__} "
                             f"{rel_err(o2.float(), ref):.3g}")
    assert rel_err(ckpt2, ckpt) <= 1e-2 and rel_err(pool2, pool) <= 1e-2


# --- small profiler traces (the trace loader's tests and the refusals) ---------------------

def ev(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid,
            "args": args}


def small_trace():
    """A forward [0, 100] with two kernels and a host sync: bubbles [0,5], [30,60], [80,100]."""
    return {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        ev("prefill_forward", "user_annotation", 0, 100),
        ev("aten::mm", "cpu_op", 1, 10),
        ev("cudaLaunchKernel", "cuda_runtime", 2, 2, correlation=1),
        ev("K1", "kernel", 5, 25, pid=0, tid=7, correlation=1),
        ev("aten::nonzero", "cpu_op", 20, 45),
        ev("cudaStreamSynchronize", "cuda_runtime", 25, 35),
        ev("cudaLaunchKernel", "cuda_runtime", 61, 2, correlation=2),
        ev("K2", "kernel", 60, 20, pid=0, tid=7, correlation=2),
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 2, "cat": "ac2g", "name": "ac2g"},
    ]}


def write(path: Path, obj=None, *, text=None, raw=None, gz=False) -> Path:
    data = raw if raw is not None else (text if text is not None else json.dumps(obj)).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path
