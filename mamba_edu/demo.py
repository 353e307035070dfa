"""``python -m mamba_edu demo``: the main job on the default device, as a short readable report.

1. The math: the chunked (WY) GDN form against the token-by-token recurrence.
2. The lesson: the four tracking strategies side by side on one prefill — syncs per forward
   (counted by the sniffer), median time, and the pools they leave (identical).
3. The picture: the CPU/GPU timeline of one prefill per strategy, recorded by this run and
   titled with its device (``--traces DIR`` draws a folder of recorded traces instead, e.g. the
   repository's ``data/runs``). The report ends with the files written and what each shows.

Heavy imports (torch, the model, the engine) sit inside the functions that use them, so that
``demo --help`` answers at once.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

from mamba_edu._cli import (DEVICES, PRESET_NAMES, STRATEGY_NAMES, HelpFormatter, check_out_dir,
                            positive_int, prog_name, resolve_device, say, wrap)

CASE = "launch_bound_1x512"  # the case folder --traces looks for in a runs folder
# The job per device: (preset, prompt lengths). On a CPU a tiny model in the Triton interpreter.
DEFAULT_JOB = {"cuda": ("qwen3.5-tp8", (512,)), "cpu": ("tiny", (130, 200, 40))}
CPU_TIMING_NOTE = ("   CPU timings: nothing waits for a GPU here, so the syncs are counted but cost "
                   "nothing, and\n   the milliseconds vary from run to run (other processes, "
                   "caches): compare the syncs, not the times.")


def reference_report(device: torch.device, seed: int = 0) -> dict:
    """Recurrent vs chunked GDN on one packed batch: 4 sequences (1, 63, 64, 200 tokens),
    H=2 key / HV=4 value heads, K=V=32, Qwen3-Next gating, q/k L2 norm, random initial states."""
    import torch

    from mamba_edu.gdn import (chunk_gated_delta_rule, cu_offsets, gdn_gating,
                               recurrent_gated_delta_rule)
    from mamba_edu.testing import rel_err

    gen = torch.Generator().manual_seed(seed)
    lengths = [1, 63, 64, 200]
    T, H, HV, K, V = sum(lengths), 2, 4, 32, 32
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(device)  # noqa: E731
    q, k, v = rand(T, H, K), rand(T, H, K), rand(T, HV, V)
    g, beta = gdn_gating(rand(HV), rand(T, HV), rand(T, HV), rand(HV))
    cu = torch.tensor(cu_offsets(lengths), device=device)
    kw = dict(cu_seqlens=cu, initial_state=rand(len(lengths), HV, K, V) * 0.1,
              use_qk_l2norm=True, output_checkpoints=True)
    ref = recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    out = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    return {"lengths": lengths, "err": max(rel_err(out.o, ref.o),
                                           rel_err(out.final_state, ref.final_state),
                                           rel_err(out.checkpoints, ref.checkpoints))}


def strategy_report(device: torch.device, preset: str, lengths: tuple[int, ...], repeats: int,
                    trace_dir: Path | None, seed: int = 0, progress: bool = False) -> list[dict]:
    """Tracked prefills per strategy: syncs per forward, median forward time, the pools left.

    Every strategy sees the same sequence of fresh batches (no prefix hits), so their pools must
    end up the same outside the scratch slot 0: bit-identical, except ``fused`` on a GPU. Its
    output kernel reads the chunk states in bf16 instead of fp32 checkpoints, so each GDN layer's
    output differs in the last bits and the difference grows layer by layer: on the H200 the SSM
    states differed by 4e-3 (relative) after the second GDN layer and 1.9e-2 over all 45 (logits
    1.8e-2); it is compared with :data:`FUSED_GPU_TOL`. With ``trace_dir`` (on a GPU) one forward
    per strategy is also recorded there. ``progress`` shows a tqdm bar (one step per forward);
    without it (a pipe, a log) one line per strategy says what runs.
    """
    import torch
    from tqdm import tqdm

    from mamba_edu.benchmarks.timing import Prefills, median_ms
    from mamba_edu.engine import Engine
    from mamba_edu.model import build_model
    from mamba_edu.profiling import count_syncs, record_trace
    from mamba_edu.serving import STRATEGIES
    from mamba_edu.testing import rel_err

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    say(f"   building the {preset!r} model ({dtype}) on {device}")
    model = build_model(preset, device=device, dtype=dtype, seed=seed)
    rows, pools = [], []
    per_strategy = 2 + repeats + (3 if trace_dir is not None else 0)  # record_trace: 3 calls
    bar = tqdm(total=len(STRATEGIES) * per_strategy, desc="   forwards", unit="fwd",
               disable=not progress, leave=False, file=sys.stdout)
    for strategy in STRATEGIES:
        bar.set_postfix_str(strategy)
        if not progress:
            say(f"   {strategy}: {per_strategy} forwards (warm-up, sync count, {repeats} timed"
                f"{', 3 profiled' if trace_dir is not None else ''})")
        prefills = Prefills(Engine(model, strategy=strategy, max_requests=len(lengths)), lengths, seed)

        def fresh(prefills=prefills):  # the next batch, one tick of the bar per forward
            bar.update()
            return prefills.next()

        prefills.forward(fresh())  # warm-up: Triton compiles on first use
        batch = fresh()
        with count_syncs() as syncs:
            prefills.forward(batch)
        ms = median_ms(prefills.forward, fresh, repeats)
        if trace_dir is not None:
            record_trace(prefills.forward, trace_dir, strategy, setup=fresh)
        prefills.close()
        pool = prefills.engine.pool
        pools.append([pool.conv[:, 1:].clone(), pool.ssm[:, 1:].clone()])
        err = max(rel_err(a, b) for a, b in zip(pools[-1], pools[0]))
        exact = strategy != "fused" or device.type == "cpu"
        rows.append({"strategy": strategy, "syncs": syncs.count, "ms": ms,
                     "tracked": sum(batch.track_mask), "err": err,
                     "pools_match_naive": err == 0 if exact else err <= FUSED_GPU_TOL})
    bar.close()
    return rows


FUSED_GPU_TOL = 5e-2  # bf16 chunk states in the output kernel, compounded over 45 GDN layers


def committed_traces(traces: Path) -> Path | None:
    """The folder of recorded traces under ``traces``: a runs folder holding :data:`CASE`, or a
    folder of ``*.pt.trace.json.gz`` itself; ``None`` when there are none."""
    for folder in (traces / CASE, traces):
        if any(folder.glob("*.pt.trace.json.gz")):
            return folder
    return None


def device_name(device: torch.device) -> str:
    """What the figure's title names: the GPU's model, or the CPU's architecture and cores."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def timeline_figure(out: Path, files: list[Path], title: str) -> Path | None:
    """``out/timeline.png``: one prefill per trace in ``files`` (those that exist), one row
    each, labelled with its strategy; ``None`` when none exists."""
    from mamba_edu.profiling import analyze_trace
    from mamba_edu.profiling.plots import plot_timelines
    from mamba_edu.profiling.summary import label_of

    analyses = [analyze_trace(f, label=label_of(f)) for f in files if f.exists()]
    if not analyses:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / "timeline.png"
    plot_timelines(analyses, path, title=title)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The demo's options (shared by ``mamba-edu demo`` and ``python -m mamba_edu.demo``)."""
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where to run; auto = cuda when a GPU is visible, else cpu")
    parser.add_argument("--preset", choices=["auto", *PRESET_NAMES], default="auto",
                        help="model preset; auto = qwen3.5-tp8 (one 512-token prompt) on a GPU, "
                             "tiny (prompts of 130, 200, 40 tokens) on a CPU")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed forwards per strategy (the median is shown)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"),
                        help="folder for the figure and this run's traces")
    parser.add_argument("--traces", type=Path, default=None, metavar="DIR",
                        help="draw these recorded traces instead of this run's: a folder of "
                             f"*.pt.trace.json.gz, or a runs folder holding {CASE}/ (the "
                             "repository's data/runs: an older H200 run); default: this run's")
    parser.add_argument("--tp", type=positive_int, default=1, metavar="N",
                        help="tensor parallelism: N > 1 starts N ranks on this machine (gloo on the "
                             "CPU, NCCL on N GPUs) and checks them against the 1-rank model instead "
                             "(preset auto = tiny; docs/tensor_parallel.md)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar, one line per strategy instead (also when stdout is "
                             "not a terminal)")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Usage errors (exit 2) before any work: the device, the output folder, the traces to
    draw, and whether the preset fits the device's free memory."""
    args.device = resolve_device(parser, args.device)
    check_out_dir(parser, args.out)
    if args.traces is not None:
        if not args.traces.exists():
            parser.error(f"--traces {args.traces}: no such folder")
        if committed_traces(args.traces) is None:
            parser.error(f"--traces {args.traces}: no *.pt.trace.json.gz in it or in {CASE}/ under it")
    if args.tp > 1:
        check_tp_args(parser, args)
    else:
        args.preset = DEFAULT_JOB[args.device.type][0] if args.preset == "auto" else args.preset
        check_fits(parser, args.preset, args.device)
    return args


def check_fits(parser: argparse.ArgumentParser, preset: str, device: torch.device) -> None:
    """A usage error, before anything is allocated, when the preset's weights alone exceed the
    memory the device has free (sized on a model without data: no memory is taken)."""
    import torch

    from mamba_edu._runtime import free_memory_bytes
    from mamba_edu.model.hybrid import weight_bytes

    need = weight_bytes(preset, torch.bfloat16 if device.type == "cuda" else torch.float32)
    have, where = free_memory_bytes(device), device.type
    if device.type == "cpu" and (limited := cgroup_memory_free()) is not None:
        if have is None or limited < have:  # a container's limit, below what the host has free
            have, where = limited, "cpu (this container's memory limit)"
    if have is not None and need > have:
        parser.error(f"--preset {preset} needs about {need / 2**30:.1f} GiB for its weights alone, and "
                     f"{where} has {have / 2**30:.1f} GiB free: use --preset tiny (or qwen3.5-tp8, "
                     f"one GPU's slice of Qwen3.5)")


CGROUP_ROOT = Path("/sys/fs/cgroup")    # where the cgroup file systems are mounted
PROC_CGROUP = Path("/proc/self/cgroup")  # this process's cgroup, one line per hierarchy
NO_LIMIT = 2**60                         # cgroup v1 writes "no limit" as a number near 2**63


def cgroup_memory_free(root: Path | None = None, proc_cgroup: Path | None = None) -> int | None:
    """Bytes this process's memory cgroup (a container's ``--memory``) can still take: its limit
    less what it uses, page cache it can drop (``inactive_file``) not counted; the lowest over the
    cgroup and its ancestors, which limit it too. cgroup v2 (``memory.max``, ``memory.current``)
    and v1 (``memory/…/memory.limit_in_bytes``, ``memory.usage_in_bytes``). None where no limit is
    set or none can be read. ``/proc/meminfo``'s ``MemAvailable`` is the host's: a container sees
    the host's memory there, not its own limit."""
    root = CGROUP_ROOT if root is None else Path(root)
    proc_cgroup = PROC_CGROUP if proc_cgroup is None else Path(proc_cgroup)
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    folders = []  # (folder, limit file, usage file, inactive page cache key of memory.stat)
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            folders.append((root, path, "memory.max", "memory.current", "inactive_file"))
        elif "memory" in controllers.split(","):
            folders.append((root / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                            "total_inactive_file"))
    if not lines:  # nothing says where: the mount points themselves (a container's own cgroup)
        folders = [(root, "/", "memory.max", "memory.current", "inactive_file"),
                   (root / "memory", "/", "memory.limit_in_bytes", "memory.usage_in_bytes",
                    "total_inactive_file")]
    lowest = None
    for mount, path, limit_name, usage_name, cache_key in folders:
        # The cgroup's folder and every ancestor up to the mount point; inside a container the
        # path of /proc/self/cgroup may not exist under the mount, whose top is then its cgroup.
        parts = [p for p in path.strip("/").split("/") if p]
        for depth in range(len(parts), -1, -1):
            folder = mount.joinpath(*parts[:depth])
            limit = _read_int(folder / limit_name)
            if limit is None or limit >= NO_LIMIT:
                continue
            used = _read_int(folder / usage_name) or 0
            used -= _memory_stat(folder / "memory.stat", cache_key)
            free = max(limit - max(used, 0), 0)
            lowest = free if lowest is None else min(lowest, free)
    return lowest


def _read_int(path: Path) -> int | None:
    """The number in a cgroup file; None for ``max`` (no limit) or an unreadable file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _memory_stat(path: Path, key: str) -> int:
    """One entry of a cgroup's ``memory.stat`` (0 where absent)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def check_tp_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--tp N``: N must split the preset's heads, MLP and vocabulary, and on CUDA be at most
    the GPUs visible (one rank per GPU)."""
    from mamba_edu.model.config import get_config
    from mamba_edu.tp import check_tp

    import torch

    preset = "tiny" if args.preset == "auto" else args.preset
    if reasons := check_tp(get_config(preset), args.tp):
        parser.error(f"--tp {args.tp} does not fit preset {preset!r}: " + "; ".join(reasons))
    if args.device.type == "cuda" and args.tp > torch.cuda.device_count():
        parser.error(f"--tp {args.tp}: one GPU per rank, and torch sees {torch.cuda.device_count()} "
                     "GPU(s) here; use --tp <= that, or --device cpu (gloo ranks)")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog or f"{prog_name()} demo", description=wrap(DESCRIPTION),
                                     formatter_class=HelpFormatter)
    return add_arguments(parser)


DESCRIPTION = ("The main job as a short readable report: the GDN math checked, the four tracking "
               "strategies side by side (syncs, time, pools), and a timeline figure. "
               "Exit 0 when every check passes, 1 when one fails, 2 on a usage error.")


def main(argv=None) -> int:
    parser = build_parser()
    return run(check_args(parser, parser.parse_args(argv)))


def run(args: argparse.Namespace) -> int:
    """The demo on checked arguments (see :func:`check_args`); returns the exit code."""
    if args.tp > 1:
        from mamba_edu.tp.check import report

        return report(args.tp, args.device.type, "tiny" if args.preset == "auto" else args.preset)
    device, preset = args.device, args.preset
    lengths = DEFAULT_JOB[device.type][1]
    say(f"mamba_edu demo on {device}")
    say("\n1. GDN math: chunked (WY) form vs token-by-token recurrence")
    ref = reference_report(device)
    say(f"   lengths {ref['lengths']}: max relative error {ref['err']:.1e} -> "
        f"{'PASS' if ref['err'] < 1e-5 else 'FAIL'}")

    say(f"\n2. Tracking strategies on preset {preset!r}, prompts {list(lengths)}, "
        f"median of {args.repeats} forwards:")
    trace_dir = args.out / "traces" if args.traces is None else None
    rows = strategy_report(device, preset, lengths, args.repeats, trace_dir,
                           progress=args.progress and sys.stdout.isatty())
    print_rows(rows, device)

    say("\n3. Timeline figure")
    written = draw(args, trace_dir)
    ok = passed(ref, rows)
    say("\nPASS: same states from every strategy; syncs drop from per layer to none" if ok
        else "\nFAIL: see the table above")
    say("\nFiles written:" if written else "\nNo files written.")
    for path, what in written:
        say(f"   {path}  {what}")
    return 0 if ok else 1


def print_rows(rows: list[dict], device: torch.device) -> None:
    """The strategy table of step 2 (and, on a CPU, why its times do not rank the strategies)."""
    say(f"   {'strategy':<12} {'tracked':>7} {'syncs/forward':>13} {'forward ms':>10}  "
        "pools vs naive's (max relative error)")
    for r in rows:
        say(f"   {r['strategy']:<12} {r['tracked']:>7} {r['syncs']:>13} {r['ms']:>10.1f}  "
            f"{'same' if r['pools_match_naive'] else 'DIFFERENT'} ({r['err']:.1e})")
    if device.type == "cpu":
        say(CPU_TIMING_NOTE)


def draw(args: argparse.Namespace, trace_dir: Path | None) -> list[tuple[Path, str]]:
    """Step 3: the timeline of this run's traces in ``trace_dir``, or of ``--traces``; returns
    the files written, each with what it shows."""
    if trace_dir is not None:
        where = device_name(args.device)
        files = [trace_dir / f"{s}.json.gz" for s in STRATEGY_NAMES]
        title = f"one prefill per strategy, recorded by this run on {where}"
    else:
        folder = committed_traces(args.traces)
        files = sorted(folder.glob("*.pt.trace.json.gz"))
        title = f"one prefill per trace in {folder}, not this run"
    path = timeline_figure(args.out, files, title)
    say(f"   {title}" + ("" if path is not None else ": no traces, no figure"))
    if path is None:
        return []
    gpu = args.device.type == "cuda" or trace_dir is None
    shows = ("the GPU busy and idle per strategy, the host syncs marked" if gpu else
             "CPU ops and host syncs per strategy: there is no GPU lane on a CPU")
    written = [(path, f"the timeline: {shows}")]
    if trace_dir is not None:
        written.append((trace_dir, "the profiler traces drawn there (one per strategy): "
                                   f"{prog_name()} trace {trace_dir}, or https://ui.perfetto.dev"))
    return written


def passed(ref: dict, rows: list[dict]) -> bool:
    """Every check of the report: the math, the pools, the syncs falling from per layer to none."""
    by = {r["strategy"]: r for r in rows}
    return (ref["err"] < 1e-5 and all(r["pools_match_naive"] for r in rows)
            and by["naive"]["syncs"] > by["precomputed"]["syncs"] > 0
            and by["sync_free"]["syncs"] == by["fused"]["syncs"] == 0)


if __name__ == "__main__":
    sys.exit(main())
