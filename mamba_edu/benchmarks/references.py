"""Our GDN prefill against the field's fastest, in one run on one GPU, arms alternated.

``python -m mamba_edu.benchmarks.references [--out out/benchmarks/references.json]``

Arms (each optional; one that cannot import, run, capture or agree with the reference gets a
row entry saying why instead of a time):

- ``ours``: :func:`mamba_edu.kernels.gdn_prefill` (pool in place, the package's default path);
- ``fla_triton``: flash-linear-attention's ``chunk_gated_delta_rule`` with its FlashQLA backend
  switched off (``FLA_FLASH_QLA=0`` while the graph is captured: its multi-kernel Triton path);
- ``fla_dispatch``: the same call with fla's backend dispatch on (FlashQLA when it accepts);
- ``flashqla``: ``flash_qla.chunk_gated_delta_rule`` called directly (TileLang);
- ``flashinfer``: ``flashinfer.gdn_prefill.chunk_gated_delta_rule`` (CuTe DSL on SM90).

Each arm of each shape runs in a process of its own: no arm can reach another's memory, and a
CUDA error costs that arm only (``scripts/probe_shared_arms.py`` shows what sharing one did).

One instrument for every arm: a CUDA graph that holds one call on each of ``ROTATE`` input
copies (so that L2 does not flatter anyone), replayed back to back between two CUDA events;
ms per call = elapsed / (replays · ROTATE). A round measures every arm once, in an order rotated
from round to round; each row keeps every round's value, the median and the spread
((max − min) / median), and the SM clock read through NVML after each arm's measurement.
``ratio_best`` = ours / the fastest reference that agreed with the fp32 reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from mamba_edu.benchmarks.common import OUT, commit_hash, package_versions, say_where, sm_clock_mhz

K = V = 128
ROTATE = 3
DEVICE = "cuda"
AGREE = 1e-2  # relative error against the fp32 reference above which an arm is not compared
PRESETS = {"qwen3-next": (16, 32), "qwen3.5-tp8": (2, 8)}  # (H, HV)
CASES = [("qwen3-next", [512]), ("qwen3-next", [256] * 16), ("qwen3-next", [256] * 8),
         ("qwen3-next", [1024] * 8), ("qwen3-next", [2048]), ("qwen3-next", [8192]),
         ("qwen3-next", [32768]), ("qwen3-next", [4096] * 8),
         ("qwen3.5-tp8", [512]), ("qwen3.5-tp8", [256] * 16), ("qwen3.5-tp8", [1024] * 8),
         ("qwen3.5-tp8", [8192])]


def case_name(preset: str, lengths: list[int]) -> str:
    return f"{preset} {len(lengths)}x{lengths[0]}"


class _Case:
    """Inputs of one shape: ``ROTATE`` copies of ``q, k [T, H, K]``, ``v [T, HV, V]`` bf16 and fp32
    ``g, beta [T, HV]``, pools for our kernels, the chunk metadata and ``cu_seqlens`` int64."""

    def __init__(self, preset: str, lengths: list[int], seed: int = 0):
        from mamba_edu.kernels import build_chunk_meta_with_indices
        from mamba_edu.kernels.inputs import random_prefill_inputs
        self.H, self.HV = PRESETS[preset]
        self.lengths, self.N, self.T = lengths, len(lengths), sum(lengths)
        self.sets = [random_prefill_inputs(lengths, self.H, self.HV, K, V, dtype=torch.bfloat16,
                                           device=DEVICE, seed=seed + i) for i in range(ROTATE)]
        self.meta, self.indices = build_chunk_meta_with_indices(
            lengths, DEVICE, state_indices=list(range(1, self.N + 1)))
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        self.cu_cpu = torch.tensor(cu, dtype=torch.int64)
        self.cu = self.cu_cpu.to(DEVICE)
        self.h0 = 0.1 * torch.randn(self.N, self.HV, K, V, device=DEVICE,
                                    generator=torch.Generator(DEVICE).manual_seed(7))

    def reference(self):
        from mamba_edu.gdn import chunk_gated_delta_rule
        x = self.sets[0]
        return chunk_gated_delta_rule(*(x[n].float() for n in ("q", "k", "v", "g", "beta")),
                                      initial_state=self.h0, cu_seqlens=self.cu_cpu.tolist(),
                                      use_qk_l2norm=True)


# Each arm: ``build(case) -> (call, out, info)``; ``call(i)`` runs on input copy i (captured in the
# graph), ``out()`` runs copy 0 from ``case.h0`` and returns ``(o [T, HV, V], final [N, HV, ·, ·])``.

def _ours(case):
    from mamba_edu.kernels import gdn_prefill
    pools = [torch.zeros(case.N + 1, case.HV, K, V, device=DEVICE) for _ in range(ROTATE)]

    def call(i):
        return gdn_prefill(**case.sets[i], state_pool=pools[i], meta=case.meta, **case.indices)

    def out():
        pool = torch.cat([torch.zeros_like(case.h0[:1]), case.h0])
        o, _ = gdn_prefill(**case.sets[0], state_pool=pool, meta=case.meta, **case.indices)
        return o, pool[1:]
    return call, out, {}


def _fla(case, use_flashqla: bool):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    from fla.ops.utils.index import prepare_chunk_indices
    chunk_indices = prepare_chunk_indices(case.cu, 64, cu_seqlens_cpu=case.cu_cpu)
    h0s = [torch.zeros_like(case.h0) for _ in range(ROTATE)]

    def run(x, h0):
        previous = os.environ.get("FLA_FLASH_QLA")
        os.environ["FLA_FLASH_QLA"] = "1" if use_flashqla else "0"
        try:
            o, final = fla_chunk(x["q"][None], x["k"][None], x["v"][None], x["g"][None],
                                 x["beta"][None], initial_state=h0, output_final_state=True,
                                 cu_seqlens=case.cu, cu_seqlens_cpu=case.cu_cpu,
                                 chunk_indices=chunk_indices, use_qk_l2norm_in_kernel=True)
        finally:
            if previous is None:
                os.environ.pop("FLA_FLASH_QLA")
            else:
                os.environ["FLA_FLASH_QLA"] = previous
        return o[0], final
    return (lambda i: run(case.sets[i], h0s[i])), (lambda: run(case.sets[0], case.h0.clone())), {}


def _syncs(fn) -> bool:
    """Whether ``fn()`` makes a host sync that torch sees (then it cannot be graph-captured)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return False
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def _flashqla(case):
    from flash_qla import chunk_gated_delta_rule as qla_chunk
    h0s = [torch.zeros_like(case.h0) for _ in range(ROTATE)]
    batched = False

    def run(x, h0):
        if batched:  # equal lengths as a [N, L, ...] batch: no cu_seqlens to read on the host
            shape = (case.N, case.lengths[0])
            args = [x[n].reshape(*shape, *x[n].shape[1:]) for n in ("q", "k", "v", "g", "beta")]
            o, final = qla_chunk(*args, initial_state=h0, output_final_state=True,
                                 use_qk_l2norm_in_kernel=True)
            return o.reshape(case.T, *o.shape[2:]), final
        o, final = qla_chunk(x["q"][None], x["k"][None], x["v"][None], x["g"][None],
                             x["beta"][None], initial_state=h0, output_final_state=True,
                             use_qk_l2norm_in_kernel=True, cu_seqlens=case.cu)
        return o[0], final

    run(case.sets[0], h0s[0])  # compile outside the sync probe
    if _syncs(lambda: run(case.sets[0], h0s[0])) and len(set(case.lengths)) == 1:
        batched = True
    info = {"form": "batched [N, L]" if batched else "varlen"}
    return ((lambda i: run(case.sets[i], h0s[i])), (lambda: run(case.sets[0], case.h0.clone())),
            info)


def _flashinfer(case):
    from flashinfer.gdn_prefill import chunk_gated_delta_rule as fi_chunk
    # FlashInfer takes the decay as a factor (alpha = exp(g)), fp32 gates, packed [T, ·, ·], and
    # keeps states as [N, HV, V, K] (its docstring): the start state goes in transposed.
    alphas = [x["g"].exp() for x in case.sets]
    states = [torch.zeros_like(case.h0) for _ in range(ROTATE)]
    h0_vk = case.h0.transpose(-1, -2).contiguous()
    cu32 = case.cu.to(torch.int32)

    def run(i, h0, state):
        x = case.sets[i]
        o, final = fi_chunk(x["q"], x["k"], x["v"], alphas[i], x["beta"], initial_state=h0,
                            output_final_state=True, output_state=state, cu_seqlens=cu32,
                            use_qk_l2norm_in_kernel=True)
        return o, final
    return ((lambda i: run(i, states[i], states[i])),
            (lambda: run(0, h0_vk.clone(), torch.empty_like(h0_vk))), {})


ARMS = {"ours": _ours, "fla_triton": lambda c: _fla(c, False),
        "fla_dispatch": lambda c: _fla(c, True), "flashqla": _flashqla,
        "flashinfer": _flashinfer}
REFERENCES = ("fla_triton", "fla_dispatch", "flashqla", "flashinfer")


def _rel_err_any_layout(actual, expected) -> float:
    """The relative error of a state, in whichever of [K, V] and [V, K] the arm stores it."""
    from mamba_edu.testing import rel_err
    return min(rel_err(actual, expected), rel_err(actual.transpose(-1, -2), expected))


class _Graph:
    """One captured graph of ``call(0) … call(ROTATE-1)``, timed by events around replays."""

    def __init__(self, call):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(ROTATE):  # warm-up: compile, autotune, allocate outside the capture
                call(i)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for i in range(ROTATE):
                call(i)
        torch.cuda.synchronize()
        self.replays = self._replays_for(0.02)

    def _elapsed_ms(self, replays: int) -> float:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            self.graph.replay()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    def _replays_for(self, seconds: float) -> int:
        self._elapsed_ms(3)
        once = max(self._elapsed_ms(3) / 3, 1e-3)
        return max(5, min(2000, int(seconds * 1e3 / once)))

    def ms_per_call(self, samples: int = 5) -> float:
        return statistics.median(self._elapsed_ms(self.replays) / (self.replays * ROTATE)
                                 for _ in range(samples))


def summarize(arms: dict) -> dict:
    """Median and spread of each timed arm (in place), and the row's ``ratio_best``: ours over
    the fastest of :data:`REFERENCES` that was timed without an error (an arm with ``error``
    never counts). An arm that is neither ours nor a reference (a variant passed to
    :func:`main`) gets ``ratio_ours``, its median over ours."""
    timed = [n for n, e in arms.items() if e.get("rounds_ms") and "error" not in e]
    for name in timed:
        values = arms[name]["rounds_ms"]
        arms[name]["median_ms"] = statistics.median(values)
        arms[name]["spread"] = (max(values) - min(values)) / arms[name]["median_ms"]
    if "ours" in timed:
        for name in timed:
            if name != "ours" and name not in REFERENCES:
                arms[name]["ratio_ours"] = arms[name]["median_ms"] / arms["ours"]["median_ms"]
    refs = {n: arms[n]["median_ms"] for n in timed if n in REFERENCES}
    if "ours" not in timed or not refs:
        return {}
    best = min(refs, key=refs.get)
    return dict(fastest_reference=best, ratio_best=arms["ours"]["median_ms"] / refs[best])


def _build_arm(name: str, case: _Case, ref, table: dict) -> tuple[dict, _Graph | None]:
    """One arm of one shape: its entry (errors against ``ref``, or why it cannot be timed) and,
    when it agrees and can be captured, its graph."""
    from mamba_edu.testing import rel_err
    entry = {}
    try:
        with torch.inference_mode():
            call, out, info = table[name](case)
            entry.update(info)
            o, final = out()
            torch.cuda.synchronize()
            entry["o_err"] = rel_err(o.reshape(ref.o.shape), ref.o)
            entry["state_err"] = _rel_err_any_layout(final.float(), ref.final_state)
            if not entry["o_err"] <= AGREE or not entry["state_err"] <= AGREE:
                entry["error"] = f"disagrees with the fp32 reference (> {AGREE})"
                return entry, None
            if _syncs(lambda: call(0)):
                entry["error"] = "syncs with the host: cannot be captured in a CUDA graph"
                return entry, None
            return entry, _Graph(call)
    except Exception as exc:  # a reference that fails must not lose the others' numbers
        entry["error"] = f"{type(exc).__name__}: {exc}"[:400]
        torch.cuda.synchronize()
        return entry, None


def _row(preset: str, lengths: list[int]) -> dict:
    H, HV = PRESETS[preset]
    return dict(case=case_name(preset, lengths), T=sum(lengths), N=len(lengths), H=H, HV=HV,
                K=K, V=V, dtype="bf16", arms={})


def time_rounds(row: dict, timers: dict, rounds: int) -> None:
    """Time every arm of ``timers`` (name → ``() -> (ms, sm_mhz)``) once per round, in an order
    rotated from round to round, into ``row["arms"]``; then :func:`summarize`. An arm whose timer
    raises gets the error and leaves the rounds (its earlier rounds are not counted)."""
    live = list(timers)
    for r in range(rounds):
        for name in live[r % len(live):] + live[:r % len(live)] if live else []:
            entry = row["arms"][name]
            try:
                ms, mhz = timers[name]()
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"[:400]
                live.remove(name)
                continue
            entry.setdefault("rounds_ms", []).append(ms)
            entry.setdefault("sm_mhz", []).append(mhz)
    row.update(summarize(row["arms"]))


PROTOCOL = "@@arm "  # the prefix of a worker's protocol lines (libraries print on stdout too)


def serve_arm(name: str, preset: str, lengths: list[int], table: dict) -> int:
    """The worker of :func:`isolated_case`: build one arm, print its entry, then answer each
    ``time`` read on stdin with one ``[ms, sm_mhz]``, until stdin ends."""
    case = _Case(preset, lengths)
    entry, graph = _build_arm(name, case, case.reference(), table)
    print(PROTOCOL + json.dumps(entry), flush=True)
    for line in sys.stdin:
        if line.strip() != "time" or graph is None:
            break
        print(PROTOCOL + json.dumps([graph.ms_per_call(), sm_clock_mhz()]), flush=True)
    return 0


class Worker:
    """One arm in a process of its own (``command``), spoken to over its stdin and stdout; its
    stderr goes to ``log`` (a file opened for reading and writing), read back to say why it died."""

    def __init__(self, command: list[str], log):
        self.log = log
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, text=True)

    def reply(self):
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                return json.loads(line[len(PROTOCOL):])
        self.log.seek(0)
        last = (self.log.read().strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"its process exited with {self.proc.wait()}: {last}")

    def time(self) -> tuple[float, float | None]:
        try:
            self.proc.stdin.write("time\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: reply() says how
        return tuple(self.reply())

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the end of its stdin: the worker returns
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def isolated_case(module: str, preset: str, lengths: list[int], arms: list[str],
                  rounds: int) -> dict:
    """One shape with each arm in a process (and so a CUDA context) of its own: built one after
    the other, then timed in rotated rounds while the others wait on their stdin. Only the arm
    being timed runs on the GPU, and no arm can reach another's memory. (With all arms in one
    process, whole shapes were lost to an illegal memory access: ``docs/references.md``.)"""
    row, workers = _row(preset, lengths), {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name in arms:
                worker = Worker([sys.executable, "-m", module, "--serve-arm", name, "--cases",
                                 row["case"]], open(Path(tmp) / f"{name}.log", "w+"))
                try:
                    row["arms"][name] = worker.reply()
                except RuntimeError as exc:
                    row["arms"][name] = {"error": str(exc)[:400]}
                if "error" in row["arms"][name]:
                    worker.close()
                else:
                    workers[name] = worker
            time_rounds(row, {n: w.time for n, w in workers.items()}, rounds)
        finally:
            for worker in workers.values():
                worker.close()
    return row


def main(argv=None, extra_arms: dict | None = None,
         module: str = "mamba_edu.benchmarks.references") -> int:
    """The command line; ``extra_arms`` adds arms (name → builder, like :data:`ARMS`'s) that
    run by default too, so a caller can time its own variant beside ours (``module``: the
    module whose ``-m --serve-arm`` runs one arm in a child process)."""
    table = ARMS | (extra_arms or {})
    parser = argparse.ArgumentParser(prog="python -m mamba_edu.benchmarks.references",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT / "benchmarks" / "references.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", default=",".join(table), help="comma-separated arms")
    parser.add_argument("--cases", default=None,
                        help="comma-separated case names, e.g. 'qwen3-next 1x512' (default: all)")
    parser.add_argument("--clock-log", default=None,
                        help="where the nvidia-smi clock log of this run is kept (recorded as is)")
    parser.add_argument("--budget-s", type=float, default=1e9,
                        help="start no new case after this many seconds")
    parser.add_argument("--serve-arm", default=None, help=argparse.SUPPRESS)  # a Worker's child
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("fla").setLevel(logging.INFO)  # records which backend fla dispatched to
    arms = args.arms.split(",")
    if unknown := [a for a in arms if a not in table]:
        parser.error(f"unknown --arms {unknown}; choose from {', '.join(table)}")
    wanted = None if args.cases is None else set(args.cases.split(","))
    if args.serve_arm is not None:
        shapes = [c for c in CASES if case_name(*c) in (wanted or ())]
        if len(shapes) != 1 or args.serve_arm not in table:
            parser.error("--serve-arm takes one known arm and one --cases shape")
        return serve_arm(args.serve_arm, *shapes[0], table)
    say_where(args.out)
    versions = package_versions()
    result = dict(meta=dict(commit=commit_hash(), date=datetime.now(timezone.utc).isoformat(
        timespec="seconds"), device=torch.cuda.get_device_name(), torch=versions["torch"],
        triton=versions["triton"], clock_log=args.clock_log, versions=versions,
        rounds=args.rounds, rotate=ROTATE, instrument="CUDA graph replay between CUDA events",
        agree=AGREE, arms_in="a process per arm"), rows=[])
    start = time.monotonic()
    for preset, lengths in CASES:
        name = case_name(preset, lengths)
        if wanted is not None and name not in wanted:
            continue
        if time.monotonic() - start > args.budget_s:
            result["rows"].append(dict(case=name, skipped="time budget"))
            continue
        row = isolated_case(module, preset, lengths, arms, args.rounds)
        row["seconds"] = round(time.monotonic() - start, 1)
        result["rows"].append(row)
        print(json.dumps({k: row.get(k) for k in ("case", "ratio_best", "fastest_reference", "error")}
                         | {a: e.get("median_ms", e.get("error")) for a, e in row.get("arms", {}).items()}),
              flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
