"""The sync sniffer counts exactly the ops that would block the host on a GPU, with call sites."""

import pytest
import torch

from mamba_edu.profiling import count_syncs, cuda_sync_guard


def _count(fn):
    with count_syncs() as report:
        fn()
    return report


@pytest.mark.parametrize("name, fn, op", [
    ("bool", lambda m, x: bool(m.any()), "item/bool/int (_local_scalar_dense)"),
    ("if", lambda m, x: 1 if m.any() else 0, "item/bool/int (_local_scalar_dense)"),
    ("item", lambda m, x: x.sum().item(), "item/bool/int (_local_scalar_dense)"),
    ("int", lambda m, x: int(m.sum()), "item/bool/int (_local_scalar_dense)"),
    ("nonzero", lambda m, x: m.nonzero(), "nonzero"),
    ("argwhere", lambda m, x: torch.argwhere(m), "nonzero"),
    ("where1", lambda m, x: torch.where(m), "nonzero"),
    ("mask_index", lambda m, x: x[m], "boolean-mask indexing"),
    ("mask_assign", lambda m, x: x.__setitem__(m, 0.0), "boolean-mask indexing"),
    ("masked_select", lambda m, x: x.masked_select(m[:, None]), "masked_select"),
    ("unique", lambda m, x: torch.unique(m.long()), "unique"),
    ("repeat_interleave", lambda m, x: torch.arange(3).repeat_interleave(m.long()),
     "repeat_interleave without output_size"),
    ("tolist", lambda m, x: m.tolist(), "tolist"),
    ("cpu", lambda m, x: x.cpu(), "cpu()"),
    ("equal", lambda m, x: torch.equal(x, x), "torch.equal"),
    ("allclose", lambda m, x: torch.allclose(x, x), "allclose"),
])
def test_each_sync_is_counted_once(name, fn, op):
    m, x = torch.tensor([True, False, True]), torch.randn(3, 4)
    report = _count(lambda: fn(m, x))
    assert report.count == 1, report.summary()
    assert report.by_op == {op: 1}
    (event,) = report.events
    assert event.filename == __file__ and event.function == "<lambda>"
    assert report.sites == {f"test_syncs.py:{event.lineno} in <lambda>": 1}


def test_a_sync_under_another_mode_is_sited_at_its_own_line():
    """An op recorder stacked on the sniffer (the exercise checks do it) is not the call site."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    m = torch.tensor([True, False])
    with count_syncs() as report, Recorder():
        m.nonzero()
    (event,) = report.events
    assert (event.filename, event.function) == (__file__, "test_a_sync_under_another_mode_is_sited_at_its_own_line")


def test_sync_free_ops_are_not_counted():
    m, x, idx = torch.tensor([True, False, True]), torch.randn(3, 4), torch.tensor([2, 0])

    def work():
        torch.nonzero_static(m, size=3)
        x[idx]
        x[idx] = 1.0
        torch.where(m[:, None], x, 0.0)
        torch.arange(3).repeat_interleave(m.long(), output_size=2)
        torch.tensor([1, 2, 3]).to("cpu", non_blocking=True)
        x.masked_fill(m[:, None], 0.0)
        x.repeat_interleave(2, dim=1)

    assert _count(work).count == 0


def test_report_summary_and_function_filter():
    m = torch.tensor([True])

    def layer():
        return bool(m.any()), m.nonzero()

    report = _count(lambda: [layer() for _ in range(3)])
    assert report.count == 6
    assert report.in_function("layer") == 6 and report.in_function("other") == 0
    assert report.summary().splitlines()[0] == "6 would-be host syncs"


def test_host_reads_can_be_left_out():
    with count_syncs(host_reads=False) as report:
        torch.tensor([1]).tolist()
    assert report.count == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_cuda_sync_guard_is_inactive_without_cuda():
    with cuda_sync_guard() as result:
        bool(torch.tensor([True]).any())
    assert result.active is False and result.passed is None


@pytest.mark.gpu
def test_cuda_sync_guard_catches_a_sync_on_gpu():
    m = torch.tensor([True, False], device="cuda")
    with cuda_sync_guard(raise_on_sync=False) as result:
        m.nonzero()
    assert result.active and result.passed is False and result.error
    with cuda_sync_guard() as result:
        (m.long() + 1).sum()
    assert result.passed is True


@pytest.mark.gpu
def test_sniffer_sees_device_to_host_copies_on_gpu():
    x = torch.randn(4, device="cuda")
    report = _count(lambda: x.cpu())
    assert report.by_op == {"device-to-host copy": 1}


def test_host_only_blocks_are_not_counted_but_the_copies_before_them_are():
    """SGLang's metadata copies device tensors to the host, then works on the copies: only the
    copies are syncs on a GPU; the CPU sniffer is told which block works on host copies."""
    from mamba_edu.profiling import host_only

    mask = torch.tensor([True, False, True])
    with count_syncs() as syncs:
        host = mask.cpu()
        with host_only():
            rows = host.nonzero()[:, 0].tolist()
    assert rows == [0, 2]
    assert syncs.by_op == {"cpu()": 1}
