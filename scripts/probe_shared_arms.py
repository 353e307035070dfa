"""Which arm's graph reads freed or foreign memory when two arms share one process?

``python scripts/probe_shared_arms.py --case "qwen3-next 16x256" --arms fla_triton,flashqla
[--own-inputs] --log probe.jsonl``

The reference benchmark (``mamba_edu.benchmarks.references``) lost whole shapes to a CUDA illegal
memory access whenever two or more arms were captured in one process. This probe builds the arms
as the benchmark does (shared ``_Case`` unless ``--own-inputs`` gives each arm its own copy),
and writes one JSON line per step, flushed at once, so that the last line of the log names the
step a crash ended:

- after each arm is built and captured: whether any input of the case changed (a checksum of
  ``cu_seqlens`` and of every input tensor), i.e. whether an arm writes into what others read;
- then each arm's graph replayed alone, 20 times, synchronised after each replay.

The fla identity cache's size comes from ``FLA_TENSOR_CACHE_SIZE`` (fla reads it at import), so
a run with it raised tests the hypothesis that an evicted cache entry is what a graph reads.
"""

import argparse
import json
import os
import sys

import torch

from mamba_edu.benchmarks import references as refs


def _checksum(case) -> list[float]:
    parts = [case.cu.double().sum(), case.h0.double().sum()]
    from mamba_edu.kernels.metadata import _PRIVATE_ATTR
    for t in case.indices.values():  # and the private twin the kernels read
        if torch.is_tensor(t):
            parts += [t.double().sum(), getattr(t, _PRIVATE_ATTR, t).double().sum()]
    for meta in (case.meta, case.meta._kernel):  # the kernels read private twins (_kernel)
        parts += [getattr(meta, f).double().sum() for f in ("cu_seqlens", "chunk_indices",
                                                            "chunk_offsets") if meta is not None]
    for x in case.sets:
        parts += [t.double().abs().sum() for t in x.values() if torch.is_tensor(t)]
    return [float(p) for p in parts]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--case", required=True)
    p.add_argument("--arms", required=True)
    p.add_argument("--own-inputs", action="store_true")
    p.add_argument("--eager-after", action="store_true",
                   help="capture the first arm only; run the others eagerly, uncaptured")
    p.add_argument("--eager", action="store_true",
                   help="capture nothing: every arm runs eagerly (for compute-sanitizer with "
                        "PYTORCH_NO_CUDA_MEMORY_CACHING=1, where each tensor is its own cudaMalloc)")
    p.add_argument("--log", required=True)
    args = p.parse_args()
    preset, shape = args.case.split(" ")
    n, length = (int(v) for v in shape.split("x"))
    log = open(args.log, "a")

    def say(**fields):
        fields |= dict(case=args.case, arms=args.arms, own_inputs=args.own_inputs,
                       eager_after=args.eager_after, eager=args.eager,
                       fla_cache=os.environ.get("FLA_TENSOR_CACHE_SIZE", "4"))
        log.write(json.dumps(fields) + "\n")
        log.flush()

    shared = refs._Case(preset, [length] * n)
    graphs = {}
    with torch.inference_mode():
        for position, name in enumerate(args.arms.split(",")):
            case = refs._Case(preset, [length] * n) if args.own_inputs else shared
            before = _checksum(shared)
            call, out, _ = refs.ARMS[name](case)
            out()
            if args.eager or (position and args.eager_after):
                for i in range(refs.ROTATE):
                    call(i)
            else:
                graphs[name + "#" * position] = refs._Graph(call)  # an arm may come twice
            torch.cuda.synchronize()
            say(step="built", arm=name, shared_inputs_changed=_checksum(shared) != before)
        for name, g in graphs.items():
            try:
                for _ in range(20):
                    g.graph.replay()
                    torch.cuda.synchronize()
            except RuntimeError as exc:  # a CUDA error: the context is lost, later steps too
                say(step="replay failed", arm=name, error=str(exc).splitlines()[0][:200])
                return 1
            say(step="replayed alone", arm=name)
    say(step="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
