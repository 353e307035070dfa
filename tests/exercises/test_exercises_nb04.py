"""Notebook 04's checks: the right answers pass, plausible wrong ones fail (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from exercise_judge import judge_answer

from mamba_edu.exercises import nb04
from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.gdn import causal_conv1d
from mamba_edu.kernels import build_chunk_meta

NB = nb04.NOTEBOOK


def _rejected(number, wrong, phrase=None):
    verdict = judge_answer(NB, number, wrong)
    assert verdict.status == FAIL, verdict
    if phrase:
        assert phrase in verdict.message, verdict.message


# --- exercise 1: the chunk metadata ---------------------------------------------------------------

def host_meta(lengths, device, chunks=lambda n: -(-n // 64), dtype=torch.int32, inclusive_offsets=False,
              flat_table=False):
    """A host-built answer, with switches for the mistakes the check must catch."""
    cu, table, offsets = [0], [], [0]
    for seq, n in enumerate(lengths):
        cu.append(cu[-1] + n)
        table += [[seq, c] for c in range(chunks(n))]
        offsets.append(offsets[-1] + chunks(n))
    if inclusive_offsets:
        offsets = offsets[1:]
    up = lambda values: torch.tensor(values, dtype=dtype).to(device)  # noqa: E731
    table = up(table).view(-1) if flat_table else up(table).view(-1, 2)
    return up(cu), table, up(offsets)


def meta_right(lengths, device):
    return host_meta(lengths, device)


def device_meta(lengths, device):
    """Right values, built from a device tensor: repeat_interleave and .tolist() would sync."""
    lens = torch.tensor(lengths, device=device)
    counts = (lens + 63) // 64
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    chunk = torch.arange(len(seq), device=device) - offsets[seq]
    cu = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
    return cu, torch.stack([seq, chunk], 1), offsets


def meta_through_the_device(read):
    """Right values from lengths uploaded and read back by ``read`` (a sync however it is done)."""
    def my_chunk_meta(lengths, device):
        return host_meta(read(torch.tensor(lengths, device=device)), device)
    return my_chunk_meta


def package_meta(lengths, device):            # the forbidden call
    meta = build_chunk_meta(lengths, device)
    return meta.cu_seqlens, meta.chunk_indices, meta.chunk_offsets


def _meta(**switch):
    return lambda lengths, device: host_meta(lengths, device, **switch)


WRONG_1 = {
    "L // 64 chunks (off by one)": (_meta(chunks=lambda n: n // 64), "chunk"),
    "L // 64 + 1 chunks (wrong at multiples of 64)": (_meta(chunks=lambda n: n // 64 + 1), None),
    "inclusive chunk_offsets": (_meta(inclusive_offsets=True), "chunk_offsets"),
    "float tables": (_meta(dtype=torch.float32), "dtype"),
    "a flat chunk table": (_meta(flat_table=True), None),
    "built on the device (syncs)": (device_meta, "sync"),
    "build_chunk_meta (forbidden)": (package_meta, "mamba_edu.kernels"),
    "int16 tables (overflow past 32767 tokens)": (_meta(dtype=torch.int16), "int16"),
    "lengths read back through .to('cpu') (a sync)": (
        meta_through_the_device(lambda t: [int(n) for n in t.to("cpu")]), "sync"),
    "made without device= (left on the host)": (
        lambda lengths, device: host_meta(lengths, "cpu"), "make it with device="),
    "lengths read back in a worker thread (a sync)": (
        meta_through_the_device(lambda t: ThreadPoolExecutor(1).submit(t.tolist).result()), "sync"),
}


def test_chunk_meta_accepts_the_right_answer():
    assert judge_answer(NB, 1, meta_right).status == PASS


@pytest.mark.parametrize("mistake", sorted(WRONG_1))
def test_chunk_meta_rejects(mistake):
    _rejected(1, *WRONG_1[mistake])


# --- exercise 2: the conv states of a packed batch ------------------------------------------------

def conv_states(prev, x, lengths, old=True, shift=0, newest_first=False, layout="[N, D, W-1]", dtype=None,
                from_the_back=False):
    """A right answer (one gather with a host-built index), with switches for the mistakes."""
    N, D, w = prev.shape
    # from_the_back: the sequences placed from x's last row back (right only without padding)
    rows, start = [], x.shape[0] - sum(lengths) if from_the_back else 0
    for n, length in enumerate(lengths):
        end = start + length
        for j in range(w):
            t = end - w + j - shift                # the token that lands in column j
            if t >= start or not old:
                rows.append(N * w + max(t, 0))     # a row of x (x comes after the old states)
            else:
                rows.append(n * w + (w + t - start))   # a column of the old state
        start = end
    source = torch.cat([prev.transpose(1, 2).reshape(N * w, D), x.to(prev.dtype)])
    out = source[torch.tensor(rows, device=x.device)].view(N, w, D)
    if newest_first:
        out = out.flip(1)
    out = out if layout == "[N, W-1, D]" else out.transpose(1, 2)
    return out if dtype is None else out.to(dtype)


def conv_states_right(prev, x, lengths):
    return conv_states(prev, x, lengths)


def conv_states_loop(prev, x, lengths, dtype=lambda prev, x: prev.dtype):
    """Another right answer: a loop of slices, no sync; ``dtype`` picks the result's dtype."""
    out, start = [], 0
    for n, length in enumerate(lengths):
        out.append(torch.cat([prev[n], x[start:start + length].T], dim=1)[:, -prev.shape[2]:])
        start += length
    return torch.stack(out).to(dtype(prev, x))


def conv_states_device_lengths(prev, x, lengths):  # right values, but the lengths go through the device
    lens = torch.tensor(lengths, device=x.device)
    ends = lens.cumsum(0).tolist()                  # a copy to the host
    out = []
    for n, end in enumerate(ends):
        out.append(torch.cat([prev[n], x[end - lengths[n]:end].T], dim=1)[:, -prev.shape[2]:])
    return torch.stack(out)


def conv_states_float32(prev, x, lengths):        # right columns, in a float32 buffer whatever prev is
    N, D, w = prev.shape
    out, start = torch.empty(N, D, w, device=prev.device), 0
    for n, length in enumerate(lengths):
        out[n] = torch.cat([prev[n], x[start:start + length].T], dim=1)[:, -w:]
        start += length
    return out


def conv_states_host_lengths(read):
    """Right states, with the ends uploaded and read back by ``read`` (a sync however it is done)."""
    def my_conv_states(prev, x, lengths):
        ends = read(torch.tensor(lengths, device=x.device).cumsum(0))
        return torch.stack([torch.cat([prev[n], x[end - lengths[n]:end].T], dim=1)[:, -prev.shape[2]:]
                            for n, end in enumerate(ends)])
    return my_conv_states


def conv_states_package(prev, x, lengths):        # the forbidden call
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    weight = torch.zeros(x.shape[1], prev.shape[2] + 1)
    return causal_conv1d(x, weight, cu_seqlens=cu, initial_states=prev)[1]


def _conv(**switch):
    return lambda prev, x, lengths: conv_states(prev, x, lengths, **switch)


WRONG_2 = {
    "x only: short sequences read the previous sequence's tokens": (_conv(old=False), "new token"),
    "window one token early (off by one)": (_conv(shift=1), None),
    "newest column first": (_conv(newest_first=True), None),
    "layout [N, W-1, D]": (_conv(layout="[N, W-1, D]"), "expected shape"),
    "float64 states": (_conv(dtype=torch.float64), "float32"),
    "lengths uploaded and read back (syncs)": (conv_states_device_lengths, "sync"),
    "causal_conv1d's final states (forbidden)": (conv_states_package, "mamba_edu.gdn.conv"),
    "sequences counted from x's last row (wrong with padding rows)": (_conv(from_the_back=True), "padding"),
    "a float32 buffer whatever prev's dtype": (conv_states_float32, "bfloat16"),
    "the dtype torch.cat promotes prev and x to": (
        lambda prev, x, lengths: conv_states_loop(prev, x, lengths, dtype=lambda prev, x: torch.promote_types(prev.dtype, x.dtype)),
        "bfloat16 prev"),
    "x's dtype": (lambda prev, x, lengths: conv_states_loop(prev, x, lengths, dtype=lambda prev, x: x.dtype), None),
    "ends read back through .to('cpu') (a sync)": (
        conv_states_host_lengths(lambda t: [int(e) for e in t.to("cpu")]), "sync"),
    "ends read back in a worker thread (a sync)": (
        conv_states_host_lengths(lambda t: ThreadPoolExecutor(1).submit(t.tolist).result()), "sync"),
}


@pytest.mark.parametrize("right", [conv_states_right, conv_states_loop])
def test_conv_states_accepts(right):
    verdict = judge_answer(NB, 2, right)
    assert verdict.status == PASS, verdict


@pytest.mark.parametrize("mistake", sorted(WRONG_2))
def test_conv_states_rejects(mistake):
    _rejected(2, *WRONG_2[mistake])
