"""The per-kernel breakdown with the lab's prefills as arms too, on one GPU.

``python -m mamba_edu.lab.bench_lab_breakdown [options of python -m mamba_edu.benchmarks.breakdown]``,
e.g. ``--arms ours,lab_scan_builds_wu``: each kernel's replay time and its DRAM bytes, to set
beside the byte model of ``data/benchmarks/sm90_resources_scan_builds_wu.json``
(``docs/results.md``, "The next candidate").
"""

from mamba_edu.benchmarks import breakdown
from mamba_edu.lab.bench_lab_arms import LAB_ARMS

if __name__ == "__main__":
    raise SystemExit(breakdown.main(extra_arms=LAB_ARMS, module="mamba_edu.lab.bench_lab_breakdown"))
