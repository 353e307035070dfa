"""Turn one run of ``scripts/gpu_lean.sh`` (its ``lean.tgz``, unpacked) into a stamped ``data/``
file: the rounds in run order, the median of each arm's round medians, after/before and each
lab arm over after (at 1 x 512; with SHAPES, every shape's medians too).

    python scripts/collect_eager_ab.py DIR --commit C --before-commit B --gpu-tests "..." \\
        --out data/bench/lean_eager_<device>_<C>.json
    python scripts/collect_eager_ab.py DIR --commit C --gpu-tests "..." \\
        --out data/bench/lab_<arm>_eager_<device>_<C>.json     (ARMS="after <arm>")

``DIR`` holds ``eager_ab.jsonl`` and ``gpu_clocks.csv``; the clock log is copied beside the JSON.
"""

import argparse
import datetime
import json
import shutil
import statistics
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir", type=Path)
    p.add_argument("--commit", required=True)
    p.add_argument("--before-commit", help="the before arm's commit, when the run has one")
    p.add_argument("--gpu-tests", required=True, help="one line: what the GPU tests of the session gave")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    rounds = [json.loads(line) for line in (args.dir / "eager_ab.jsonl").read_text().splitlines() if line]
    for r in rounds:
        r.setdefault("shape", "1x512")  # runs before SHAPES timed 1 x 512 only
    arms = list(dict.fromkeys(r["arm"] for r in rounds))  # in run order: before, after[, lab arm]
    shapes = list(dict.fromkeys(r["shape"] for r in rounds))
    by_shape = {shape: {arm: statistics.median(r["median_ms"] for r in rounds
                                               if r["arm"] == arm and r["shape"] == shape) for arm in arms}
                for shape in shapes}
    medians = by_shape["1x512"]
    clocks = args.out.with_name(args.out.stem + "_clocks.csv")
    shutil.copy(args.dir / "gpu_clocks.csv", clocks)
    arms_env = "" if arms == ["before", "after"] else 'ARMS="' + " ".join(arms) + '" '
    shapes_env = "" if shapes == ["1x512"] else 'SHAPES="' + " ".join(shapes) + '" '
    n_rounds = len(rounds) // (len(arms) * len(shapes))
    meta = dict(
        commit=args.commit, before_commit=args.before_commit,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=rounds[0]["device"], torch=rounds[0].get("torch"), triton=rounds[0].get("triton"),
        clock_log=str(clocks.resolve().relative_to(DATA)) if clocks.resolve().is_relative_to(DATA) else str(clocks),
        command=f"OUT=... {arms_env}{shapes_env}ROUNDS={n_rounds} bash scripts/gpu_lean.sh" + (
            f" (the before arm: git archive {args.before_commit} mamba_edu into .before/, carried)"
            if "before" in arms else ""),
        method=f"eager fused prefill of qwen3.5-tp8, requests x tokens {', '.join(shapes)}, bf16: "
               "wall time of a synchronized engine.forward_prefill, median of 30 after 5 warm-ups, "
               f"one process per arm and shape, arms alternated over {n_rounds} rounds",
        gpu_tests=args.gpu_tests)
    out = dict(meta=meta, rounds=[{k: v for k, v in r.items() if k != "package"} for r in rounds],
               median_of_medians_ms=medians)
    if "before" in medians:
        out["after_over_before"] = medians["after"] / medians["before"]
    for arm in set(arms) - {"before", "after"}:  # a lab arm against the package at the same commit
        out[f"{arm}_over_after"] = medians[arm] / medians["after"]
    if shapes != ["1x512"]:  # the keys above are 1 x 512's; every shape's medians here
        out["median_of_medians_ms_by_shape"] = by_shape
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(args.out, {arm: round(ms, 2) for arm, ms in medians.items()},
          {k: round(v, 3) for k, v in out.items() if k.endswith("_over_before") or k.endswith("_over_after")})


if __name__ == "__main__":
    main()
