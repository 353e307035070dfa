"""The TTFT bench on tensor-parallel ranks: ``torchrun --nproc-per-node N -m mamba_edu bench --tp N``.

torchrun starts N processes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``
set); each initialises ``torch.distributed`` (gloo on the CPU; NCCL on GPU ``LOCAL_RANK`` with
NVLink multicast off, :func:`mamba_edu.tp.launch.init_rank`), builds its slice of every preset's
model (:func:`mamba_edu.tp.build_tp_model`, the same seeded weights on every rank) and runs the
single-device bench's cases and strategies (:func:`mamba_edu.benchmarks.common.run_case`) on it, per
rank:

* **TTFT**: the median over ``--repeats`` of one synchronized prefill forward, the ranks meeting
  in a barrier before each timed forward so that they start together; host time as in the
  single-device bench;
* **syncs per forward** on every rank (the sniffer, :func:`mamba_edu.profiling.count_syncs`),
  beside **the 1-rank count** of the same case, strategy and mode: the full model
  (:func:`~mamba_edu.model.build_model`) on the rank's own device, counted the same way before the
  tensor-parallel runs of each case. The engine's decisions depend on the requests only, so every
  rank must count what the 1-rank model counts; a difference fails the run (exit 1);
* on GPUs, the captured prefills as the single-device bench has them (``breakable`` for every
  strategy, ``gdn_inside`` and ``graph`` for the sync-free ones), the collectives inside the graph
  pieces and the logits' all-gather in the eager tail of the breakable modes. On the CPU
  there are no CUDA graphs: those rows are written as skipped, with the reason.

Rank 0 gathers every rank's rows and writes ``results.json`` / ``results.csv`` to ``--out``
(the single-device schema plus ``rank``, ``world``, ``syncs_1_rank`` and ``skipped``; the
run's commit, date, devices, torch and Triton versions beside them) and prints the table; the
other ranks print nothing. A rank that fails raises (its peers wait for it in a collective):
torchrun then stops the others.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

import torch
from tqdm import tqdm

from mamba_edu.benchmarks.common import (Result, commit_hash, make_benches, modes, package_versions,
                                         preset_for, run_case, run_meta, write_results)

#: What torchrun sets for each process; all are needed.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: Seconds a collective may wait for the slowest rank (each rank counts its 1-rank syncs first).
COLLECTIVE_TIMEOUT = 900.0
NO_GRAPHS_CPU = ("CUDA graphs need a GPU (and NCCL, for the collectives inside them); this run is "
                 "on the CPU over gloo")
NO_GRAPHS_FLAG = "--no-graphs"


@dataclass
class TPResult(Result):
    """One rank's row: a :class:`~mamba_edu.benchmarks.common.Result` and where it was measured."""

    rank: int = 0
    world: int = 1
    syncs_1_rank: int | None = None  # the same case, strategy and mode on the full model, one device
    skipped: str | None = None       # why this row was not measured


def _refuse(p: argparse.ArgumentParser, message: str) -> None:
    """A usage error in one line (no usage block): exit 2."""
    p.exit(2, f"{p.prog}: error: {message}\n")


def check_tp_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--tp N`` (after the bench's own checks): N must split every preset the cases run, and
    the process must be one of torchrun's N. Also refuses ``--tp 1`` in a torchrun of several
    processes (each would run the whole single-device bench into the same folder)."""
    from mamba_edu._cli import check_out_dir
    from mamba_edu.model.config import get_config
    from mamba_edu.tp import check_tp

    n, world = args.tp, os.environ.get("WORLD_SIZE")
    if n == 1:
        if world not in (None, "", "1"):
            _refuse(p, f"torchrun started WORLD_SIZE={world} processes but --tp is 1: pass --tp {world}")
        return
    for preset in dict.fromkeys(preset_for(c, args.device, args.preset) for c in args.case_list):
        if reasons := check_tp(get_config(preset), n):
            _refuse(p, f"--tp {n} does not fit preset {preset!r}: " + "; ".join(reasons))
    run_it = f"torchrun --nproc-per-node {n} -m mamba_edu bench --tp {n}"
    if world is None:
        _refuse(p, f"--tp {n} runs as {n} processes started by torchrun, and WORLD_SIZE is not set "
                   f"(not under torchrun): {run_it} [options]")
    if world != str(n):
        _refuse(p, f"--tp {n} needs {n} processes but torchrun started WORLD_SIZE={world}: {run_it}")
    if missing := [name for name in TORCHRUN_ENV if not os.environ.get(name)]:
        _refuse(p, f"--tp {n}: {', '.join(missing)} not set; start it with {run_it}")
    gpus_here = int(os.environ.get("LOCAL_WORLD_SIZE", n))
    if args.device.type == "cuda" and gpus_here > torch.cuda.device_count():
        _refuse(p, f"--tp {n}: one GPU per rank, {gpus_here} ranks on this machine and torch sees "
                   f"{torch.cuda.device_count()} GPU(s); use fewer ranks, or --device cpu (gloo)")
    if args.out == Path(p.get_default("out")):
        args.out = Path(f"{args.out}_tp{n}")  # the single-device results stay where they are
        check_out_dir(p, args.out)


def run_tp(args: argparse.Namespace) -> NoReturn:
    """This rank's part of ``bench --tp N`` on checked arguments (:func:`check_tp_args`); rank 0
    writes and prints. Ends the rank's process with 0, or 1 when a measurement failed or a rank's
    syncs differ from the 1-rank ones."""
    import torch.distributed as dist

    from mamba_edu.tp.launch import backend_for, init_rank

    rank, world, gpu = int(os.environ["RANK"]), args.tp, int(os.environ["LOCAL_RANK"])
    cuda = args.device.type == "cuda"
    init_rank(rank, world, args.device.type, "env://", COLLECTIVE_TIMEOUT, gpu=gpu)
    device = torch.device("cuda", gpu) if cuda else torch.device("cpu")

    def barrier() -> None:
        if cuda:
            dist.barrier(device_ids=[gpu])
        else:
            dist.barrier()

    if rank == 0:
        print(f"bench --tp {world}: {world} ranks ({backend_for(args.device.type)} on "
              f"{args.device.type}), {args.dtype}; per rank TTFT (median of {args.repeats}, a "
              "barrier before each forward) and syncs beside the 1-rank ones", flush=True)
    started = time.monotonic()
    rows, skipped = measure_ranks(args, rank, world, device, barrier, started)
    everyone = [None] * world if rank == 0 else None
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    dist.gather_object(([asdict(r) for r in rows], name), everyone, dst=0)
    code = 0
    if rank == 0:
        rows = [TPResult(**row) for rank_rows, _ in everyone for row in rank_rows]
        order = {key: i for i, key in enumerate(dict.fromkeys((r.case, r.label) for r in rows))}
        rows.sort(key=lambda r: (order[r.case, r.label], r.rank))  # each measurement's ranks together
        meta = tp_meta(args, [device_name for _, device_name in everyone], skipped)
        write_results(rows, args.out, meta)
        print(format_tp_table(rows))
        code = verdict(rows)
        print(f"results in {args.out}/ (results.json, results.csv"
              f"{'; traces per rank in runs/rank<r>/' if not args.no_profile else ''})")
    barrier()  # nobody tears the group down while rank 0 still gathers
    dist.destroy_process_group()
    # The rank ends here, its files written: the interpreter's teardown of torch's native threads
    # sometimes aborts a finished rank ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def measure_ranks(args, rank: int, world: int, device: torch.device, barrier,
                  started: float) -> tuple[list[TPResult], list[str]]:
    """Every case on this rank: first the 1-rank syncs (the full model, repeats 1, no profile),
    then the tensor-parallel measurements; the skipped graph rows in their places. Rank 0 decides
    the time limit (``--max-minutes``) and tells the others, so all ranks run the same cases."""
    import torch.distributed as dist

    from mamba_edu.tp import build_tp_model

    def build_slice(preset, device, dtype, seed):
        return build_tp_model(preset, rank, world, device=device, dtype=dtype, seed=seed)

    dtype = getattr(torch, args.dtype)
    cases = args.case_list
    full = make_benches(cases, device, dtype, args.preset, args.seed)
    sliced = make_benches(cases, device, dtype, args.preset, args.seed, build=build_slice)
    one_rank = argparse.Namespace(**{**vars(args), "repeats": 1, "warmup": 0, "no_profile": True})
    graph_reason = NO_GRAPHS_CPU if device.type != "cuda" else NO_GRAPHS_FLAG
    rows, skipped = [], []
    total = 2 * len(cases) * sum(len(modes(s, args.graphs)) for s in args.strategies)
    with tqdm(total=total, desc=f"bench --tp {world}", unit="run", disable=rank != 0) as bar:
        for case in cases:
            stop = [bool(args.max_minutes) and time.monotonic() - started > 60 * args.max_minutes]
            dist.broadcast_object_list(stop, src=0)
            if stop[0]:
                skipped.append(case.name)
                continue
            preset = preset_for(case, device, args.preset)
            ref = {r.label: r for r in run_case(full[preset], case, preset, one_rank, bar)}
            measured = {r.label: r for r in run_case(sliced[preset], case, preset, args, bar,
                                                     runs=args.out / "runs" / f"rank{rank}",
                                                     barrier=barrier)}
            for strategy in args.strategies:
                for mode in modes(strategy, True):
                    row = measured.get(Result.of(case, preset, strategy, mode).label)
                    if row is None:
                        rows.append(TPResult.of(case, preset, strategy, mode, rank=rank, world=world,
                                                skipped=graph_reason))
                        continue
                    one = ref[row.label]
                    rows.append(TPResult(**asdict(row), rank=rank, world=world, syncs_1_rank=one.syncs))
                    if one.error:
                        rows[-1].error = f"the 1-rank reference failed: {one.error}"
    return rows, skipped


def tp_meta(args, devices: list[str], skipped: list[str]) -> dict:
    """The single-device bench's meta, plus the run's commit, date, ranks and versions."""
    versions = package_versions()
    names = dict.fromkeys(devices)
    meta = run_meta(args)
    meta.update(device=" + ".join(f"{devices.count(d)} x {d}" for d in names), devices=devices,
                world=args.tp, backend="nccl" if args.device.type == "cuda" else "gloo",
                commit=commit_hash(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                triton=versions["triton"], python=versions["python"], skipped=skipped,
                ttft="median wall time of one synchronized prefill forward on each rank, the "
                     "ranks meeting in a barrier before each",
                syncs_1_rank="the same case, strategy and mode on the full model (build_model) on "
                             "one device, counted by the sniffer on every rank before its "
                             "tensor-parallel runs")
    return meta


def format_tp_table(rows: list[TPResult]) -> str:
    """One line per (case, strategy and mode, rank); a skipped mode once for all ranks, its
    reason under the table."""
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    lines = [f"{'case':<22}{'strategy':<23}{'rank':>5}{'TTFT ms':>10}{'host ms':>10}{'busy ms':>9}"
             f"{'idle %':>8}{'syncs':>7}{'1-rank':>8}"]
    reasons: dict[str, str] = {}
    for r in rows:
        if r.skipped:
            mark = reasons.setdefault(r.skipped, "*" * (len(reasons) + 1))
            line = f"{r.case:<22}{r.label:<23}{'all':>5}  skipped{mark}"
            if line not in lines:
                lines.append(line)
            continue
        idle = None if r.idle_fraction is None else 100 * r.idle_fraction
        differ = "" if r.syncs == r.syncs_1_rank else "  SYNCS DIFFER"
        lines.append(f"{r.case:<22}{r.label:<23}{r.rank:>5}{num(r.ttft_ms, '.2f'):>10}"
                     f"{num(r.host_ms, '.2f'):>10}{num(r.gpu_busy_ms, '.2f'):>9}{num(idle, '.1f'):>8}"
                     f"{num(r.syncs, 'd'):>7}{num(r.syncs_1_rank, 'd'):>8}{differ}"
                     + (f"  FAILED {r.error[:60]}" if r.error else ""))
    lines += [f"{mark} {reason}" for reason, mark in reasons.items()]
    return "\n".join(lines)


def verdict(rows: list[TPResult]) -> int:
    """Print whether every rank counted the 1-rank syncs; 0 when it did and nothing failed."""
    measured = [r for r in rows if not r.skipped]
    failed = [r for r in measured if r.error]
    differ = [r for r in measured if r.syncs != r.syncs_1_rank]
    if differ:
        print(f"FAIL: {len(differ)} row(s) count other syncs than the 1-rank model: "
              + ", ".join(f"{r.case} {r.label} rank {r.rank}" for r in differ[:5]))
    elif measured:
        print(f"syncs: every rank counts what the 1-rank model counts, for every strategy "
              f"({len(measured)} rows)")
    if failed:
        print(f"FAIL: {len(failed)} measurement(s) failed (FAILED in the table)")
    return 1 if failed or differ or not measured else 0
