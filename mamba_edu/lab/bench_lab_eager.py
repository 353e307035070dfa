"""Measure a lab variant of the eager forward beside the package's, with the package's own
instruments. ``ARM`` is one of :data:`ARMS`: ``workspace`` (:mod:`.workspace`, the prefill's
intermediates reused by every layer) or ``prologue`` (:mod:`.prologue_norms`, the layers' norms
and SwiGLU in the prologue of the projection after them).

``python -m mamba_edu.lab.bench_lab_eager emulate ARM [--rounds 3] [--out FILE]``: the host cost
of one eager ``fused`` forward of ``qwen3.5-tp8`` (1 × 512, bf16) in the CUDA emulation of
``python -m mamba_edu bench-host`` (:func:`mamba_edu.benchmarks.host.measure`), the package and
the arm alternated in one process over ``--rounds`` rounds: launches, torch ops and Python calls
(exact), host time (this CPU's).

``python -m mamba_edu.lab.bench_lab_eager gpu ARM [ARGS]``: ``scripts/gpu_eager_ab.py ARM [ARGS]``
(the eager GPU timing of the lean-engine A/B, one JSON line) inside the arm, so that
``scripts/gpu_lean.sh`` (``ARMS="after ARM"``) alternates it with the package's arm under the same
instrument.
"""

import argparse
import contextlib
import importlib
import json
import os
import runpy
import statistics
import sys
from pathlib import Path

from mamba_edu.benchmarks import host

# arm -> (module, context manager): imported when used, after bench-host has set Triton's mode
ARMS = {"workspace": ("mamba_edu.lab.workspace", "reused_intermediates"),
        "prologue": ("mamba_edu.lab.prologue_norms", "prologue_norms")}


def arm_context(arm: str):
    module, name = ARMS[arm]
    return getattr(importlib.import_module(module), name)()


def emulate(arm: str, rounds: int, runs: int, preset: str = "qwen3.5-tp8") -> dict:
    """``{"rounds": [...], "median_of_medians_ms": ..., "<arm>_over_package": ...}``."""
    out = []
    for r in range(rounds):
        for side in ("package", arm):
            with arm_context(arm) if side == arm else contextlib.nullcontext():
                res = host.measure(preset, strategies=("fused",), runs=runs, log=lambda *a: None)["fused"]
            out.append(dict(arm=side, round=r + 1, **res))
    med = {side: {k: statistics.median(x[k]["median"] for x in out if x["arm"] == side)
                  for k in ("host_ms", "host_ms_python")} for side in ("package", arm)}
    return {"rounds": out, "median_of_medians_ms": med,
            f"{arm}_over_package": {k: med[arm][k] / med["package"][k] for k in med["package"]}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mamba_edu.lab.bench_lab_eager",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    e = sub.add_parser("emulate")
    e.add_argument("arm", choices=ARMS)
    e.add_argument("--rounds", type=int, default=3)
    e.add_argument("--runs", type=int, default=7)
    e.add_argument("--preset", default="qwen3.5-tp8")
    e.add_argument("--out", type=Path)
    g = sub.add_parser("gpu", add_help=False)
    g.add_argument("arm", choices=ARMS)
    args, rest = p.parse_known_args(argv)
    if args.mode == "gpu":
        script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_eager_ab.py"
        sys.argv = [str(script), args.arm, *rest]
        with arm_context(args.arm):
            runpy.run_path(str(script), run_name="__main__")
        return 0
    os.environ["TRITON_INTERPRET"] = "0"  # the emulation runs Triton's real launch path (bench-host)
    host._check_triton_mode()
    out = args.out or Path(f"out/bench/host_lab_{args.arm}.json")
    result = dict(meta=dict(host.stamp(), preset=args.preset, lengths=[512], dtype="bfloat16",
                            command=f"python -m mamba_edu.lab.bench_lab_eager emulate {args.arm} "
                                    f"--rounds {args.rounds} --runs {args.runs} --preset {args.preset}",
                            method=f"bench-host's emulation (fused), the package and the lab's {args.arm} "
                                   "arm alternated in one process"),
                  **emulate(args.arm, args.rounds, args.runs, args.preset))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for x in result["rounds"]:
        print(f"round {x['round']} {x['arm']:>9}: {x['launches']} launches, {x['gpu_ops']} GPU ops, "
              f"{x['torch_ops_by_kind']['allocs']} allocations, {x['py_calls']} Python calls, "
              f"host {x['host_ms']['median']} ms, Python {x['host_ms_python']['median']} ms")
    print(f"{args.arm} / package: {result[f'{args.arm}_over_package']}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
