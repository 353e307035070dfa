"""Start ``world`` ranks on this machine and collect what each returns, with no way to hang.

:func:`launch` spawns one fresh process per rank (``torch.multiprocessing``, start method
``spawn``), initialises ``torch.distributed`` in each (gloo over TCP on a free localhost port on
the CPU; NCCL on GPUs, one GPU per rank, with ``NCCL_NVLS_ENABLE=0``: NVLink multicast off) and
runs ``job(rank, world, *args)`` there. Three clocks keep a failure from hanging anyone:

* every collective has ``collective_timeout`` seconds (the process group's timeout): a rank
  waiting for a peer that is stuck raises instead of waiting for ever;
* a rank that raises reports its error and exits; its sockets close, so a peer blocked in a
  collective with it fails at once (gloo: "Connection closed by peer") and reports that;
* the launcher's watchdog: after the first failure the other ranks get ``grace`` seconds to
  report, and the whole run ``timeout`` seconds; ranks still running then are terminated (then
  killed) and reported as stopped.

Any failure raises :class:`RankFailure`, whose message names every rank and what happened to it.
"""

from __future__ import annotations

import math
import os
import queue as queue_mod
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta


class RankFailure(RuntimeError):
    """A rank raised, died or ran past the watchdog. ``reports``: every rank's :class:`RankReport`."""

    def __init__(self, message: str, reports: list[RankReport]):
        super().__init__(message)
        self.reports = reports


@dataclass
class RankReport:
    """What one rank did: ``ok`` with its ``value``, or its ``error`` (one line) and ``trace``."""

    rank: int
    ok: bool
    value: object = None
    error: str = ""
    trace: str = ""


def free_port() -> int:
    """A TCP port free on localhost now (the OS picks it; rank 0 binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device_type: str) -> str:
    """``nccl`` for CUDA ranks, ``gloo`` for CPU ranks."""
    return "nccl" if device_type == "cuda" else "gloo"


def init_rank(rank: int, world: int, device_type: str, init_method: str, collective_timeout: float,
              gpu: int | None = None):
    """``torch.distributed.init_process_group`` for one rank; on CUDA, GPU ``gpu`` (default
    ``rank``; torchrun's ``LOCAL_RANK``) becomes the current device and NVLink multicast is turned
    off (``NCCL_NVLS_ENABLE=0``). ``init_method="env://"`` reads torchrun's ``MASTER_ADDR`` and
    ``MASTER_PORT``."""
    import torch
    import torch.distributed as dist

    if device_type == "cuda":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(rank if gpu is None else gpu)
    dist.init_process_group(backend_for(device_type), init_method=init_method, rank=rank,
                            world_size=world, timeout=timedelta(seconds=collective_timeout))


def _rank_main(job, rank, world, port, device_type, collective_timeout, args, results) -> None:
    """A rank's process: initialise, run the job, report; a failure is reported and exits 1."""
    import torch.distributed as dist

    try:
        init_rank(rank, world, device_type, f"tcp://127.0.0.1:{port}", collective_timeout)
        value = job(rank, world, *args)
    except BaseException as e:  # noqa: BLE001 - every failure is reported, Ctrl-C included
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        error = f"{type(e).__name__}: {first}"
        frames = traceback.extract_tb(e.__traceback__)
        if frames and f"{os.sep}distributed{os.sep}" in frames[-1].filename:
            error = f"a collective failed (a peer rank failed, exited or hung?): {error}"
        results.put(RankReport(rank, False, error=error, trace=traceback.format_exc()))
        sys.exit(1)  # closes this rank's sockets: peers blocked on it fail at once
    results.put(RankReport(rank, True, value))
    dist.barrier()  # no rank tears the group down while a peer still talks to it
    dist.destroy_process_group()


def launch(job, world: int, args: tuple = (), *, device_type: str = "cpu", timeout: float = 300.0,
           collective_timeout: float = 60.0, grace: float | None = None) -> list:
    """Run ``job(rank, world, *args)`` on ``world`` spawned ranks; return the values in rank order.

    ``job`` must be importable by name (a module-level function) and return picklable values.
    ``timeout``: seconds for the whole run; ``collective_timeout``: for each collective;
    ``grace``: seconds the other ranks get to report after one failed (default
    ``collective_timeout + 10``). Raises :class:`RankFailure` if any rank failed, died or was
    stopped, after every rank's process has ended.
    """
    import torch.multiprocessing as mp

    if type(world) is not int or world < 1:
        raise ValueError(f"world must be an int >= 1; got {world!r}")
    for name, value in (("timeout", timeout), ("collective_timeout", collective_timeout), ("grace", grace)):
        if value is not None and (type(value) not in (int, float) or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name} must be a finite number of seconds > 0 (a hung rank is stopped "
                             f"after it); got {value!r}")
    grace = collective_timeout + 10.0 if grace is None else grace
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, name=f"tp-rank{r}",
                         args=(job, r, world, port, device_type, collective_timeout, args, results))
             for r in range(world)]
    reports: dict[int, RankReport] = {}
    try:
        for p in procs:
            p.start()
        _collect(procs, results, reports, time.monotonic() + timeout, grace)
    finally:
        end = time.monotonic() + 10.0  # ranks that reported end on their own (destroying the group)
        for r, p in enumerate(procs):
            if r in reports and p.pid is not None:
                p.join(max(0.0, end - time.monotonic()))
        for r, p in enumerate(procs):  # anything still running: stopped, and reported so
            if p.pid is not None and p.exitcode is None:
                if r not in reports:
                    reports[r] = RankReport(r, False, error="stopped by the launcher's watchdog "
                                            "(no report in time: hung, or waiting for a failed peer)")
                p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
    ordered = [reports[r] for r in range(world)]
    if not all(rep.ok for rep in ordered):
        lines = [f"rank {rep.rank}: {'ok' if rep.ok else rep.error}" for rep in ordered]
        raise RankFailure(f"tensor-parallel run over {world} ranks failed:\n  " + "\n  ".join(lines),
                          ordered)
    return [rep.value for rep in ordered]


def _collect(procs, results, reports: dict, deadline: float, grace: float) -> None:
    """Read the ranks' reports until every rank has reported, the deadline passes, or ``grace``
    seconds after the first failure. A process that ended without a report is reported dead."""
    dead_since: dict[int, float] = {}
    failed_at = None
    while len(reports) < len(procs):
        now = time.monotonic()
        limit = deadline if failed_at is None else min(deadline, failed_at + grace)
        if now >= limit:
            return
        try:
            rep = results.get(timeout=min(0.2, limit - now))
        except queue_mod.Empty:
            for r, p in enumerate(procs):
                if r in reports or p.exitcode is None:
                    continue
                dead_since.setdefault(r, now)
                if now - dead_since[r] > 2.0:  # its report would have arrived by now
                    reports[r] = RankReport(r, False, error=f"process exited with code {p.exitcode} "
                                            "before reporting (killed, or crashed in native code)")
                    failed_at = failed_at or now
            continue
        reports[rep.rank] = rep
        if not rep.ok and failed_at is None:
            failed_at = time.monotonic()
