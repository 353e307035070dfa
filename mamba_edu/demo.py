"""``python -m mamba_edu demo``: the main job on the default device, as a short readable report.

1. The math: the chunked (WY) GDN form against the token-by-token recurrence.
2. The lesson: the four tracking strategies side by side on one prefill — syncs per forward
   (counted by the sniffer), median time, and the pools they leave (identical).
3. The picture: the CPU/GPU timeline of one prefill per strategy, recorded live on a GPU or,
   without one, drawn from the H200 traces committed in the repository's ``data/runs/``
   (``--traces DIR`` points at a copy). Where there are none (an installed wheel), from this
   run's own CPU traces. The printed line and the figure's title say which.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from mamba_edu._cli import (DEVICES, HelpFormatter, check_out_dir, positive_int, prog_name,
                            resolve_device, say, wrap)
from mamba_edu._runtime import data_dir
from mamba_edu.gdn import chunk_gated_delta_rule, cu_offsets, gdn_gating, recurrent_gated_delta_rule
from mamba_edu.model.config import PRESETS
from mamba_edu.serving import STRATEGIES
from mamba_edu.testing import rel_err
H200_RUNS = data_dir() / "runs"
H200_CASE = "launch_bound_1x512"
# The job per device: (preset, prompt lengths). On a CPU a tiny model in the Triton interpreter.
DEFAULT_JOB = {"cuda": ("qwen3.5-tp8", (512,)), "cpu": ("tiny", (130, 200, 40))}
CPU_TIMING_NOTE = ("   CPU timings: nothing waits for a GPU here, so the syncs are counted but cost "
                   "nothing, and\n   the milliseconds vary from run to run (other processes, "
                   "caches): compare the syncs, not the times.")


def reference_report(device: torch.device, seed: int = 0) -> dict:
    """Recurrent vs chunked GDN on one packed batch: 4 sequences (1, 63, 64, 200 tokens),
    H=2 key / HV=4 value heads, K=V=32, Qwen3-Next gating, q/k L2 norm, random initial states."""
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
    per strategy is also recorded there. ``progress`` shows a tqdm bar (one step per forward).
    """
    from mamba_edu.benchmarks.timing import Prefills, median_ms
    from mamba_edu.engine import Engine
    from mamba_edu.model import build_model
    from mamba_edu.profiling import count_syncs, record_trace
    from tqdm import tqdm

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(preset, device=device, dtype=dtype, seed=seed)
    rows, pools = [], []
    per_strategy = 2 + repeats + (3 if trace_dir is not None else 0)  # record_trace: 3 calls
    bar = tqdm(total=len(STRATEGIES) * per_strategy, desc="   forwards", unit="fwd",
               disable=not progress, leave=False, file=sys.stdout)
    for strategy in STRATEGIES:
        bar.set_postfix_str(strategy)
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
    """The folder of committed H200 traces of :data:`H200_CASE` under ``traces`` (a ``runs``
    folder holding ``launch_bound_1x512/``, or that case folder itself), or ``None``."""
    for folder in (traces / H200_CASE, traces):
        if (folder / "naive.pt.trace.json.gz").exists():
            return folder
    return None


def timeline_figure(out: Path, trace_dir: Path | None, traces: Path = H200_RUNS,
                    device_type: str = "cuda") -> tuple[Path, str] | None:
    """The per-strategy timeline and where its traces come from: live traces in ``trace_dir``
    (this run's, on ``device_type``), else the committed H200 ones found under ``traces`` (see
    :func:`committed_traces`); ``None`` when there are none."""
    from mamba_edu.profiling import analyze_trace
    from mamba_edu.profiling.plots import plot_timelines

    live = trace_dir is not None
    if live:
        files = {s: trace_dir / f"{s}.json.gz" for s in STRATEGIES}
        if device_type == "cuda":
            title = source = "recorded live by this run on this GPU"
        else:
            title = "recorded live by this run on the CPU: CPU ops only, no GPU"
            source = (f"drawn from this run's own CPU traces ({trace_dir}): CPU ops and host "
                      "syncs only, no GPU timeline. The H200 figure needs the repository's "
                      "data/runs/ (--traces DIR)")
    else:  # the bench also recorded the graph-replayed sync-free strategies
        folder = committed_traces(traces)
        if folder is None:
            return None
        names = ["naive", "precomputed", "sync_free", "sync_free_graph", "fused", "fused_graph"]
        files = {n.replace("_graph", "+graph"): folder / f"{n}.pt.trace.json.gz" for n in names}
        title = f"{H200_CASE}, committed traces recorded on an H200, not this run"
        source = (f"drawn from the committed H200 traces in {folder} (preset qwen3.5-tp8, one "
                  "512-token prompt), not from this run")
    analyses = [analyze_trace(f, label=label) for label, f in files.items() if f.exists()]
    if not analyses:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / "timeline.png"
    plot_timelines(analyses, path, title=f"one prefill per strategy ({title})")
    return path, source


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The demo's options (shared by ``mamba-edu demo`` and ``python -m mamba_edu.demo``)."""
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where to run; auto = cuda when a GPU is visible, else cpu")
    parser.add_argument("--preset", choices=["auto", *PRESETS], default="auto",
                        help="model preset; auto = qwen3.5-tp8 (one 512-token prompt) on a GPU, "
                             "tiny (prompts of 130, 200, 40 tokens) on a CPU")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed forwards per strategy (the median is shown)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"),
                        help="folder for the figure (and live traces on a GPU)")
    parser.add_argument("--traces", type=Path, default=H200_RUNS, metavar="DIR",
                        help="committed H200 traces to draw when no GPU records live ones: a runs "
                             f"folder holding {H200_CASE}/ (default: the repository's data/runs "
                             "when run from a clone; none in an installed wheel)")
    parser.add_argument("--tp", type=positive_int, default=1, metavar="N",
                        help="tensor parallelism: N > 1 starts N ranks on this machine (gloo on the "
                             "CPU, NCCL on N GPUs) and checks them against the 1-rank model instead "
                             "(preset auto = tiny; docs/tensor_parallel.md)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar (it is also off when stdout is not a terminal)")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Usage errors (exit 2) before any work: the device, the output folder."""
    args.device = resolve_device(parser, args.device)
    check_out_dir(parser, args.out)
    if args.tp > 1:
        check_tp_args(parser, args)
    elif args.preset != "auto":
        check_fits(parser, args.preset, args.device)
    return args


def check_fits(parser: argparse.ArgumentParser, preset: str, device: torch.device) -> None:
    """A usage error, before anything is allocated, when the preset's weights alone exceed the
    memory the device has free."""
    from mamba_edu._runtime import free_memory_bytes
    from mamba_edu.model.hybrid import weight_bytes

    need = weight_bytes(preset, torch.bfloat16 if device.type == "cuda" else torch.float32)
    have = free_memory_bytes(device)
    if have is not None and need > have:
        parser.error(f"--preset {preset} needs about {need / 2**30:.1f} GiB for its weights alone, and "
                     f"{device.type} has {have / 2**30:.1f} GiB free: use --preset tiny (or qwen3.5-tp8, "
                     f"one GPU's slice of Qwen3.5)")


def check_tp_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--tp N``: N must split the preset's heads, MLP and vocabulary, and on CUDA be at most
    the GPUs visible (one rank per GPU)."""
    from mamba_edu.model.config import get_config
    from mamba_edu.tp import check_tp

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
    device = args.device
    on_gpu = device.type == "cuda"
    preset, lengths = DEFAULT_JOB[device.type]
    if args.preset != "auto":
        preset = args.preset
    progress = args.progress and sys.stdout.isatty()

    say(f"mamba_edu demo on {device}")
    ref = reference_report(device)
    say(f"\n1. GDN math: chunked (WY) form vs token-by-token recurrence, lengths {ref['lengths']}: "
        f"max relative error {ref['err']:.1e} -> {'PASS' if ref['err'] < 1e-5 else 'FAIL'}")

    say(f"\n2. Tracking strategies on preset {preset!r}, prompts {list(lengths)}, "
        f"median of {args.repeats} forwards:")
    # Live traces on a GPU; on a CPU only where no committed H200 traces are found (a wheel).
    own_traces = on_gpu or committed_traces(args.traces) is None
    trace_dir = args.out / "traces" if own_traces else None
    rows = strategy_report(device, preset, lengths, args.repeats, trace_dir, progress=progress)
    say(f"   {'strategy':<12} {'tracked':>7} {'syncs/forward':>13} {'forward ms':>10}  "
        "pools vs naive's (max relative error)")
    for r in rows:
        say(f"   {r['strategy']:<12} {r['tracked']:>7} {r['syncs']:>13} {r['ms']:>10.1f}  "
            f"{'same' if r['pools_match_naive'] else 'DIFFERENT'} ({r['err']:.1e})")
    if not on_gpu:
        say(CPU_TIMING_NOTE)

    figure = timeline_figure(args.out, trace_dir, args.traces, device.type)
    if figure is not None:
        path, source = figure
        say(f"\n3. Timeline figure: {path}\n   {source}")
    else:
        say(f"\n3. Timeline figure: skipped, no H200 traces in {args.traces} and no traces of "
            "this run. The H200 ones are in the repository's data/runs/ (a clone), not in an "
            "installed wheel: pass --traces DIR pointing at a copy of data/runs, or run on a GPU "
            "to record live ones.")
    by = {r["strategy"]: r for r in rows}
    ok = (ref["err"] < 1e-5 and all(r["pools_match_naive"] for r in rows)
          and by["naive"]["syncs"] > by["precomputed"]["syncs"] > 0
          and by["sync_free"]["syncs"] == by["fused"]["syncs"] == 0)
    say("\nPASS: same states from every strategy; syncs drop from per layer to none" if ok
        else "\nFAIL: see the table above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
