"""Host cost of an engine prefill outside its forward (requests made, prepare_prefill,
finish_prefill): Python calls per prefill and the time, tiny model on the CPU, 4 requests of 8192
tokens each, the same prompts every round (prefix hits after the first), 7 timed rounds.

    TRITON_INTERPRET=1 OMP_NUM_THREADS=1 python scripts/prefill_host_outside_forward.py
"""

import statistics
import sys
import time

import torch

from mamba_edu.engine import Engine, Request
from mamba_edu.model import build_model

torch.manual_seed(0)
MODEL = build_model("tiny", device="cpu")
ENGINE = Engine(MODEL, strategy="precomputed", max_requests=8)
_GEN = torch.Generator().manual_seed(1)
PROMPTS = [torch.randint(0, MODEL.config.vocab, (8192,), generator=_GEN).tolist() for _ in range(4)]


def prefill(round_: int, profiler=None) -> float:
    """One prefill and release; seconds on the host outside the forward (``profiler`` is
    switched off around the forward)."""
    t0 = time.perf_counter()
    requests = [Request(f"r{round_}_{k}", p) for k, p in enumerate(PROMPTS)]
    batch = ENGINE.prepare_prefill(requests)
    t1 = time.perf_counter()
    sys.setprofile(None)
    out = ENGINE.forward_prefill(batch)
    sys.setprofile(profiler)
    t2 = time.perf_counter()
    ENGINE.finish_prefill(batch, out)
    ENGINE.release([r.rid for r in requests])
    return (t1 - t0) + (time.perf_counter() - t2)


def main() -> None:
    prefill(0)
    prefill(1)
    calls = [0]

    def count(frame, event, arg):
        calls[0] += event == "call"
    sys.setprofile(count)
    prefill(2, count)
    sys.setprofile(None)
    ms = [prefill(3 + r) * 1e3 for r in range(7)]
    print(f"python calls outside the forward per prefill: {calls[0]}; host ms (requests+prepare+finish): "
          f"median {statistics.median(ms):.2f} [min {min(ms):.2f}, max {max(ms):.2f}]")


if __name__ == "__main__":
    main()
