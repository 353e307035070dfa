"""Notebook 08's checks reject plausible wrong answers (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`), so the
sniffer sees its syncs and the judge makes its forbidden functions absent as in ``mamba_edu grade``.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes
from exercise_judge import judge_answer

from mamba_edu.exercises import nb08
from mamba_edu.exercises.core import FAIL, PASS, judge, lookup
from mamba_edu.gdn import recurrent_gated_delta_rule

NB = nb08.NOTEBOOK
SCRATCH_SLOT = 0
SCAN_CODE = recurrent_gated_delta_rule.__code__  # the check meters it for a call; put back after


# --- exercise 1: the host plan of sync_free -------------------------------------------------------

def read_mask(batch, how):
    """The device track mask read to the host, ``how``: each is a sync."""
    mask = batch.track_mask_t
    if how == "tolist":
        return mask.tolist()
    if how == "numpy":
        return list(np.asarray(mask))
    if how == "to_cpu":
        return [bool(m) for m in mask.to("cpu")]
    if how == "thread":
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(mask.tolist).result()
    with _disable_current_modes():                                      # the sniffer's modes off
        return mask.tolist()


def host_plan(masked=False, from_device=None, own_slot=False, shift=0, clamp=True, chunk_of=lambda a: a // 64,
              final_checkpoint=None, pop_plans=False):
    """sync_free's host plan; each flag makes it wrong in one plausible way."""
    def my_host_plan(batch, W):
        tracked = batch.track_mask if from_device is None else read_mask(batch, from_device)
        offsets = [0]
        for e in batch.extend_lens:
            offsets.append(offsets[-1] + (e + 63) // 64)
        dst, conv, ckpt, final, chunks = [], [], [], [], []
        for i, plan in enumerate(batch.plans):
            start = batch.token_ranges[i][0]
            if tracked[i]:
                dst.append(plan.track_slot)
                conv.append([start + plan.aligned - (W - 1) + j + shift for j in range(W - 1)])
                c = offsets[i] + plan.aligned // 64
                if final_checkpoint is not None and plan.aligned == plan.extend_len:
                    c = final_checkpoint                   # a final row: its checkpoint is never read
                ckpt.append(min(c, offsets[-1] - 1) if clamp else c)
                final.append(int(plan.aligned == plan.extend_len))
                chunks.append(chunk_of(plan.aligned))
            elif not masked:
                dst.append(batch.track_slots[i] if own_slot else SCRATCH_SLOT)
                conv.append([start] * (W - 1))
                ckpt.append(0)
                final.append(0)
                chunks.append(-1)
        if pop_plans:                                  # "planned": the plans emptied for the next forward
            batch.plans.clear()
        return dst, conv, ckpt, final, chunks
    return my_host_plan


def host_plan_by_the_package(batch, W):
    from mamba_edu.serving.tracking import host_track_indices
    p = host_track_indices(batch, W)
    return p.dst, p.conv_positions, p.checkpoint, p.from_final, p.chunks


WRONG_1 = {
    "only the tracked rows: a mask instead of the scratch slot": host_plan(masked=True),
    "untracked rows write their own track slot": host_plan(own_slot=True),
    "off by one: the conv window ends at A": host_plan(shift=1),
    "no clamp: a final row's checkpoint past h": host_plan(clamp=False),
    "syncing: track_mask_t.tolist()": host_plan(from_device="tolist"),
    "syncing: np.asarray(track_mask_t)": host_plan(from_device="numpy"),
    "syncing: track_mask_t read through .to('cpu')": host_plan(from_device="to_cpu"),
    "syncing: track_mask_t read in a worker thread": host_plan(from_device="thread"),
    "syncing: track_mask_t read with torch's modes switched off": host_plan(from_device="no_modes"),
    "chunks counted in cache chunks of 128, not kernel chunks of 64": host_plan(chunk_of=lambda a: a // 128),
    "the forbidden call: host_track_indices": host_plan_by_the_package,
    "final-row contract: a final row's checkpoint -1": host_plan(final_checkpoint=-1, clamp=False),
    "the batch's plans emptied after planning": host_plan(pop_plans=True),
}


@pytest.mark.parametrize("final_checkpoint", [None, 0], ids=["o_i + A/64", "0 for a final row"])
def test_host_plan_accepts_the_right_answers(final_checkpoint):
    """A final row's checkpoint may be any row of h (notebooks 06 and 07's final-row contract)."""
    verdict = judge_answer(NB, 1, host_plan(final_checkpoint=final_checkpoint))
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_1))
def test_host_plan_rejects(mistake):
    verdict = judge_answer(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_host_plan_messages():
    assert "scratch" in judge_answer(NB, 1, host_plan(masked=True)).message
    assert "sync" in judge_answer(NB, 1, host_plan(from_device="tolist")).message


# --- exercise 2: capture-ready copies in fixed buffers ---------------------------------------------

def my_host_plan(batch, W):                 # exercise 1's answer, as the notebook has it
    return host_plan()(batch, W)


def fill(pad="scratch", rebind=False, plan=my_host_plan, rows_only=False, swap=None, pad_slot=0):
    """Fill the five buffers with the batch's plan; each flag makes it wrong in one way."""
    def my_fill_static(batch, W, dst, conv_positions, working, checkpoint, from_final):
        d, conv, ckpt, final, _ = plan(batch, W)
        work = list(batch.working_slots)
        n, rows = len(d), dst.shape[0]
        if pad == "scratch":
            d, conv = d + [SCRATCH_SLOT] * (rows - n), conv + [[0] * (W - 1)] * (rows - n)
            work, ckpt, final = work + [pad_slot] * (rows - n), ckpt + [0] * (rows - n), final + [0] * (rows - n)
        elif pad == "zeros_everywhere_but_dst":       # dst of the padding rows: slot 1, a real slot
            d, conv, work = d + [1] * (rows - n), conv + [[0] * (W - 1)] * (rows - n), work + [0] * (rows - n)
            ckpt, final = ckpt + [0] * (rows - n), final + [0] * (rows - n)
        values = (d, conv, work, ckpt, final)
        buffers = [dst, conv_positions, working, checkpoint, from_final]
        for k, (buf, v) in enumerate(zip(buffers, values)):
            t = torch.tensor(v, dtype=buf.dtype)
            if rebind:
                buffers[k] = t                        # a new tensor: the "graph" never sees it
            elif swap == "data":
                buf.data = t                          # the same tensor object on new memory
            elif swap == "set_":
                buf.set_(t)
            elif rows_only or pad is None:
                buf[:n] = t                           # the rows past the batch keep the last batch's
            else:
                buf.copy_(t)
    return my_fill_static


def fill_compacted(batch, W, dst, conv_positions, working, checkpoint, from_final):
    """The tracked rows found on the device (nonzero: a sync), padded to the scratch slot."""
    rows = batch.track_mask_t.nonzero()[:, 0]
    d, conv, ckpt, final, _ = my_host_plan(batch, W)
    keep = rows.tolist()
    pad = dst.shape[0] - len(keep)
    dst.copy_(torch.tensor([d[i] for i in keep] + [SCRATCH_SLOT] * pad))
    conv_positions.copy_(torch.tensor([conv[i] for i in keep] + [[0] * (W - 1)] * pad))
    working.copy_(torch.tensor([batch.working_slots[i] for i in keep] + [0] * pad))
    checkpoint.copy_(torch.tensor([ckpt[i] for i in keep] + [0] * pad))
    from_final.copy_(torch.tensor([bool(final[i]) for i in keep] + [False] * pad))


def fill_by_the_package(batch, W, dst, conv_positions, working, checkpoint, from_final):
    from mamba_edu.serving.tracking import host_track_indices
    p = host_track_indices(batch, W)
    pad = dst.shape[0] - len(p.dst)
    dst.copy_(torch.tensor(p.dst + [SCRATCH_SLOT] * pad))
    conv_positions.copy_(torch.tensor(p.conv_positions + [[0] * (W - 1)] * pad))
    working.copy_(torch.tensor(list(batch.working_slots) + [0] * pad))
    checkpoint.copy_(torch.tensor(p.checkpoint + [0] * pad))
    from_final.copy_(torch.tensor([bool(x) for x in p.from_final] + [False] * pad))


WRONG_2 = {
    "padding rows read from slot -2": fill(pad_slot=-2),
    "only the batch's rows written: the last batch's rows replayed": fill(pad=None),
    "padding rows sent to slot 1, a real slot": fill(pad="zeros_everywhere_but_dst"),
    "new tensors instead of the buffers": fill(rebind=True),
    "the buffers' memory swapped with .data =": fill(swap="data"),
    "the buffers' memory swapped with set_": fill(swap="set_"),
    "off by one: the conv window ends at A": fill(plan=host_plan(shift=1)),
    "untracked rows write their own track slot": fill(plan=host_plan(own_slot=True)),
    "syncing: the plan from track_mask_t.tolist()": fill(plan=host_plan(from_device="tolist")),
    "syncing: the tracked rows found with nonzero": fill_compacted,
    "syncing: np.asarray(track_mask_t)": fill(plan=host_plan(from_device="numpy")),
    "syncing: the plan read in a worker thread": fill(plan=host_plan(from_device="thread")),
    "the forbidden call: host_track_indices": fill_by_the_package,
}


@pytest.mark.parametrize("pad_slot", [0, -1], ids=["scratch slot", "slot -1 (notebook 12's padding)"])
def test_fill_static_accepts_the_right_answers(pad_slot):
    verdict = judge_answer(NB, 2, fill(pad_slot=pad_slot))
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_2))
def test_fill_static_rejects(mistake):
    verdict = judge_answer(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_fill_static_messages():
    assert "rows past the batch" in judge_answer(NB, 2, fill(pad=None)).message
    assert "never rebind them" in judge_answer(NB, 2, fill(swap="set_")).message
    assert "cannot be captured" in judge_answer(NB, 2, fill_compacted).message


# --- exercise 3: the fused tracking write -------------------------------------------------------------

def fused_scan(shift=0, write_untracked=False, skip_final=False, return_h=False, skip_working=False,
               normalise_in_place=False):
    """A chunk-by-chunk scan with the tracking write; the flags make it wrong in one way."""
    def scan(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
        if normalise_in_place:                      # the caller's q and k, normalised where they lie
            q.div_(q.norm(dim=-1, keepdim=True))
            k.div_(k.norm(dim=-1, keepdim=True))
        start, h = 0, []
        for n, L in enumerate(lengths):
            state = pool[working[n]].clone()
            n_chunks = (L + 63) // 64
            for c in range(n_chunks):
                h.append(state)
                if c == track_chunks[n] + shift or (write_untracked and track_chunks[n] < 0 and c == 0):
                    pool[track_slots[n]] = state
                s, e = start + 64 * c, min(start + 64 * (c + 1), start + L)
                state = recurrent_gated_delta_rule(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e],
                                                   initial_state=state[None], use_qk_l2norm=True).final_state[0]
            if track_chunks[n] + shift == n_chunks and not skip_final:
                pool[track_slots[n]] = state
            if not skip_working:
                pool[working[n]] = state
            start += L
        return torch.stack(h) if return_h else None
    return scan


def unfused_recurrent(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
    """Compute h (the recurrence with output_checkpoints=True), then copy: the unfused version."""
    start = 0
    for n, L in enumerate(lengths):
        s, e = start, start + L
        out = recurrent_gated_delta_rule(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e],
                                         initial_state=pool[working[n]][None].clone(), use_qk_l2norm=True,
                                         output_checkpoints=True)
        c = track_chunks[n]
        if 0 <= c < out.checkpoints.shape[0]:
            pool[track_slots[n]] = out.checkpoints[c]
        elif c == out.checkpoints.shape[0]:
            pool[track_slots[n]] = out.final_state[0]
        pool[working[n]] = out.final_state[0]
        start += L


def unfused_chunked(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
    """The chunked form with checkpoints, then the copy."""
    from mamba_edu.gdn import chunk_gated_delta_rule
    cu = torch.tensor([0] + list(np.cumsum(lengths)))
    out = chunk_gated_delta_rule(q[None] if q.dim() == 3 else q, k, v, g, beta, cu_seqlens=cu,
                                 initial_state=pool[list(working)].clone(), use_qk_l2norm=True,
                                 output_checkpoints=True)
    first = 0
    for n, L in enumerate(lengths):
        c = track_chunks[n]
        if 0 <= c < (L + 63) // 64:
            pool[track_slots[n]] = out.checkpoints[first + c]
        elif c == (L + 63) // 64:
            pool[track_slots[n]] = out.final_state[n]
        pool[working[n]] = out.final_state[n]
        first += (L + 63) // 64


def advance(q, k, v, g, beta, s, e, state):
    """The state after tokens ``s:e`` from ``state`` (``state`` itself when there are none)."""
    if e <= s:
        return state
    return recurrent_gated_delta_rule(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], initial_state=state[None],
                                      use_qk_l2norm=True).final_state[0]


def rescan(whole_batch=False, threaded=False):
    """Right values, the tracked prefix scanned twice: each row (or the whole batch in one call
    with ``cu_seqlens``) for its final state, then the prefix again for the tracked one."""
    def scan(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
        h0 = [pool[w].clone() for w in working]
        starts = np.cumsum([0] + list(lengths)).tolist()
        if whole_batch:
            finals = recurrent_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor(starts),
                                                initial_state=torch.stack(h0), use_qk_l2norm=True).final_state
        else:
            finals = [advance(q, k, v, g, beta, starts[n], starts[n + 1], h0[n]) for n in range(len(lengths))]
        for n, L in enumerate(lengths):
            if track_chunks[n] >= 0:
                pool[track_slots[n]] = advance(q, k, v, g, beta, starts[n], starts[n] + min(64 * track_chunks[n], L),
                                               h0[n])
            pool[working[n]] = finals[n]
    if not threaded:
        return scan

    def in_a_thread(*args):
        with ThreadPoolExecutor(1) as workers:
            return workers.submit(scan, *args).result()
    return in_a_thread


def chunk_again(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
    """Chunk by chunk, but the tracked state recomputed from the chunk before it: one chunk more."""
    start = 0
    for n, L in enumerate(lengths):
        state, n_chunks = pool[working[n]].clone(), (L + 63) // 64
        bounds = [(start + 64 * c, min(start + 64 * (c + 1), start + L)) for c in range(n_chunks)]
        before = state
        for c, (s, e) in enumerate(bounds):
            if c == track_chunks[n]:
                pool[track_slots[n]] = advance(q, k, v, g, beta, *bounds[c - 1], before) if c else state
            before, state = state, advance(q, k, v, g, beta, s, e, state)
        if track_chunks[n] == n_chunks:
            pool[track_slots[n]] = advance(q, k, v, g, beta, *bounds[-1], before)
        pool[working[n]] = state
        start += L


def two_calls_per_row(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
    """Right: one scan in two calls, up to the tracked chunk and on from there (fewer calls, each
    token once)."""
    start = 0
    for n, L in enumerate(lengths):
        cut = start + min(64 * max(track_chunks[n], 0), L)
        state = advance(q, k, v, g, beta, start, cut, pool[working[n]].clone())
        if track_chunks[n] >= 0:
            pool[track_slots[n]] = state
        pool[working[n]] = advance(q, k, v, g, beta, cut, start + L, state)
        start += L


def by_hand(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
    """Right values from a recurrence written out, not the one the statement asks for."""
    kn = torch.nn.functional.normalize(k, dim=-1, eps=1e-6).repeat_interleave(v.shape[1] // k.shape[1], 1)
    start = 0
    for n, L in enumerate(lengths):
        S = pool[working[n]].clone()
        for t in range(start, start + L + 1):
            if t - start == 64 * track_chunks[n]:
                pool[track_slots[n]] = S
            if t == start + L:
                break
            S = S * g[t].exp()[:, None, None]
            S = S + kn[t][:, :, None] * (beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, kn[t])))[:, None]
        pool[working[n]] = S
        start += L


def fused_by_the_package(q, k, v, g, beta, pool, lengths, working, track_slots, track_chunks):
    from mamba_edu.kernels import build_chunk_meta, gdn_prefill
    gdn_prefill(q, k, v, g, beta, state_pool=pool, meta=build_chunk_meta(lengths, "cpu"),
                state_indices=list(working), track_slots=torch.tensor(track_slots),
                track_chunks=torch.tensor(track_chunks), impl="torch")


WRONG_3 = {
    "off by one chunk: the state 64 tokens early": fused_scan(shift=-1),
    "chunk -1 written (to the scratch slot)": fused_scan(write_untracked=True),
    "ceil(L/64), the final state, never written": fused_scan(skip_final=True),
    "the working slot not updated": fused_scan(skip_working=True),
    "unfused: still hands back h": fused_scan(return_h=True),
    "unfused: the recurrence with output_checkpoints=True, then the copy": unfused_recurrent,
    "unfused: the chunked form with checkpoints, then the copy": unfused_chunked,
    "the forbidden call: gdn_prefill": fused_by_the_package,
    "q and k normalised in place (input mutation)": fused_scan(normalise_in_place=True),
    "the tracked prefix scanned twice": rescan(),
    "the whole prompt scanned, then the tracked prefixes again": rescan(whole_batch=True),
    "the tracked prefix scanned twice, in a worker thread": rescan(threaded=True),
    "one chunk too many: the tracked state recomputed from the chunk before": chunk_again,
    "the recurrence written out: nothing advanced by recurrent_gated_delta_rule": by_hand,
}


@pytest.mark.parametrize("answer", [fused_scan(), two_calls_per_row], ids=["chunk by chunk", "two calls per row"])
def test_fused_scan_accepts_the_right_answer(answer):
    verdict = judge_answer(NB, 3, answer)
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_3))
def test_fused_scan_rejects(mistake):
    verdict = judge_answer(NB, 3, WRONG_3[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_fused_scan_messages():
    assert "track slot" in judge_answer(NB, 3, fused_scan(shift=-1)).message
    assert "scratch" in judge_answer(NB, 3, fused_scan(write_untracked=True)).message
    assert "checkpoint_offsets" in judge_answer(NB, 3, unfused_recurrent).message
    assert "for a batch of 298 new tokens" in judge_answer(NB, 3, rescan(threaded=True)).message
    assert "scanned 0 of the batch's 298 new tokens" in judge_answer(NB, 3, by_hand).message


def test_fused_scan_is_metered_in_the_notebook_too_and_put_back():
    """The check run in the notebook (no grader) counts the same tokens; after a judged call,
    graded or not, the metered function is itself again."""
    exercise = lookup(NB, 3)
    assert "for a batch of 298 new tokens" in judge(exercise, rescan()).message
    assert judge(exercise, fused_scan()).status == PASS
    judge_answer(NB, 3, rescan(threaded=True))
    assert recurrent_gated_delta_rule.__code__ is SCAN_CODE
    assert not [name for name in recurrent_gated_delta_rule.__globals__ if name.startswith("__mamba_edu_meter")]
