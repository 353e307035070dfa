"""Helpers shared by several test files (not a test module: pytest collects nothing here)."""

from __future__ import annotations

import threading

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
    model (held there until ``call`` returns or raises); returns what ``call`` returned."""
    started, release = threading.Event(), threading.Event()
    real = engine._run_model

    def slow(batch):
        started.set()
        release.wait(10)
        return real(batch)
    engine._run_model = slow
    worker = threading.Thread(target=lambda: engine.decode(1))
    worker.start()
    started.wait(10)
    try:
        return call()
    finally:
        release.set()
        worker.join()
        engine._run_model = real


def cache_nodes(cache):
    """Every node of a RadixCache as (path tokens, slot, locks held, recency), in path order:
    its contents, its locks and the order in which it would evict."""
    out, stack = [], [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        path = path + node.tokens
        out.append((path, node.slot, tuple(id(h) for h in node.holders), node.last_used))
        stack.extend((c, path) for c in node.children.values())
    return sorted(out, key=lambda x: (x[0], x[1] or -1))


def full_state(engine) -> dict:
    """Everything a failed engine call must leave as it was: both pool tensors (every slot, free
    ones and the scratch slot included), the free list and the owners, the cache's tree (with
    locks and recency), the running and pending requests, the live batches (their statuses and
    track slots) and the stats."""
    pool = engine.pool
    return dict(
        conv=pool.conv.clone(), ssm=pool.ssm.clone(), free=list(pool._free),
        owners={s: id(o) for s, o in pool._owner.items()}, cache=cache_nodes(engine.cache),
        running={rid: (r.working_slot, list(r.track_slots), r.next_track, list(r.tokens), id(r.kv),
                       r.next_token.tolist()) for rid, r in engine.running.items()},
        pending=dict(engine.pending),
        live=[(id(b), b.status, b.track_slot_lists) for b in engine._live],
        stats=vars(engine.stats).copy())


def assert_same_state(before: dict, engine) -> None:
    """``engine`` is exactly in the ``before`` state (:func:`full_state`)."""
    after = full_state(engine)
    for name in ("conv", "ssm"):
        assert torch.equal(before[name], after[name]), f"{name} states changed"
    for name in before:
        if name not in ("conv", "ssm"):
            assert before[name] == after[name], f"{name} changed: {before[name]} -> {after[name]}"


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
