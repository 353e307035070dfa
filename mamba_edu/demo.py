"""``python -m mamba_edu demo``: the main job on the default device, as a short readable report."""

from __future__ import annotations

import time

import torch

from mamba_edu._runtime import default_device
from mamba_edu.gdn import chunk_gated_delta_rule, gdn_gating, recurrent_gated_delta_rule
from mamba_edu.testing import rel_err


def reference_report(device: torch.device, seed: int = 0) -> dict:
    """Run the recurrent and chunked references on one small packed batch and compare them.

    The batch: 4 sequences (1, 63, 64, 200 tokens), H=2 key heads, HV=4 value heads, K=V=32,
    Qwen3-Next gating, q/k L2 norm, random initial states.
    """
    gen = torch.Generator().manual_seed(seed)
    lengths = [1, 63, 64, 200]
    T, H, HV, K, V = sum(lengths), 2, 4, 32, 32
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(device)  # noqa: E731
    q, k, v = rand(T, H, K), rand(T, H, K), rand(T, HV, V)
    g, beta = gdn_gating(rand(HV), rand(T, HV), rand(T, HV), rand(HV))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device)
    h0 = rand(len(lengths), HV, K, V) * 0.1
    kw = dict(cu_seqlens=cu, initial_state=h0, use_qk_l2norm=True, output_checkpoints=True)
    t0 = time.perf_counter()
    ref = recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    t1 = time.perf_counter()
    out = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    t2 = time.perf_counter()
    return {
        "device": str(device), "lengths": lengths, "heads": (H, HV), "dims": (K, V),
        "recurrent_ms": 1e3 * (t1 - t0), "chunked_ms": 1e3 * (t2 - t1),
        "err_o": rel_err(out.o, ref.o), "err_final": rel_err(out.final_state, ref.final_state),
        "err_checkpoints": rel_err(out.checkpoints, ref.checkpoints),
        "n_checkpoints": int(out.checkpoints.shape[0]),
    }


def main(argv=None) -> int:
    device = default_device()
    r = reference_report(device)
    print(f"mamba_edu demo on {r['device']}")
    print(f"  packed batch: lengths {r['lengths']}, heads H={r['heads'][0]} HV={r['heads'][1]}, "
          f"K=V={r['dims'][0]}")
    print(f"  recurrent reference: {r['recurrent_ms']:8.1f} ms   (one token at a time)")
    print(f"  chunked (WY) form:   {r['chunked_ms']:8.1f} ms   (64 tokens at a time)")
    print(f"  chunked vs recurrent, relative error: output {r['err_o']:.1e}, final state "
          f"{r['err_final']:.1e}, {r['n_checkpoints']} checkpoints {r['err_checkpoints']:.1e}")
    ok = max(r["err_o"], r["err_final"], r["err_checkpoints"]) < 1e-5
    print("  PASS: the chunked form computes the recurrence" if ok else "  FAIL: forms disagree")
    return 0 if ok else 1
