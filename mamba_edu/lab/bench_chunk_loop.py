"""Time the lab's chunk-loop prefill beside ours and the references, in one run on one GPU.

``python -m mamba_edu.lab.bench_chunk_loop [options of python -m mamba_edu.benchmarks.references]``:
the reference benchmark with one more arm, ``lab_chunk_loop``
(:func:`mamba_edu.lab.chunk_loop.prefill_chunk_loop`), timed with the same instrument and
alternated with the others; its rows get ``ratio_ours`` (its median over ours).
"""

import torch

from mamba_edu.benchmarks import references
from mamba_edu.lab.chunk_loop import prefill_chunk_loop


def chunk_loop_arm(case):
    """The arm: like ``ours``, the pool updated in place, one call per rotated input copy."""
    K = case.sets[0]["q"].shape[-1]
    pools = [torch.zeros(case.N + 1, case.HV, K, K, device="cuda") for _ in case.sets]
    slots = case.indices["state_indices"]

    def run(x, pool):
        return prefill_chunk_loop(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, slots,
                                  case.meta, K ** -0.5, True)

    def out():
        pool = torch.cat([torch.zeros_like(case.h0[:1]), case.h0])
        o, _ = run(case.sets[0], pool)
        return o, pool[1:]
    return (lambda i: run(case.sets[i], pools[i])), out, {}


if __name__ == "__main__":
    raise SystemExit(references.main(extra_arms={"lab_chunk_loop": chunk_loop_arm},
                                     module="mamba_edu.lab.bench_chunk_loop"))
