"""Time the lab's prefills beside ours and the references, in one run on one GPU.

``python -m mamba_edu.lab.bench_lab_arms [options of python -m mamba_edu.benchmarks.references]``:
the reference benchmark with the lab's prefills as more arms, timed with the same instrument and
alternated with the others (each arm in a process of its own, as there), pick them with
``--arms``:

- ``lab_chunk_loop``: :func:`mamba_edu.lab.chunk_loop.prefill_chunk_loop`;
- ``lab_scan_builds_wu``: :func:`mamba_edu.lab.scan_builds_wu.prefill_scan_builds_wu`.

Their rows get ``ratio_ours`` (the arm's median over ours).
"""

import torch

from mamba_edu.benchmarks import references
from mamba_edu.lab.chunk_loop import prefill_chunk_loop
from mamba_edu.lab.scan_builds_wu import prefill_scan_builds_wu


def lab_arm(prefill):
    """An arm builder for a prefill with the package's signature: like ``ours``, the pool
    updated in place, one call per rotated input copy."""
    def build(case):
        K = case.sets[0]["q"].shape[-1]
        pools = [torch.zeros(case.N + 1, case.HV, K, K, device="cuda") for _ in case.sets]
        slots = case.indices["state_indices"]

        def run(x, pool):
            return prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, slots, case.meta,
                           K ** -0.5, True)

        def out():
            pool = torch.cat([torch.zeros_like(case.h0[:1]), case.h0])
            o, _ = run(case.sets[0], pool)
            return o, pool[1:]
        return (lambda i: run(case.sets[i], pools[i])), out, {}
    return build


LAB_ARMS = {"lab_chunk_loop": lab_arm(prefill_chunk_loop),
            "lab_scan_builds_wu": lab_arm(prefill_scan_builds_wu)}


if __name__ == "__main__":
    raise SystemExit(references.main(extra_arms=LAB_ARMS, module="mamba_edu.lab.bench_lab_arms"))
