"""Sync-freeness by construction (mamba_edu.profiling.fake_device): a function runs on ``cuda``
tensors without data, so every read or host copy of device data is refused there, whatever op,
thread or mode does it.

The hidden reads below are the ones an op-list sniffer misses; each is tried on its own, then
inside a right answer of notebook 06's exercise 1 through the grader's own path, where the
verdict must be FAIL (and the same answer without the read must PASS).
"""

import ctypes
import os
import signal
import threading

import numpy as np

import pytest
import torch
from exercise_judge import judge_answer

from mamba_edu.exercises import nb06
from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.exercises.nb06 import random_tracked_batches
from mamba_edu.profiling.fake_device import DEVICE, data_read, fake_copy, would_be_sync

BATCH, ROWS, _ = random_tracked_batches(6)[0]


def in_a_thread(read):
    """``read()`` in a worker thread, its error swallowed there (a cheat's way round a mode)."""
    out = {}

    def work():
        try:
            out["v"] = read()
        except Exception:  # noqa: BLE001 - the point: the thread hides the failure
            out["v"] = 0
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    return out["v"]


def modes_off(read):
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        return read()


def dispatch_off(read):
    with torch._C._DisableTorchDispatch():
        return read()


def swallowed(read):
    try:
        return read()
    except Exception:  # noqa: BLE001 - the point: the answer hides the failure
        return 0


def _modes_off(fn, t):
    with torch._C.DisableTorchFunction():
        return fn(t)


HIDDEN_READS = {
    ".item()": lambda t: t[-1].item(),
    "repr (printing)": lambda t: repr(t),
    "an f-string": lambda t: f"{t}",
    "str with torch's function modes off": lambda t: _modes_off(str, t),
    ".tolist()": lambda t: t.tolist(),
    "bool(any())": lambda t: bool((t > 3).any()),
    "int(t[-1])": lambda t: int(t[-1]),
    ".to('cpu') then read": lambda t: t.to("cpu")[-1] + 0 and t.to("cpu").tolist(),
    ".type() then read": lambda t: t.type(torch.float64).tolist(),
    "copy_ into a new tensor, then read": lambda t: torch.zeros(len(t), dtype=t.dtype).copy_(t).tolist(),
    "torch.allclose": lambda t: torch.allclose(t.float(), t.float()),
    "bincount": lambda t: torch.bincount(t),
    "unique": lambda t: torch.unique(t),
    "nonzero": lambda t: t.nonzero(),
    "a boolean mask": lambda t: t[t > 3],
    "torch.where(mask)": lambda t: torch.where(t > 3),
    "repeat_interleave without output_size": lambda t: torch.repeat_interleave(t, t),
    "indexing with a 0-d tensor": lambda t: torch.arange(100)[t[-1]],
    "in a worker thread": lambda t: in_a_thread(lambda: int(t[-1])),
    "with torch's modes switched off": lambda t: modes_off(lambda: int(t[-1])),
    "the error caught": lambda t: swallowed(lambda: int(t[-1])),
    # copies to the host: free on a CPU, a wait for the GPU on a GPU
    ".to('cpu') and back": lambda t: t.to("cpu").cumsum(0).to(t.device),
    ".cpu()": lambda t: swallowed(lambda: t.cpu()),
    ".cpu().numpy()": lambda t: swallowed(lambda: t.cpu().numpy()),
    "numpy.asarray": lambda t: swallowed(lambda: np.asarray(t)),
    "numpy.from_dlpack in a worker thread": lambda t: in_a_thread(lambda: np.from_dlpack(t)),
    ".numpy() in a worker thread": lambda t: in_a_thread(lambda: t.numpy()),
    "data_ptr() and ctypes": lambda t: swallowed(lambda: ctypes.string_at(t.data_ptr(), 8)),
    "apply_": lambda t: swallowed(lambda: t.clone().apply_(lambda v: v + 1)),
    "host data indexed by device indices": lambda t: swallowed(lambda: torch.zeros(30)[t]),
    ".cpu() with torch's dispatch switched off": lambda t: swallowed(lambda: dispatch_off(lambda: t.cpu())),
    "int() with dispatch off, in a thread": lambda t: in_a_thread(lambda: dispatch_off(lambda: int(t[-1]))),
    # a GPU refuses to mix: a tensor made without device= is a host tensor
    "torch.arange(n) mixed with device data": lambda t: swallowed(lambda: torch.arange(len(t)) + t),
}

DATA_FREE = {
    "arithmetic": lambda t: (t[1:] - t[:-1]) * 2 + 1,
    "cumsum": lambda t: t.cumsum(0),
    "gather and index with tensors": lambda t: t[t.clamp(0, len(t) - 1)].gather(0, t.clamp(0, len(t) - 1)),
    "scatter": lambda t: torch.zeros(len(t), dtype=t.dtype, device=t.device).scatter(0, t.clamp(0, len(t) - 1), t),
    "nonzero_static": lambda t: torch.nonzero_static(t > 3, size=len(t), fill_value=-1),
    "repeat_interleave with output_size": lambda t: torch.repeat_interleave(t.clamp(0, 2), t.clamp(0, 2),
                                                                           output_size=7),
    "a 0-d bound kept a tensor": lambda t: torch.minimum(t, t.sum() - 1),
    "host lists read": lambda t: sum([1, 2, 3]) + len(t),
    "host tensors read": lambda t: int(torch.tensor([1, 2, 3]).cumsum(0)[-1]) + len(t),
    "torch.arange(n, device=x.device)": lambda t: torch.arange(len(t), device=t.device) + t,
    "new_zeros": lambda t: t.new_zeros(3).scatter_add(0, t.clamp(0, 2), t),
    "torch.where": lambda t: torch.where(t > 3, t, 0),
    "indexing with a device index tensor, slicing": lambda t: t[t.clamp(0, 3)][1:] - t[:-1],
    "writing through a mask (masked_fill)": lambda t: t.clone().__setitem__(t > 3, 0),
    "a 0-d host tensor mixed in": lambda t: t + torch.tensor(3),
    "a host list uploaded": lambda t: torch.tensor([1, 2, 3, 4], device=t.device) + t,
}


@pytest.mark.parametrize("name", list(HIDDEN_READS))
def test_every_read_of_device_data_is_found(name):
    assert data_read(HIDDEN_READS[name], torch.tensor([0, 5, 9, 20])) is not None


@pytest.mark.parametrize("name", list(DATA_FREE))
def test_data_free_ops_run(name):
    assert data_read(DATA_FREE[name], torch.tensor([0, 5, 9, 20])) is None


def test_an_error_that_is_not_a_read_propagates():
    with pytest.raises(RuntimeError):
        data_read(lambda t: t + torch.zeros(7, device=t.device), torch.tensor([0, 5, 9, 20]))


@pytest.mark.parametrize("answer", [
    lambda t: torch.zeros(len(t)),                               # made without device=
    lambda t: (t + 1, torch.arange(3)),                          # one of a tuple's
    lambda t: {"out": [t, torch.tensor([1, 2], dtype=t.dtype)]},  # inside a dict's list
])
def test_a_result_left_on_the_host_is_refused(answer):
    device_given = lambda t, device: answer(t)  # noqa: E731 - the caller names the device
    assert "make it with device=" in data_read(device_given, torch.tensor([0, 5, 9, 20]), torch.device("cpu"))


def test_device_results_and_host_scalars_are_not_refused():
    assert data_read(lambda t: (t.sum(), torch.tensor(3), [len(t)]), torch.tensor([0, 5, 9, 20])) is None


def test_a_host_result_is_fine_where_no_device_was_asked_for():
    """A host plan (08·1) may return host tensors; only a function given a device must use it."""
    assert data_read(lambda t, n: torch.arange(n), torch.tensor([0, 5]), 4) is None
    assert data_read(lambda t, d: torch.arange(4), torch.tensor([0, 5]), torch.device("cpu")) is not None


def test_the_verdict_names_the_copy():
    assert data_read(lambda t: t.to("cpu"), torch.arange(3)) == "a copy of device data to the host (aten._to_copy)"


def test_fake_copies_are_on_the_device_and_keep_host_values_and_leave_the_original_alone():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    fake = fake_copy(BATCH, FakeTensorMode())
    assert isinstance(fake.cu_seqlens, FakeTensor) and fake.cu_seqlens.shape == BATCH.cu_seqlens.shape
    assert fake.cu_seqlens.device == DEVICE and fake_copy(torch.device("cpu"), None) == DEVICE
    assert fake.extend_lens == BATCH.extend_lens and type(fake) is type(BATCH)
    assert not isinstance(BATCH.cu_seqlens, FakeTensor)


# --- a crash of the data-less run is that exercise's verdict, not the end of the process ----------

def crash_by_address(t):
    """Read the data-less buffer through its storage's address (ctypes refuses address 0)."""
    return ctypes.string_at(t.untyped_storage().data_ptr() + 4096, 8)


@pytest.mark.parametrize("answer", [crash_by_address, lambda t: os.kill(os.getpid(), signal.SIGSEGV)])
def test_a_crash_on_device_tensors_is_a_verdict(answer):
    verdict = would_be_sync(answer, [torch.arange(4)])
    assert verdict == f"the answer crashed on device tensors (signal {int(signal.SIGSEGV)})"


def test_the_forked_run_sends_its_verdict_and_leaves_the_methods_as_they_were():
    from torch._subclasses.fake_tensor import FakeTensor
    assert would_be_sync(lambda t: t.cpu(), [torch.arange(4)]) == "a copy of device data to the host (aten._to_copy)"
    assert would_be_sync(lambda t: t.cumsum(0), [torch.arange(4)]) is None
    data_read(lambda t: t.numpy(), torch.arange(4))
    assert "numpy" not in FakeTensor.__dict__ and "__getitem__" not in FakeTensor.__dict__


# --- through a check: notebook 06, exercise 1 ---------------------------------------------------

def windows(read=None):
    """The right conv windows; with ``read``, one hidden read of the batch's device data as well."""
    def my_conv_positions(batch, rows, conv_width):
        cu = batch.cu_seqlens
        if read is not None:
            read(cu)
        A = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]
        return (cu[rows] + A)[:, None] + torch.arange(-(conv_width - 1), 0, device=cu.device)
    return my_conv_positions


def test_the_right_answer_passes_the_fake_device_check():
    verdict = judge_answer(nb06.NOTEBOOK, 1, windows())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("name", [".to('cpu') then read", ".type() then read", "torch.allclose", "in a worker thread",
                                  "with torch's modes switched off", "the error caught", "bincount",
                                  "copy_ into a new tensor, then read", ".cpu().numpy()", "numpy.from_dlpack in a worker thread",
                                  "apply_", ".cpu() with torch's dispatch switched off",
                                  "torch.arange(n) mixed with device data"])
def test_a_hidden_read_fails_the_check(name):
    verdict = judge_answer(nb06.NOTEBOOK, 1, windows(HIDDEN_READS[name]))
    assert verdict.status == FAIL and "device data" in verdict.message, verdict.line()


def test_a_crash_on_device_tensors_fails_that_exercise_only():
    verdict = judge_answer(nb06.NOTEBOOK, 1, windows(crash_by_address))
    assert verdict.status == FAIL and "crashed on device tensors" in verdict.message, verdict.line()


# --- inputs are not outputs: an answer that overwrites what it was given fails ------------------

def gating_then_clobber(A_log, a, b, dt_bias):
    x = a.float() + dt_bias.float()
    softplus = torch.where(x > 20, x, torch.log1p(x.exp()))
    g, beta = -A_log.float().exp() * softplus, torch.sigmoid(b.float())
    a.zero_()                                    # the right values, and the caller's input gone
    return g, beta


def inverse_in_place(L):
    T = torch.eye(L.shape[0], dtype=L.dtype)
    for s in range(1, L.shape[0]):
        T[s] -= L[s, :s] @ T[:s]
    L.copy_(T)                                   # hands back the caller's own tensor, overwritten
    return L


def rows_into_the_mask(mask, size):
    rank = mask.long().cumsum(0) - 1
    out = torch.full((size + 1,), -1, dtype=torch.long, device=mask.device)
    out.scatter_(0, torch.where(mask & (rank < size), rank, size), torch.arange(len(mask), device=mask.device))
    mask.zero_()
    return out[:size]


@pytest.mark.parametrize("notebook, number, answer", [
    ("01_gated_deltanet_recurrence", 2, gating_then_clobber),
    ("02_chunked_prefill", 1, inverse_in_place),
    ("00_start_here", 2, rows_into_the_mask)])
def test_an_answer_that_overwrites_its_input_fails(notebook, number, answer):
    verdict = judge_answer(notebook, number, answer)
    assert verdict.status == FAIL and "in place" in verdict.message, verdict.line()


# --- fresh inputs per grading run, and a kernel that inherits no secrets ------------------------

def test_check_seeds_are_fixed_in_a_notebook_and_fresh_per_grading_run(monkeypatch):
    from mamba_edu.exercises.core import SEED_VARIABLE, check_seed
    monkeypatch.delenv(SEED_VARIABLE, raising=False)
    assert check_seed(60) == 60
    seen = set()
    for salt in ("1", "2", "987654321"):
        monkeypatch.setenv(SEED_VARIABLE, salt)
        seen.add(check_seed(60))
    assert len(seen) == 3 and 60 not in seen


# --- forbidden means absent: however the answer reaches the function -------------------------

from mamba_edu.serving import tracking as _tracking  # noqa: E402

_SAVED = _tracking.sglang_track_metadata  # a reference taken long before the call, under a new name


def windows_from_a_saved_reference(batch, rows, conv_width):
    return _SAVED(batch, conv_width).conv_positions


def windows_from_a_thread(batch, rows, conv_width):
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("m", _tracking.sglang_track_metadata(batch, conv_width)))
    worker.start()
    worker.join()
    return out["m"].conv_positions  # a KeyError when the call raised in the thread


@pytest.mark.parametrize("answer", [windows_from_a_saved_reference, windows_from_a_thread])
def test_a_forbidden_function_is_absent_however_it_is_reached(answer):
    verdict = judge_answer(nb06.NOTEBOOK, 1, answer)
    assert verdict.status == FAIL, verdict.line()
    assert _tracking.sglang_track_metadata is _SAVED and _SAVED(BATCH, 4) is not None  # put back after


# --- reads answered from the real run (exercises that allow syncs: 06·3, 07·2) --------------------

MASK, X = torch.tensor([True, False, True, True]), torch.arange(8.).reshape(4, 2)


def naive_rows(m, x):                                  # SGLang's gate, then nonzero
    if not m.any():
        return None
    return x[m.nonzero()[:, 0]] * 2 + torch.arange(2, device=x.device)


def ints(t):                                           # one helper line reads a host and a device tensor
    return [int(v) for v in t]


def listed(t):                                         # the same, through tolist
    return t.tolist()


def flags_after_a_host_list(m, x):                    # the host list first: the device one must get its own values
    listed(torch.zeros(4, dtype=torch.bool))
    rows = [i for i, v in enumerate(listed(m)) if v]
    return x[torch.tensor(rows, device=x.device)] if rows else torch.zeros(2)  # the host's values: refused


#: right answers where syncs are allowed, and the syncs a GPU makes for each
ALLOWED_READS = {
    "the gate and nonzero": (naive_rows, 2),
    "tolist": (lambda m, x: x[torch.tensor([i for i, v in enumerate(m.tolist()) if v], device=x.device)], 1),
    "tolist, then nonzero": (lambda m, x: (m.tolist(), x[m.nonzero()[:, 0]])[1], 2),
    "nonzero, then tolist": (lambda m, x: x[torch.tensor(m.nonzero()[:, 0].tolist(), device=x.device)], 2),
    "a dtype change, then .cpu()": (lambda m, x: x[m.nonzero()[:, 0].to(torch.int32).cpu().to(x.device)], 2),
    "a boolean mask": (lambda m, x: x[m] + 1, 1),
    "a 2-D boolean mask": (lambda m, x: x[x > 2.5], 1),
    "int() of a sum": (lambda m, x: x[:int(m.sum())], 1),
    ".cpu()": (lambda m, x: (x.cpu() + 1).to(x.device), 1),
    ".cpu().numpy()": (lambda m, x: x[torch.tensor(m.cpu().numpy().nonzero()[0], device=x.device)], 1),
    "torch.where(mask)": (lambda m, x: torch.where(m)[0], 1),
    "masked_select": (lambda m, x: torch.masked_select(x, m[:, None]), 1),
    "unique with counts": (lambda m, x: torch.unique(m.long(), return_counts=True)[1], 1),
    "repeat_interleave": (lambda m, x: torch.repeat_interleave(m.long()), 1),
    "torch.equal": (lambda m, x: x if torch.equal(x, x) else None, 1),
    "allclose": (lambda m, x: x if torch.allclose(x, x) else None, 1),
    "a bool per row in a loop": (lambda m, x: torch.stack([x[i] for i in range(4) if m[i]]), 4),
    "printing the rows": (lambda m, x: (print("rows:", m.nonzero()), f"{m.nonzero()}", x)[2], 4),
    "one helper line for a host and a device tensor": (
        lambda m, x: x[torch.tensor(ints(m.cpu()), device=x.device).bool()][:ints(m.long())[0]], 6),
    "one tolist line for a host list of the same dtype, then the device mask": (flags_after_a_host_list, 1),
    "sums of a host and a device tensor of one dtype on one line": (  # the host's sum (1) gives a host result
        lambda m, x: x if [int(t.sum()) for t in (torch.tensor([1, 0, 0, 0]), m.long())][1] == 3 else torch.ones(2), 1),
    "torch.nonzero, the function": (lambda m, x: x[torch.nonzero(m)[:, 0]], 1),
    "torch.nonzero(as_tuple=True), the function": (lambda m, x: x[torch.nonzero(m, as_tuple=True)[0]], 1),
    "a host mask indexing device data (read on the host)": (lambda m, x: x[torch.tensor([True, False, True, True])], 0),
    "a printout and a read on one line": (
        lambda m, x: x if f"{m.long().cumsum(0)} {int(m.long().cumsum(0)[-1])}".endswith(" 3") else torch.ones(2), 2),
    "factories called with keywords only": (
        lambda m, x: x + torch.arange(start=0, end=2, device=x.device) * torch.ones(size=(1,), device=x.device), 0),
}


def replay(fn, *args):
    """``(refusal, the syncs)`` of the data-less run answered by the real run: the way
    observe(may_sync=True) runs an answer."""
    from mamba_edu.profiling.fake_device import DataLess
    from mamba_edu.profiling.replay import recording
    from mamba_edu.profiling.syncs import count_syncs
    with DataLess(fn, args) as data_less:
        with recording() as reads, count_syncs(strict=True):
            fn(*[a.clone() for a in args])
        return data_less.verdict(reads)


@pytest.mark.parametrize("name", list(ALLOWED_READS))
def test_replay_answers_the_reads_the_real_run_made(name, capsys):
    fn, syncs = ALLOWED_READS[name]
    refused, taken = replay(fn, MASK, X)
    assert refused is None and len(taken) == syncs, (refused, taken)
    assert capsys.readouterr().out.count("rows:") <= 1  # the data-less run prints nothing


def test_replay_counts_the_host_copies_a_cpu_cannot_see():
    """The sniffer sees neither (both tensors are host tensors on a CPU); the data-less run does."""
    def round_trip(m, x):
        return (x.to("cpu") * 2).to(x.device)

    def into_a_buffer(m, x):
        host = torch.empty(4, 2)
        host.copy_(x)
        host[:2] = x[:2]
        return host.to(x.device)
    assert replay(round_trip, MASK, X) == (None, [".to(the host)"])
    assert replay(into_a_buffer, MASK, X) == (None, ["copy_ into a host tensor", "host[...] = device data"])
    assert replay(lambda m, x: x.to(torch.float64), MASK, X) == (None, [])  # a dtype change stays on the device


@pytest.mark.parametrize("answer, refusal", [
    (lambda m, x: naive_rows(m, x) + torch.ones(2), "a host tensor mixed with device data"),  # after the allowed reads
    (lambda m, x: torch.tensor(np.asarray(m).nonzero()[0], device=x.device), "(Tensor.__array__)"),  # a GPU: TypeError
    (lambda m, x: m.numpy(), "(Tensor.numpy)"),
    (lambda m, x: x.data_ptr(), "(Tensor.data_ptr)"),
    (lambda m, x: torch.tensor([1, 2]) if m.any() else None, "a result left on the host"),
    (lambda m, x: torch.tensor(list(x[:, 0]), device=x.device), "raised TypeError on device tensors with no data"),
])
def test_replay_refuses_what_a_gpu_refuses_or_has_no_answer(answer, refusal):
    refused, _ = replay(answer, MASK, X)
    assert refused is not None and refusal in refused, refused


def test_replay_refuses_a_read_the_real_run_did_not_make():
    def reads_only_without_data(m, x):
        from torch._subclasses.fake_tensor import FakeTensor
        return m.nonzero() if isinstance(m, FakeTensor) else x
    refused, _ = replay(reads_only_without_data, MASK, X)
    assert refused.startswith("a read of device data to the host (aten.nonzero")


_MEMO = {}


def test_replay_is_forked_before_the_real_run_so_its_memos_do_not_hide_the_answer():
    def memoised(m, x):                                # the host mix happens only on a cold memo
        if "w" not in _MEMO:
            _MEMO["w"] = x.sum(0) + torch.zeros(2)
        return _MEMO["w"]
    refused, _ = replay(memoised, MASK, X)
    assert "a host tensor mixed with device data" in refused
