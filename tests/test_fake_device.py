"""Sync-freeness by construction (mamba_edu.profiling.fake_device): a function runs on tensors
without data, so every read of device data fails there, whatever op, thread or mode does it.

The hidden reads below are the ones an op-list sniffer misses; each is tried on its own, then
inside a right answer of notebook 06's exercise 1 through the grader's own path, where the
verdict must be FAIL (and the same answer without the read must PASS).
"""

import threading

import pytest
import torch
from exercise_judge import judge_answer

from mamba_edu.exercises import nb06
from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.exercises.nb06 import random_tracked_batches
from mamba_edu.profiling.fake_device import data_read, fake_copy

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


def swallowed(read):
    try:
        return read()
    except Exception:  # noqa: BLE001 - the point: the answer hides the failure
        return 0


HIDDEN_READS = {
    ".item()": lambda t: t[-1].item(),
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
}

DATA_FREE = {
    "arithmetic": lambda t: (t[1:] - t[:-1]) * 2 + 1,
    "cumsum": lambda t: t.cumsum(0),
    "gather and index with tensors": lambda t: t[t.clamp(0, len(t) - 1)].gather(0, t.clamp(0, len(t) - 1)),
    "scatter": lambda t: torch.zeros(len(t), dtype=t.dtype).scatter(0, t.clamp(0, len(t) - 1), t),
    "nonzero_static": lambda t: torch.nonzero_static(t > 3, size=len(t), fill_value=-1),
    "repeat_interleave with output_size": lambda t: torch.repeat_interleave(t.clamp(0, 2), t.clamp(0, 2),
                                                                           output_size=7),
    "a 0-d bound kept a tensor": lambda t: torch.minimum(t, t.sum() - 1),
    "host lists read": lambda t: sum([1, 2, 3]) + len(t),
}


@pytest.mark.parametrize("name", list(HIDDEN_READS))
def test_every_read_of_device_data_is_found(name):
    assert data_read(HIDDEN_READS[name], torch.tensor([0, 5, 9, 20])) is not None


@pytest.mark.parametrize("name", list(DATA_FREE))
def test_data_free_ops_run(name):
    assert data_read(DATA_FREE[name], torch.tensor([0, 5, 9, 20])) is None


def test_an_error_that_is_not_a_read_propagates():
    with pytest.raises(RuntimeError):
        data_read(lambda t: t + torch.zeros(7), torch.tensor([0, 5, 9, 20]))


def test_fake_copies_keep_shapes_and_host_values_and_leave_the_original_alone():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    fake = fake_copy(BATCH, FakeTensorMode())
    assert isinstance(fake.cu_seqlens, FakeTensor) and fake.cu_seqlens.shape == BATCH.cu_seqlens.shape
    assert fake.extend_lens == BATCH.extend_lens and type(fake) is type(BATCH)
    assert not isinstance(BATCH.cu_seqlens, FakeTensor)


# --- through a check: notebook 06, exercise 1 ---------------------------------------------------

def windows(read=None):
    """The right conv windows; with ``read``, one hidden read of the batch's device data as well."""
    def my_conv_positions(batch, rows, conv_width):
        cu = batch.cu_seqlens
        if read is not None:
            read(cu)
        A = batch.track_lens_t[rows] - batch.prefix_lens_t[rows]
        return (cu[rows] + A)[:, None] + torch.arange(-(conv_width - 1), 0)
    return my_conv_positions


def test_the_right_answer_passes_the_fake_device_check():
    verdict = judge_answer(nb06.NOTEBOOK, 1, windows())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("name", [".to('cpu') then read", ".type() then read", "torch.allclose", "in a worker thread",
                                  "with torch's modes switched off", "the error caught",
                                  "copy_ into a new tensor, then read", "bincount"])
def test_a_hidden_read_fails_the_check(name):
    verdict = judge_answer(nb06.NOTEBOOK, 1, windows(HIDDEN_READS[name]))
    assert verdict.status == FAIL and "read of device data" in verdict.message, verdict.line()


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
    out = torch.full((size + 1,), -1, dtype=torch.long)
    out.scatter_(0, torch.where(mask & (rank < size), rank, size), torch.arange(len(mask)))
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


def test_the_judge_environment_is_an_allow_list(monkeypatch, tmp_path):
    from mamba_edu.exercises.core import SEED_VARIABLE
    from mamba_edu.grading.grader import judge_environment
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv(SEED_VARIABLE, "12345")
    monkeypatch.setenv("PATH", "/usr/bin")
    env = judge_environment(tmp_path / "package", tmp_path / "private")
    assert env["PATH"] == "/usr/bin" and "GITHUB_TOKEN" not in env and SEED_VARIABLE not in env


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
