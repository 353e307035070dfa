"""Notebook 07's checks reject plausible wrong answers (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`), so the
sniffer sees its syncs and the judge makes its forbidden functions absent as in ``mamba_edu grade``.
"""

import numpy as np
import pytest
import torch
from exercise_judge import judge_answer

from mamba_edu.exercises import nb07
from mamba_edu.exercises.core import FAIL, PASS

NB = nb07.NOTEBOOK
SCRATCH_SLOT = 0


# --- exercise 1: what the PR can hoist -----------------------------------------------------------

PER_LAYER = {"mixed_qkv[positions]", "ssm[working[rows]]", "h[checkpoint]", "h[checkpoint].abs().max().item()"}
SYNCS = {"bool(mask.any())", "mask.nonzero()[:, 0]", "int(cu[-1])", "h[checkpoint].abs().max().item()"}


def hoist(layer=PER_LAYER, syncs=SYNCS):
    """An answer with these per-layer and these syncing expressions."""
    def my_hoist(expression):
        return ("layer" if expression in layer else "forward"), expression in syncs
    return my_hoist


def hoist_by_name(expression):                        # "mentions a layer tensor" -> per layer
    names = ("mixed_qkv", "ssm", "h[", "h.")
    return ("layer" if any(n in expression for n in names) else "forward"), expression in SYNCS


def hoist_by_running(expression):                     # measuring with the sniffer: forbidden
    from mamba_edu.profiling import count_syncs
    with count_syncs() as s:
        pass
    return ("layer" if expression in PER_LAYER else "forward"), s.count > 0 or expression in SYNCS


def hoist_by_the_oracle(expression):                  # the check's own measurement: forbidden
    return nb07._measured_hoist(expression)


WRONG_1 = {
    "h.shape read as per layer (shapes are the same in every layer)": hoist_by_name,
    "everything hoistable": hoist(layer=set()),
    "a gather into a layer tensor hoisted (ssm[working[rows]])": hoist(layer=PER_LAYER - {"ssm[working[rows]]"}),
    "a device bool counted as a sync (mask.any())": hoist(syncs=SYNCS | {"mask.any()"}),
    "a three-argument where counted as a sync": hoist(syncs=SYNCS | {"torch.where(mask, slots, 0)"}),
    "int(cu[-1]) taken as free": hoist(syncs=SYNCS - {"int(cu[-1])"}),
    "the per-layer .item() taken as free": hoist(syncs=SYNCS - {"h[checkpoint].abs().max().item()"}),
    "nothing syncs": hoist(syncs=set()),
    "indices per layer (slots[rows] recomputed)": hoist(layer=PER_LAYER | {"slots[rows]"}),
    "a bare place, no sync verdict": lambda expression: hoist()(expression)[0],
    "places as booleans": lambda expression: (hoist()(expression)[0] == "forward", hoist()(expression)[1]),
    "the sniffer asked (forbidden)": hoist_by_running,
    "the check's oracle (forbidden)": hoist_by_the_oracle,
}


def test_hoist_accepts_numpy_bools():
    verdict = judge_answer(NB, 1, lambda expression: (hoist()(expression)[0], np.bool_(hoist()(expression)[1])))
    assert verdict.status == PASS, verdict.line()


def test_hoist_accepts_the_right_answer():
    verdict = judge_answer(NB, 1, hoist())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_1))
def test_hoist_rejects(mistake):
    verdict = judge_answer(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_hoist_messages():
    assert "h.shape[0] - 1 (you said 'layer': its result is the same" in judge_answer(NB, 1, hoist_by_name).message
    assert "mask.any() (no would-be sync" in judge_answer(NB, 1, WRONG_1["a device bool counted as a sync (mask.any())"]).message


# --- the index build that exercise 2 needs (notebook 06's exercises 1 and 2) -----------------------

def indices(shift=0, inclusive=False, clamp="tensor", swap_slots=False, final_at=None, floor=False,
            host_window=False, via_host=None):
    """The five indices; each flag makes them wrong in one plausible way."""
    def my_precomputed_indices(batch, rows, conv_width):
        cu = batch.cu_seqlens
        if via_host is not None:                               # "lengths are easier on the host": a copy, back
            cu = via_host(cu)
        E = cu[1:] - cu[:-1]
        chunks = (E + 63) // 64
        before = E // 64 if floor else chunks                 # floor: a ragged request's last chunk forgotten
        first = before.cumsum(0) - (0 if inclusive else before)
        A = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]
        checkpoint = first[rows] + A // 64
        if clamp == "tensor":
            checkpoint = torch.minimum(checkpoint, chunks.sum() - 1)
        elif clamp == "item":
            checkpoint = checkpoint.clamp(max=chunks.sum().item() - 1)    # a sync
        if final_at is not None:
            checkpoint = torch.where(A == E[rows], torch.full_like(checkpoint, final_at), checkpoint)
        dst, working = batch.track_slots_t[rows], batch.working_slots_t[rows]
        if swap_slots:
            dst, working = working, dst
        window = torch.arange(-(conv_width - 1), 0, device=None if host_window else cu.device)
        return dst, (cu[rows] + A + shift)[:, None] + window, working, checkpoint, A == E[rows]
    return my_precomputed_indices


def to_host_and_back(cu):                             # .to("cpu"): a no-op on a CPU, a sync on a GPU
    return cu.to("cpu").to(cu.device)


def copy_into_host(cu):                               # copy_ into a host buffer, then upload
    host = torch.empty(cu.shape, dtype=cu.dtype)
    host.copy_(cu)
    return host.to(cu.device)


def slots_read_element_by_element(batch, conv_width):  # torch.tensor(list(t)): a read per element
    got = list(prepare()(batch, conv_width) or ())
    if got:
        got[0] = torch.tensor(list(got[0]), device=got[0].device)
    return tuple(got) or None


def from_final_on_the_host(batch, conv_width):        # built from host lists without device=
    got = prepare()(batch, conv_width)
    if got is None:
        return None
    rows = [i for i, m in enumerate(batch.track_mask) if m]
    final = torch.tensor([batch.track_lens[i] - batch.prefix_lens[i] == batch.extend_lens[i] for i in rows])
    return (*got[:4], final)


def rows_listed_then_nonzero(batch, conv_width):      # .tolist() for the gate, nonzero for the rows: two
    if not any(batch.track_mask_t.tolist()):
        return None
    return indices()(batch, batch.track_mask_t.nonzero()[:, 0], conv_width)


def rows_by_a_host_mask(batch, conv_width):          # the host list as a host mask: nonzero runs on the host
    if not any(batch.track_mask):
        return None
    host_mask = torch.tensor(batch.track_mask)
    return indices()(batch, torch.arange(len(host_mask), device=batch.cu_seqlens.device)[host_mask], conv_width)


def rows_from_a_list(batch, conv_width):             # one sync, .tolist(); the gate and rows on the host
    flags = batch.track_mask_t.tolist()
    if not any(flags):
        return None
    rows = torch.tensor([i for i, f in enumerate(flags) if f], device=batch.cu_seqlens.device)
    return indices()(batch, rows, conv_width)


def indices_through_numpy(batch, rows, conv_width):  # np.asarray(rows): a read of the device
    return indices()(batch, torch.as_tensor(np.asarray(rows)), conv_width)


# --- exercise 2: your PrecomputedTracking.prepare in the engine ----------------------------------

def my_precomputed_indices(batch, rows, conv_width):   # the index build, as the notebook's cell has it
    return indices()(batch, rows, conv_width)


def prepare(build=my_precomputed_indices, gate=True, every_row=False):
    """A prepare: the PR's gate and rows, then an index build."""
    def my_prepare(batch, conv_width):
        mask = batch.track_mask_t
        if gate and not bool(mask.any()):
            return None
        rows = torch.arange(len(mask)) if every_row else mask.nonzero()[:, 0]
        return build(batch, rows, conv_width)
    return my_prepare


def prepare_like_sglang(batch, conv_width):          # nine more syncs: SGLang's per-forward build
    mask = batch.track_mask_t
    if not bool(mask.any()):
        return None
    rows = mask.nonzero()[:, 0]
    E, A = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).cpu(), (batch.track_lens_t - batch.prefix_lens_t).cpu()
    dst, working = batch.track_slots_t.cpu(), batch.working_slots_t.cpu()
    chunks = (E + 63) // 64
    first = chunks.cumsum(0) - chunks
    r = rows.cpu()
    checkpoint = torch.minimum(first[r] + A[r] // 64, chunks.sum() - 1)
    conv = (batch.cu_seqlens[:-1].cpu()[r] + A[r])[:, None] + torch.arange(-(conv_width - 1), 0)
    return tuple(t.to(mask.device) for t in (dst[r], conv, working[r], checkpoint, A[r] == E[r]))  # uploaded


def prepare_row_by_row(batch, conv_width):            # a sync per row
    rows = [i for i in range(len(batch.track_mask_t)) if batch.track_mask_t[i].item()]
    if not rows:
        return None
    return my_precomputed_indices(batch, torch.tensor(rows), conv_width)


def prepare_by_the_package(batch, conv_width):
    from mamba_edu.serving.tracking import sglang_track_metadata
    t = sglang_track_metadata(batch, conv_width)
    if t is None:
        return None
    rows = batch.track_mask_t.nonzero()[:, 0]
    return batch.track_slots_t[rows], t.conv_positions, t.working, t.checkpoint, t.from_final


def prepare_nothing(batch, conv_width):               # no copies at all: the snapshots never written
    return None


def retyped(i, dtype):
    """The right indices with the i-th (0: dst … 4: from_final) of another dtype."""
    def my_precomputed_indices(batch, rows, conv_width):
        got = list(indices()(batch, rows, conv_width))
        got[i] = got[i].to(dtype)
        return tuple(got)
    return my_precomputed_indices


WRONG_2 = {
    "checkpoint as floats (the copy cannot index with them)": prepare(build=retyped(3, torch.float32)),
    "from_final as int64 (the copy selects with a bool)": prepare(build=retyped(4, torch.int64)),
    "every row's indices: untracked rows' track slots written": prepare(every_row=True),
    "off by one: the conv window ends at A": prepare(build=indices(shift=1)),
    "off by one chunk in the checkpoint": prepare(build=indices(inclusive=True)),
    "syncing: SGLang's nine .cpu()/gate syncs rebuilt by hand": prepare_like_sglang,
    "syncing: one .item() per row": prepare_row_by_row,
    "syncing: np.asarray inside the index build": prepare(build=indices_through_numpy),
    "nothing returned: no snapshot copied": prepare_nothing,
    "the forbidden call: sglang_track_metadata": prepare_by_the_package,
    "final-row contract: a final row's checkpoint past h (no clamp)": prepare(build=indices(clamp="none")),
    "final-row contract: a final row's checkpoint -1": prepare(build=indices(final_at=-1)),
    "track and working slots swapped": prepare(build=indices(swap_slots=True)),
    "checkpoint offsets with floor(E/64), not ceil": prepare(build=indices(floor=True)),
    "syncing: the clamp's bound read with .item()": prepare(build=indices(clamp="item")),
    "syncing: cu_seqlens through .to('cpu') and back (a no-op on a CPU host)": prepare(build=indices(via_host=to_host_and_back)),
    "syncing: cu_seqlens copied into a host buffer with copy_": prepare(build=indices(via_host=copy_into_host)),
    "the conv window's offsets made without device= (a host tensor added to device data)":
        prepare(build=indices(host_window=True)),
    "syncing: torch.tensor(list(dst)) after the two allowed syncs": slots_read_element_by_element,
    "from_final built on the host (a GPU's torch.where refuses a host mask)": from_final_on_the_host,
}


def test_prepare_accepts_the_right_answers():
    # no gate: an empty nonzero is fine too; a final row may name any row of h (the contract)
    for right in (prepare(), prepare(gate=False), prepare(build=indices(final_at=0)), rows_from_a_list,
                  rows_listed_then_nonzero, rows_by_a_host_mask):
        verdict = judge_answer(NB, 2, right)
        assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_2))
def test_prepare_rejects(mistake):
    verdict = judge_answer(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_prepare_messages():
    assert "would-be host syncs" in judge_answer(NB, 2, prepare_like_sglang).message
    assert "tracked rows" in judge_answer(NB, 2, prepare(every_row=True)).message
    assert "pool differs" in judge_answer(NB, 2, prepare_nothing).message
    assert "final-row contract" in judge_answer(NB, 2, prepare(build=indices(final_at=-1))).message
    hidden = judge_answer(NB, 2, prepare(build=indices(via_host=to_host_and_back))).message
    assert "3 would-be host syncs" in hidden and ".to(the host)" in hidden, hidden  # the gate, the rows, the copy
    assert "make it with device=" in judge_answer(NB, 2, prepare(build=indices(host_window=True))).message


# --- exercise 3: a masked copy without a sync -----------------------------------------------------

def masked_copy_scratch(pool, src, dst, mask):
    pool[torch.where(mask, dst, SCRATCH_SLOT)] = src


def masked_copy_blend(pool, src, dst, mask):         # read, choose, write back: also sync-free
    keep = mask.reshape(-1, *[1] * (src.dim() - 1))
    pool[dst] = torch.where(keep, src, pool[dst])


def masked_copy_minus_one(pool, src, dst, mask):      # -1 is the last slot, a real one
    pool[torch.where(mask, dst, -1)] = src


def masked_copy_three_dims(pool, src, dst, mask):    # the mask shaped for a conv pool [slots, D, W-1] only
    pool[dst] = torch.where(mask[:, None, None], src, pool[dst])


def masked_copy_all(pool, src, dst, mask):            # the mask forgotten
    pool[dst] = src


def masked_copy_inverted(pool, src, dst, mask):
    pool[torch.where(~mask, dst, SCRATCH_SLOT)] = src


def masked_copy_boolean_index(pool, src, dst, mask):  # a sync: the result's size depends on the mask
    pool[dst[mask]] = src[mask]


def masked_copy_nonzero(pool, src, dst, mask):
    rows = mask.nonzero()[:, 0]
    pool[dst[rows]] = src[rows]


def masked_copy_gated(pool, src, dst, mask):          # if mask.any(): a sync
    if mask.any():
        pool[torch.where(mask, dst, SCRATCH_SLOT)] = src


def masked_copy_loop(pool, src, dst, mask):           # .tolist(): a sync
    for i, m in enumerate(mask.tolist()):
        if m:
            pool[dst[i]] = src[i]


def masked_copy_numpy(pool, src, dst, mask):          # np.asarray(mask): a read of the device
    for i in np.flatnonzero(np.asarray(mask)):
        pool[dst[i]] = src[i]


WRONG_3 = {
    "untracked rows sent to slot -1, the last real slot": masked_copy_minus_one,
    "the mask forgotten: every row written": masked_copy_all,
    "the mask broadcast for 3-D pools only": masked_copy_three_dims,
    "the mask inverted": masked_copy_inverted,
    "syncing: boolean index": masked_copy_boolean_index,
    "syncing: nonzero": masked_copy_nonzero,
    "syncing: if mask.any()": masked_copy_gated,
    "syncing: mask.tolist()": masked_copy_loop,
    "syncing: np.asarray(mask)": masked_copy_numpy,
}


@pytest.mark.parametrize("right", [masked_copy_scratch, masked_copy_blend])
def test_masked_copy_accepts_the_right_answers(right):
    verdict = judge_answer(NB, 3, right)
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_3))
def test_masked_copy_rejects(mistake):
    verdict = judge_answer(NB, 3, WRONG_3[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_masked_copy_messages():
    assert "a slot no row names" in judge_answer(NB, 3, masked_copy_minus_one).message
    assert "np.asarray" in judge_answer(NB, 3, masked_copy_numpy).message


# --- exercise 4: predict the precomputed forward's syncs, then measure ---------------------------

def predict(tracked_count=11, untracked_count=2, per_layer=0):
    def my_precomputed_sync_prediction(n_gdn_layers, tracked):
        return (tracked_count if tracked else untracked_count) + per_layer * n_gdn_layers
    return my_precomputed_sync_prediction


WRONG_4 = {
    "the PR's two only (2)": predict(tracked_count=2),
    "SGLang's nine only (9)": predict(tracked_count=9),
    "untracked like tracked (11)": predict(untracked_count=11),
    "untracked: nothing asked (0)": predict(untracked_count=0),
    "untracked: only the PR's gate (1)": predict(untracked_count=1),
    "one sync per layer left (11 + L)": predict(per_layer=1),
    "naive's counts (9 + 3L)": lambda L, tracked: 9 + 3 * L if tracked else 1 + 2 * L,
    "True for a count of one": lambda L, tracked: 11 if tracked else True,
    "the check's oracle (forbidden)": lambda L, tracked: measured_by_the_oracle(L, tracked),
}


def measured_by_the_oracle(L, tracked):
    from mamba_edu.exercises.nb06 import measured_syncs
    return measured_syncs("precomputed", L, tracked)


@pytest.mark.parametrize("kind", [int, np.int64], ids=["int", "numpy int64"])
def test_precomputed_prediction_accepts_the_measured_counts(kind):
    verdict = judge_answer(NB, 4, lambda L, tracked: kind(predict()(L, tracked)))
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_4))
def test_precomputed_prediction_rejects(mistake):
    verdict = judge_answer(NB, 4, WRONG_4[mistake])
    assert verdict.status == FAIL, verdict.line()
