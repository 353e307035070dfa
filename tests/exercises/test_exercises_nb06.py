"""Notebook 06's checks reject plausible wrong answers (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`), so the
sniffer sees its syncs and the judge makes its forbidden functions absent as in ``mamba_edu grade``.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes
from exercise_judge import judge_answer

from mamba_edu.exercises import nb06
from mamba_edu.exercises.core import FAIL, PASS

NB = nb06.NOTEBOOK


# --- exercise 1: the conv windows, without a sync ----------------------------------------------

def conv_positions(shift=0, no_start=False, no_prefix=False):
    """The tracked rows' conv windows; each flag makes them wrong in one plausible way."""
    def my_conv_positions(batch, rows, conv_width):
        cu = batch.cu_seqlens
        A = batch.track_lens_t[rows] - (0 if no_prefix else batch.prefix_lens_t[rows])
        start = 0 if no_start else cu[rows]
        return (start + A + shift)[:, None] + torch.arange(-(conv_width - 1), 0, device=cu.device)
    return my_conv_positions


def conv_by_mask(batch, rows, conv_width):          # SGLang's gather: a boolean mask
    A = batch.track_lens_t - batch.prefix_lens_t
    start = (batch.cu_seqlens[:-1] + A - (conv_width - 1))[batch.track_mask_t]
    return start[:, None] + torch.arange(conv_width - 1)


def conv_clamped(batch, rows, conv_width):           # SGLang's clamp: a device bound read as a number
    cu = batch.cu_seqlens
    A = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]
    return ((cu[rows] + A)[:, None] + torch.arange(-(conv_width - 1), 0)).clamp(0, cu[-1] - 1)


def conv_on_host(batch, rows, conv_width):           # rows read back: a sync
    return torch.tensor([[batch.token_ranges[r][0] + batch.plans[r].aligned - (conv_width - 1) + j
                          for j in range(conv_width - 1)] for r in rows.tolist()])


def conv_through_numpy(batch, rows, conv_width):     # np.asarray of a tensor reads it too
    cu, A = np.asarray(batch.cu_seqlens), np.asarray(batch.track_lens_t - batch.prefix_lens_t)
    r = np.asarray(rows)
    return torch.as_tensor((cu[r] + A[r])[:, None] + np.arange(-(conv_width - 1), 0))


def host_rows(how):
    """The tracked rows read to the host, ``how``: through ``.to('cpu')``, in a worker thread, or
    with torch's modes switched off (the sniffer's modes, not the data: still a sync)."""
    def read(rows):
        if how == "to_cpu":
            return [int(r) for r in rows.to("cpu")]
        if how == "thread":
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(rows.tolist).result()
        with _disable_current_modes():
            return rows.tolist()
    return read


def conv_from_host_rows(how):
    """Right windows, from rows read to the host (:func:`host_rows`)."""
    def my_conv_positions(batch, rows, conv_width):
        return torch.tensor([[batch.token_ranges[r][0] + batch.plans[r].aligned - (conv_width - 1) + j
                              for j in range(conv_width - 1)] for r in host_rows(how)(rows)])
    return my_conv_positions


def conv_by_the_package(batch, rows, conv_width):
    from mamba_edu.serving.tracking import sglang_track_metadata
    return sglang_track_metadata(batch, conv_width).conv_positions


WRONG_1 = {
    "off by one: the window ends at A, not A - 1": conv_positions(shift=1),
    "off by one the other way": conv_positions(shift=-1),
    "the request's packed start forgotten": conv_positions(no_start=True),
    "A taken as track_lens, the prefix not subtracted": conv_positions(no_prefix=True),
    "syncing: boolean-mask gather": conv_by_mask,
    "syncing: clamp with a device bound": conv_clamped,
    "syncing: rows.tolist()": conv_on_host,
    "syncing: np.asarray(tensor)": conv_through_numpy,
    "the forbidden call: sglang_track_metadata": conv_by_the_package,
    "syncing: rows read through .to('cpu')": conv_from_host_rows("to_cpu"),
    "syncing: rows read in a worker thread": conv_from_host_rows("thread"),
    "syncing: rows read with torch's modes switched off": conv_from_host_rows("no_modes"),
    "int16 positions (overflow past 32767 tokens)": lambda batch, rows, W: conv_positions()(batch, rows, W).short(),
}


def test_conv_positions_accepts_the_right_answer():
    verdict = judge_answer(NB, 1, conv_positions())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_1))
def test_conv_positions_rejects(mistake):
    verdict = judge_answer(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_conv_positions_messages():
    assert "would-be host sync" in judge_answer(NB, 1, conv_clamped).message
    assert "np.asarray" in judge_answer(NB, 1, conv_through_numpy).message
    assert "mamba_edu.serving.tracking" in judge_answer(NB, 1, conv_by_the_package).message


# --- exercise 2: the SSM sources, without a sync ----------------------------------------------

def ssm_sources(inclusive=False, floor=False, clamp=True, no_prefix=False, bound="tensor"):
    """Each tracked row's checkpoint and from_final; each flag makes them wrong in one way."""
    def my_ssm_sources(batch, rows):
        cu = batch.cu_seqlens
        E = cu[1:] - cu[:-1]
        chunks = E // 64 if floor else (E + 63) // 64
        first = chunks.cumsum(0) if inclusive else chunks.cumsum(0) - chunks
        A = batch.track_lens_t[rows] - (0 if no_prefix else batch.prefix_lens_t[rows])
        checkpoint = first[rows] + A // 64
        if clamp:
            last = chunks.sum() - 1
            if bound == "item":
                last = last.item()                      # a sync
            elif bound == "int":
                last = int(last)                        # a sync
            checkpoint = torch.minimum(checkpoint, torch.as_tensor(last))
        return checkpoint, A == E[rows]
    return my_ssm_sources


def sources_on_host(batch, rows):                    # SGLang's way: .cpu() copies, then the split
    E = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).cpu()
    A = (batch.track_lens_t - batch.prefix_lens_t).cpu()
    chunks = (E + 63) // 64
    first = chunks.cumsum(0) - chunks
    r = rows.cpu()
    return torch.minimum(first[r] + A[r] // 64, chunks.sum() - 1), A[r] == E[r]


def sources_from_host_rows(how):
    """Right sources, from rows read to the host (:func:`host_rows`) and the host plans."""
    def my_ssm_sources(batch, rows):
        first, offsets = 0, []
        for e in batch.extend_lens:
            offsets.append(first)
            first += (e + 63) // 64
        picked = host_rows(how)(rows)
        plans = [batch.plans[r] for r in picked]
        checkpoint = [min(offsets[r] + p.aligned // 64, first - 1) for r, p in zip(picked, plans)]
        return torch.tensor(checkpoint), torch.tensor([p.aligned == p.extend_len for p in plans])
    return my_ssm_sources


def sources_by_the_package(batch, rows):
    from mamba_edu.serving.tracking import sglang_track_metadata
    t = sglang_track_metadata(batch, 4)
    return t.checkpoint, t.from_final


def sources_by_offsets(batch, rows):                 # the host helper the statement forbids
    from mamba_edu.gdn.varlen import checkpoint_offsets
    offsets = torch.tensor(checkpoint_offsets(batch.extend_lens))
    A = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]
    E = batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]
    return torch.minimum(offsets[rows] + A // 64, offsets[-1] - 1), A == E[rows]


def sources_as(checkpoint_dtype=torch.int64, final_dtype=torch.bool):
    """Right sources, returned in other dtypes than the statement's."""
    def my_ssm_sources(batch, rows):
        checkpoint, final = ssm_sources()(batch, rows)
        return checkpoint.to(checkpoint_dtype), final.to(final_dtype)
    return my_ssm_sources


WRONG_2 = {
    "float checkpoints": sources_as(checkpoint_dtype=torch.float32),
    "from_final as int64 0/1": sources_as(final_dtype=torch.int64),
    "int32 checkpoints": sources_as(checkpoint_dtype=torch.int32),
    "off by one chunk: an inclusive running sum": ssm_sources(inclusive=True),
    "chunks per request floor(E/64), not ceil": ssm_sources(floor=True),
    "no clamp: a final row names a row past h": ssm_sources(clamp=False),
    "A taken as track_lens, the prefix not subtracted": ssm_sources(no_prefix=True),
    "syncing: the bound read with .item()": ssm_sources(bound="item"),
    "syncing: the bound read with int()": ssm_sources(bound="int"),
    "syncing: SGLang's .cpu() copies": sources_on_host,
    "the forbidden call: sglang_track_metadata": sources_by_the_package,
    "the forbidden call: checkpoint_offsets": sources_by_offsets,
    "syncing: rows read through .to('cpu')": sources_from_host_rows("to_cpu"),
    "syncing: rows read in a worker thread": sources_from_host_rows("thread"),
    "syncing: rows read with torch's modes switched off": sources_from_host_rows("no_modes"),
    "final-row contract: a final row's checkpoint -1 (a Python index, not a row of h)":
        lambda batch, rows: final_rows_at(-1)(batch, rows),
    "final-row contract: from_final when A is a multiple of 64, not when A = E":
        lambda batch, rows: final_when_aligned(batch, rows),
}


def final_rows_at(value):
    """Right sources, but every final row's checkpoint replaced by ``value``."""
    def my_ssm_sources(batch, rows):
        checkpoint, final = ssm_sources()(batch, rows)
        return torch.where(final, torch.full_like(checkpoint, value), checkpoint), final
    return my_ssm_sources


def final_when_aligned(batch, rows):                 # "final" misread as "A on a chunk boundary"
    checkpoint, _ = ssm_sources()(batch, rows)
    A = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]
    return checkpoint, A % 64 == 0


def test_ssm_sources_accepts_the_right_answer():
    verdict = judge_answer(NB, 2, ssm_sources())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("row", [0, "last"])
def test_ssm_sources_accepts_any_row_of_h_for_a_final_row(row):
    """The final-row contract: a final row may name any row of h, the first or the last."""
    def my_ssm_sources(batch, rows):
        checkpoint, final = ssm_sources()(batch, rows)
        E = batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]
        pick = torch.zeros_like(checkpoint) if row == 0 else (((E + 63) // 64).sum() - 1).expand_as(checkpoint)
        return torch.where(final, pick, checkpoint), final
    verdict = judge_answer(NB, 2, my_ssm_sources)
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_2))
def test_ssm_sources_rejects(mistake):
    verdict = judge_answer(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_ssm_sources_messages():
    assert "expected torch.int64" in judge_answer(NB, 2, WRONG_2["float checkpoints"]).message
    assert "expected torch.bool" in judge_answer(NB, 2, WRONG_2["from_final as int64 0/1"]).message
    assert "expected h row 2" in judge_answer(NB, 2, ssm_sources(inclusive=True)).message
    assert "not a row of h" in judge_answer(NB, 2, ssm_sources(clamp=False)).message
    assert "final-row contract" in judge_answer(NB, 2, final_rows_at(-1)).message
    assert "would-be host sync" in judge_answer(NB, 2, ssm_sources(bound="item")).message


# --- exercise 3: the naive per-layer track write ------------------------------------------------

def _final_when_equal(A, E):                         # the right split: the final state exactly when A = E
    return A == E


def _final_when_whole_chunks(A, E):                  # "no checkpoint if the rest is whole chunks"
    return (E - A) % 64 == 0


def make_track(window_shift=0, all_rows=False, final_from_h=False, inclusive=False, no_prefix=False,
               is_final=_final_when_equal, last_row=False, window_dtype=None, consume_h=False, clear_mask=False,
               host_window=False):
    """A naive track write; the flags make it wrong in one plausible way."""
    def track(conv_pool, ssm_pool, mixed_qkv, h, batch, W):
        mask = batch.track_mask_t
        if not mask.any():
            return
        rows = torch.arange(len(mask)) if all_rows else mask.nonzero()[:, 0]
        cu = batch.cu_seqlens
        A = batch.track_lens_t[rows] - (0 if no_prefix else batch.prefix_lens_t[rows])
        A = A.clamp(min=W - 1)
        window = torch.arange(-(W - 1), 0, device=None if host_window else cu.device)
        pos = (cu[rows] + A + window_shift)[:, None] + window
        dst = batch.track_slots_t[rows]
        window = mixed_qkv[pos.clamp(0, mixed_qkv.shape[0] - 1)].transpose(1, 2)
        conv_pool[dst] = window if window_dtype is None else window.to(window_dtype)
        E = cu[1:] - cu[:-1]
        chunks = (E + 63) // 64
        first = chunks.cumsum(0) - (0 if inclusive else chunks)
        final = is_final(A, E[rows]) & (not final_from_h)
        ckpt = (first[rows] + A // 64).clamp(max=h.shape[0] - 1)
        if last_row:                                 # "the tracked state is the request's last checkpoint"
            ckpt = first[rows] + chunks[rows] - 1
        ssm_pool[dst] = torch.where(final[:, None, None, None], ssm_pool[batch.working_slots_t[rows]], h[ckpt])
        if consume_h:                                # "h is scratch after the copy": zeroed for the next layer
            h.zero_()
        if clear_mask:                               # "this layer's tracking is done": the host mask cleared
            batch.track_mask[:] = [False] * len(batch.track_mask)
    return track


def track_printing_its_rows(conv_pool, ssm_pool, mixed_qkv, h, batch, W):  # print: allowed, a sync
    print("tracked rows:", batch.track_mask_t.nonzero()[:, 0])
    make_track()(conv_pool, ssm_pool, mixed_qkv, h, batch, W)


def track_with_the_function_nonzero(conv_pool, ssm_pool, mixed_qkv, h, batch, W):  # torch.nonzero(t)
    if torch.nonzero(batch.track_mask_t).shape[0]:
        make_track()(conv_pool, ssm_pool, mixed_qkv, h, batch, W)


def track_with_numpy_rows(conv_pool, ssm_pool, mixed_qkv, h, batch, W):  # .numpy() of device data
    if batch.track_mask_t.numpy().any():                                 # (a GPU: TypeError)
        make_track()(conv_pool, ssm_pool, mixed_qkv, h, batch, W)


def track_by_the_backend(conv_pool, ssm_pool, mixed_qkv, h, batch, W):
    from mamba_edu.serving import LinearAttentionBackend, get_strategy
    from mamba_edu.serving.tracking import ForwardMetadata
    s, md = get_strategy("naive"), ForwardMetadata(batch, W)
    s.prepare(md)
    t = s.conv_indices(md)
    if t is not None:
        LinearAttentionBackend._track_conv(conv_pool, mixed_qkv, t)
        LinearAttentionBackend._track_ssm(ssm_pool, h, t)


WRONG_3 = {
    "off by one: the window ends at A": make_track(window_shift=1),
    "untracked rows' track slots written too": make_track(all_rows=True),
    "a final-state row copied from h": make_track(final_from_h=True),
    "off by one chunk: an inclusive running sum": make_track(inclusive=True),
    "A taken as track_lens, the prefix not subtracted": make_track(no_prefix=True),
    "the forbidden call: the backend's copies and the naive strategy": track_by_the_backend,
    "the final state whenever E - A is whole chunks (wrong at cache chunk 128, E = 192)":
        make_track(is_final=_final_when_whole_chunks),
    "the request's last checkpoint row, not row A // 64 (wrong at cache chunk 128, E = 200)":
        make_track(last_row=True),
    "the conv windows copied through float16": make_track(window_dtype=torch.float16),
    "h zeroed after the copy (input mutation)": make_track(consume_h=True),
    "the host track_mask cleared after the copy": make_track(clear_mask=True),
    "the conv window's offsets made without device= (on a GPU: a host tensor added to device data)":
        make_track(host_window=True),
    "the mask read with .numpy() (a device tensor has none: .cpu() first)": track_with_numpy_rows,
}


@pytest.mark.parametrize("right", [make_track(), track_printing_its_rows, track_with_the_function_nonzero])
def test_naive_track_accepts_the_right_answer(right):
    verdict = judge_answer(NB, 3, right)
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_3))
def test_naive_track_rejects(mistake):
    verdict = judge_answer(NB, 3, WRONG_3[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_naive_track_messages():
    assert "conv pool" in judge_answer(NB, 3, make_track(window_shift=1)).message
    assert "not tracked" in judge_answer(NB, 3, make_track(all_rows=True)).message
    assert "ssm pool" in judge_answer(NB, 3, make_track(final_from_h=True)).message
    assert "changed the batch's track_mask" in judge_answer(NB, 3, make_track(clear_mask=True)).message
    assert "make it with device=" in judge_answer(NB, 3, make_track(host_window=True)).message


# --- exercise 4: predict the naive forward's syncs, then measure ---------------------------------

def predict(per_forward=9, per_layer=3, untracked_forward=1, untracked_layer=2):
    """A prediction ``per forward + per layer × L``; the defaults are the measured counts."""
    def my_sync_prediction(n_gdn_layers, tracked):
        if tracked:
            return per_forward + per_layer * n_gdn_layers
        return untracked_forward + untracked_layer * n_gdn_layers
    return my_sync_prediction


def predict_with_the_sniffer(n_gdn_layers, tracked):     # measuring instead of predicting: forbidden
    from mamba_edu.profiling import count_syncs
    from mamba_edu.serving import get_strategy
    from mamba_edu.serving.tracking import ForwardMetadata
    batch = nb06.toy_batch([0, 0, 64], [130, 40, 64]) if tracked else nb06.toy_batch([0, 0], [40, 10])
    s, md = get_strategy("naive"), ForwardMetadata(batch, 4)
    with count_syncs() as syncs:
        s.prepare(md)
        for _ in range(n_gdn_layers):
            s.ssm_indices(md, s.conv_indices(md))
    return syncs.count


def predict_with_the_oracle(n_gdn_layers, tracked):      # the check's own measurement: forbidden
    return nb06.measured_syncs("naive", n_gdn_layers, tracked)


WRONG_4 = {
    "per layer only, nothing per forward (3L)": predict(per_forward=0),
    "the per-forward 9 forgotten untracked too (3L / 2L)": predict(per_forward=0, untracked_forward=0),
    "untracked like tracked (9 + 3L)": predict(untracked_forward=9, untracked_layer=3),
    "untracked: no per-layer syncs (1)": predict(untracked_layer=0),
    "untracked: the nonzero counted too (1 + 3L)": predict(untracked_layer=3),
    "two per layer when tracked (9 + 2L)": predict(per_layer=2),
    "the PR's 11, whatever L": lambda L, tracked: 11 if tracked else 2,
    "six .cpu() forgotten (3 + 3L)": predict(per_forward=3),
    "a float, not a count": lambda L, tracked: float(predict()(L, tracked)),
    "a numpy float, not a count": lambda L, tracked: np.float64(predict()(L, tracked)),
    "measured with the sniffer (forbidden)": predict_with_the_sniffer,
    "the check's oracle (forbidden)": predict_with_the_oracle,
}


@pytest.mark.parametrize("kind", [int, np.int64], ids=["int", "numpy int64"])
def test_sync_prediction_accepts_the_measured_counts(kind):
    verdict = judge_answer(NB, 4, lambda L, tracked: kind(predict()(L, tracked)))
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_4))
def test_sync_prediction_rejects(mistake):
    verdict = judge_answer(NB, 4, WRONG_4[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_sync_prediction_messages():
    message = judge_answer(NB, 4, predict(per_layer=2)).message
    assert "you predicted 11, the sniffer measures 12" in message and "tolerance 0" in message
    assert "expected a whole number" in judge_answer(NB, 4, WRONG_4["a float, not a count"]).message
