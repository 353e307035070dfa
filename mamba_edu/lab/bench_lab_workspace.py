"""Measure the lab's reused intermediates (:mod:`.workspace`) beside the package's allocations,
with the package's own instruments.

``python -m mamba_edu.lab.bench_lab_workspace emulate [--rounds 3] [--out FILE]``: the host cost
of one eager ``fused`` forward of ``qwen3.5-tp8`` (1 × 512, bf16) in the CUDA emulation of
``python -m mamba_edu bench-host`` (:func:`mamba_edu.benchmarks.host.measure`), the two arms
alternated in one process over ``--rounds`` rounds: torch allocations and Python calls (exact),
host time (this CPU's).

``python -m mamba_edu.lab.bench_lab_workspace gpu [ARGS]``: ``scripts/gpu_eager_ab.py workspace
[ARGS]`` (the eager GPU timing of the lean-engine A/B, one JSON line) with reused intermediates,
so that ``scripts/gpu_lean.sh`` (``ARMS="after workspace"``) alternates it with the package's arm
under the same instrument.
"""

import argparse
import contextlib
import json
import os
import runpy
import statistics
import sys
from pathlib import Path

from mamba_edu.benchmarks import host

ARMS = ("package", "workspace")


def emulate(rounds: int, runs: int, preset: str = "qwen3.5-tp8") -> dict:
    """``{"rounds": [...], "median_of_medians_ms": ..., "workspace_over_package": ...}``."""
    from mamba_edu.lab.workspace import reused_intermediates  # the kernels, after bench-host's mode is set
    out = []
    for r in range(rounds):
        for arm in ARMS:
            with reused_intermediates() if arm == "workspace" else contextlib.nullcontext():
                res = host.measure(preset, strategies=("fused",), runs=runs, log=lambda *a: None)["fused"]
            out.append(dict(arm=arm, round=r + 1, **res))
    med = {arm: {k: statistics.median(x[k]["median"] for x in out if x["arm"] == arm)
                 for k in ("host_ms", "host_ms_python")} for arm in ARMS}
    return dict(rounds=out, median_of_medians_ms=med,
                workspace_over_package={k: med["workspace"][k] / med["package"][k] for k in med["package"]})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mamba_edu.lab.bench_lab_workspace",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    e = sub.add_parser("emulate")
    e.add_argument("--rounds", type=int, default=3)
    e.add_argument("--runs", type=int, default=7)
    e.add_argument("--preset", default="qwen3.5-tp8")
    e.add_argument("--out", type=Path, default=Path("out/bench/host_lab_workspace.json"))
    sub.add_parser("gpu", add_help=False)
    args, rest = p.parse_known_args(argv)
    if args.mode == "gpu":
        script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_eager_ab.py"
        sys.argv = [str(script), "workspace", *rest]
        from mamba_edu.lab.workspace import reused_intermediates
        with reused_intermediates():
            runpy.run_path(str(script), run_name="__main__")
        return 0
    os.environ["TRITON_INTERPRET"] = "0"  # the emulation runs Triton's real launch path (bench-host)
    host._check_triton_mode()
    result = dict(meta=dict(host.stamp(), preset=args.preset, lengths=[512], dtype="bfloat16",
                            command="python -m mamba_edu.lab.bench_lab_workspace emulate "
                                    f"--rounds {args.rounds} --runs {args.runs} --preset {args.preset}",
                            method="bench-host's emulation (fused), the package's allocations and the "
                                   "lab's reused intermediates alternated in one process"),
                  **emulate(args.rounds, args.runs, args.preset))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for x in result["rounds"]:
        print(f"round {x['round']} {x['arm']:>9}: {x['torch_ops_by_kind']['allocs']} allocations, "
              f"{x['py_calls']} Python calls, host {x['host_ms']['median']} ms, Python {x['host_ms_python']['median']} ms")
    print(f"workspace / package: {result['workspace_over_package']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
