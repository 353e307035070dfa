"""A byte and FLOP model of the prefill: our three kernels against one fused chunk kernel.

``python -m mamba_edu.lab.fused_bytes [--out FILE]`` prints the model at the reference
benchmark's twelve shapes beside FlashInfer's measured H100 times, and writes it as JSON
(``data/benchmarks/fused_byte_model.json``, read by ``docs/fused_design.md``). No GPU is needed.

Two designs of the same math (``docs/conventions.md``, chunk C = 64):

- **three kernels** (:mod:`mamba_edu.kernels.prefill`): the preparation writes Γ, k̂, W and U,
  the scan reads them and writes every chunk's start state h and Ṽ, the output kernel reads q,
  k̂, Ṽ, h and Γ (:func:`three_kernel_tensors` lists each tensor each kernel reads or writes);
- **fused**: one program per (sequence, value head, V-tile) walks the sequence's chunks with the
  state on chip and computes each chunk's W, U, output and state update in one pass. It reads q,
  k, v, g, β and the start state once and writes o, the final state and the tracked states
  (:func:`fused_tensors`).

Each tensor counts once per kernel that touches it: what a kernel must move to or from HBM when
the reads that several of its programs share (a key head read by each value head of its group,
W read by each V-tile) come from L2. Launch metadata and ``A_log``/``dt_bias`` (under 1 KB) are
left out.

The time floors of a design on a device (:class:`Device`):

- bytes / HBM bandwidth (:func:`byte_floor_s`);
- FLOPs / dense bf16 tensor peak (:func:`flop_floor_s`; :func:`chunk_flops` counts the products);
- the occupancy floor (:func:`single_pass_s`): a fused program steps its chunks one after
  another, so the kernel takes at least ``waves × chunks × step``, where a step is the chunk's
  FLOPs at one SM's share of the peak, and never less than the measured latency of the bare
  state chain (:data:`CHAIN_STEP_S`). With few (sequence, head) pairs most SMs idle; splitting V
  adds programs but repeats the V-independent work (Γ, KKᵀ, the inverse, W, QKᵀ) in each tile;
- the chunk-group two-pass design (:func:`two_pass_s`) for few long sequences: pass 1 gives each
  group of chunks its state map ``S ↦ M S + B`` from the chunk factors, a short serial fixup
  composes the groups' start states, pass 2 runs the single pass per group from its start state.

All floors assume the kernel sustains the whole peak; ``needed efficiency`` in the table is the
fraction of it a design must sustain to tie the measured FlashInfer time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

CHUNK = 64
#: One chunk step of the state chain alone (``Ṽ = U − W S``, then the state update), measured in
#: Triton: 6.17 µs for 8 chunks of the bare chain (``data/benchmarks/layer_floor.md``, H200),
#: launch ramp included. No fused step can be shorter.
CHAIN_STEP_S = 6.17e-6 / 8
#: The shapes where the per-kernel breakdown was measured (``python -m mamba_edu.benchmarks.breakdown``).
BREAKDOWN_CASES = ("qwen3-next 1x8192", "qwen3-next 1x32768", "qwen3-next 8x1024", "qwen3-next 8x4096")
#: Where FlashInfer's H100 times are read from, in order of preference: the reference table's
#: instrument (graph replay between CUDA events), then the breakdown's (its kernels' CUPTI times).
FLASHINFER_FILES = ("benchmarks/references_h100_flashinfer.json", "benchmarks/references_h100_staged.json",
                    "benchmarks/breakdown_h100_flashinfer.json")
#: Every H100 reference table, for the fastest reference that agreed with the fp32 reference.
REFERENCE_FILES = ("benchmarks/references_h100.json", "benchmarks/references_h100_flashinfer.json",
                   "benchmarks/references_h100_staged.json", "benchmarks/references_h100_isolated.json",
                   "benchmarks/references_h100_multiseq.json")
REFERENCE_ARMS = ("fla_triton", "fla_dispatch", "flashqla", "flashinfer")
OUT = Path("data/benchmarks/fused_byte_model.json")


@dataclass(frozen=True)
class Device:
    """Peak rates of one GPU: HBM bytes/s, dense bf16 tensor FLOP/s, SMs."""
    name: str
    hbm_bytes_per_s: float
    tensor_flops_per_s: float
    sms: int

    @property
    def sm_flops_per_s(self) -> float:
        """One SM's share of the tensor peak: what a single program can reach at most."""
        return self.tensor_flops_per_s / self.sms


H100 = Device("H100 SXM", 3.35e12, 989e12, 132)
H200 = Device("H200", 4.8e12, 989e12, 132)


@dataclass(frozen=True)
class Shape:
    """A prefill batch: ``N`` sequences of ``L`` tokens, ``H`` key heads, ``HV`` value heads of
    dims ``K``, ``V``. Element sizes in bytes: ``act`` for q, k, v, o and the intermediates
    (bf16: 2), ``gate`` for g and β (the benchmarks pass fp32), ``state`` for the pool's states
    (fp32). ``tracked``: sequences whose state is copied to a track slot; ``checkpoints``: every
    chunk's start state written as fp32 (then the three kernels' h is that output)."""
    N: int
    L: int
    H: int
    HV: int
    K: int = 128
    V: int = 128
    act: int = 2
    gate: int = 4
    state: int = 4
    tracked: int = 0
    checkpoints: bool = False

    @property
    def T(self) -> int:
        """Tokens in the batch."""
        return self.N * self.L

    @property
    def chunks(self) -> int:
        """Chunks per sequence (the last may be partial: ``⌈L / 64⌉``)."""
        return -(-self.L // CHUNK)

    @property
    def NT(self) -> int:
        """Chunks in the batch (chunks never straddle sequences)."""
        return self.N * self.chunks


@dataclass(frozen=True)
class Tensor:
    """One tensor one kernel moves: ``access`` is ``read`` or ``write``; ``itemsize`` in bytes."""
    kernel: str
    name: str
    access: str
    shape: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


def three_kernel_tensors(s: Shape) -> list[Tensor]:
    """What :mod:`mamba_edu.kernels.prefill` moves, kernel by kernel (names as in the kernels:
    ``gamma`` = Γ, ``k_hat`` = k̂, ``v_new`` = Ṽ, ``pool`` = the N pool slots of the batch).

    - prepare: reads ``k [T, H, K]``, ``v [T, HV, V]``, ``g, beta [T, HV]``; writes
      ``gamma [T, HV]`` fp32, ``k_hat [T, H, K]``, ``w [T, HV, K]``, ``u [T, HV, V]``;
    - scan: reads k̂, W, U, Γ and the start states ``[N, HV, K, V]``; writes
      ``h [NT, HV, K, V]`` (fp32 with checkpoints, else the storage dtype), ``v_new [T, HV, V]``,
      the final states and the tracked ones;
    - output: reads ``q [T, H, K]``, k̂, Ṽ, h, Γ; writes ``o [T, HV, V]``.
    """
    T, NT, H, HV, K, V = s.T, s.NT, s.H, s.HV, s.K, s.V
    a, h_size = s.act, 4 if s.checkpoints else s.act
    return [Tensor("prepare", "k", "read", (T, H, K), a), Tensor("prepare", "v", "read", (T, HV, V), a),
            Tensor("prepare", "g", "read", (T, HV), s.gate), Tensor("prepare", "beta", "read", (T, HV), s.gate),
            Tensor("prepare", "gamma", "write", (T, HV), 4), Tensor("prepare", "k_hat", "write", (T, H, K), a),
            Tensor("prepare", "w", "write", (T, HV, K), a), Tensor("prepare", "u", "write", (T, HV, V), a),
            Tensor("scan", "k_hat", "read", (T, H, K), a), Tensor("scan", "w", "read", (T, HV, K), a),
            Tensor("scan", "u", "read", (T, HV, V), a), Tensor("scan", "gamma", "read", (T, HV), 4),
            Tensor("scan", "pool", "read", (s.N, HV, K, V), s.state),
            Tensor("scan", "h", "write", (NT, HV, K, V), h_size),
            Tensor("scan", "v_new", "write", (T, HV, V), a),
            Tensor("scan", "pool", "write", (s.N, HV, K, V), s.state),
            Tensor("scan", "track", "write", (s.tracked, HV, K, V), s.state),
            Tensor("output", "q", "read", (T, H, K), a), Tensor("output", "k_hat", "read", (T, H, K), a),
            Tensor("output", "v_new", "read", (T, HV, V), a), Tensor("output", "h", "read", (NT, HV, K, V), h_size),
            Tensor("output", "gamma", "read", (T, HV), 4), Tensor("output", "o", "write", (T, HV, V), a)]


def fused_tensors(s: Shape) -> list[Tensor]:
    """What one fused chunk kernel moves: q, k, v, g, β and the start states read once; o, the
    final states, the tracked states (and, with ``checkpoints``, every chunk's start state)
    written once."""
    T, HV, K, V = s.T, s.HV, s.K, s.V
    tensors = [Tensor("fused", "q", "read", (T, s.H, K), s.act), Tensor("fused", "k", "read", (T, s.H, K), s.act),
               Tensor("fused", "v", "read", (T, HV, V), s.act), Tensor("fused", "g", "read", (T, HV), s.gate),
               Tensor("fused", "beta", "read", (T, HV), s.gate),
               Tensor("fused", "pool", "read", (s.N, HV, K, V), s.state),
               Tensor("fused", "o", "write", (T, HV, V), s.act),
               Tensor("fused", "pool", "write", (s.N, HV, K, V), s.state),
               Tensor("fused", "track", "write", (s.tracked, HV, K, V), s.state)]
    if s.checkpoints:
        tensors.append(Tensor("fused", "checkpoints", "write", (s.NT, HV, K, V), 4))
    return tensors


def total_bytes(tensors: list[Tensor]) -> int:
    return sum(t.nbytes for t in tensors)


def bytes_per_kernel(tensors: list[Tensor]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tensors:
        out[t.kernel] = out.get(t.kernel, 0) + t.nbytes
    return out


def inverse_flops(C: int = CHUNK) -> int:
    """FLOPs of ``(I + L)⁻¹`` by doubling (:func:`mamba_edu.kernels.prefill.invert_unit_lower`):
    three steps inside the 16 × 16 diagonal blocks (two 16³ products per block each), then one
    step per doubling up to C on the whole tile (two C³ products each)."""
    flops = 3 * 2 * (2 * 16 ** 3) * (C // 16)
    size = 16
    while size < C:
        flops += 2 * 2 * C ** 3
        size *= 2
    return flops


#: The products of a chunk that do not depend on the V-tile: every V-tile program repeats them.
V_INDEPENDENT = ("gram", "inverse", "w", "qk")


def chunk_flops(K: int, V: int, BV: int | None = None, C: int = CHUNK) -> dict[str, int]:
    """Tensor-core FLOPs of one chunk of one value head for a V-tile of ``BV`` columns (the
    whole head by default), product by product (a ``[m, k] × [k, n]`` product is ``2mkn``):
    ``gram`` KKᵀ, ``inverse`` (I+L)⁻¹, ``w`` = T(βe^Γ K), ``qk`` = QKᵀ (these four
    :data:`V_INDEPENDENT`), ``u`` = T(βV), ``w_s`` = W S, ``q_s`` = (Q e^Γ) S, ``attn_v`` =
    (QKᵀ ⊙ decay) Ṽ, ``state`` = K̂ᵀ(e^{Γ_C−Γ} ⊙ Ṽ). At K = V = 128: 13.84 MFLOP."""
    BV = V if BV is None else BV
    return {"gram": 2 * C * C * K, "inverse": inverse_flops(C), "w": 2 * C * C * K, "qk": 2 * C * C * K,
            "u": 2 * C * C * BV, "w_s": 2 * C * K * BV, "q_s": 2 * C * K * BV,
            "attn_v": 2 * C * C * BV, "state": 2 * C * K * BV}


def three_kernel_flops(s: Shape) -> int:
    """FLOPs of the three kernels: every product once per chunk and value head."""
    return s.NT * s.HV * sum(chunk_flops(s.K, s.V).values())


def fused_flops(s: Shape, BV: int | None = None) -> int:
    """FLOPs of the fused kernel with V-tiles of ``BV``: the V-independent products once per tile."""
    BV = s.V if BV is None else BV
    tile = sum(chunk_flops(s.K, s.V, BV).values())
    return s.NT * s.HV * -(-s.V // BV) * tile


def byte_floor_s(nbytes: int, dev: Device) -> float:
    return nbytes / dev.hbm_bytes_per_s


def flop_floor_s(flops: int, dev: Device) -> float:
    return flops / dev.tensor_flops_per_s


def step_s(flops: int, dev: Device) -> float:
    """One serial chunk step of a program that has an SM to itself: its FLOPs at the SM's share
    of the peak, never less than the bare state chain (:data:`CHAIN_STEP_S`)."""
    return max(flops / dev.sm_flops_per_s, CHAIN_STEP_S)


def single_pass_s(s: Shape, dev: Device, BV: int) -> dict:
    """The fused kernel's occupancy floor with V-tiles of ``BV``: ``programs = N·HV·⌈V/BV⌉``,
    one resident per SM (its state and chunk tiles fill an SM's registers and shared memory),
    ``waves = ⌈programs / SMs⌉``, each program ``chunks`` serial steps."""
    programs = s.N * s.HV * -(-s.V // BV)
    waves = -(-programs // dev.sms)
    step = step_s(sum(chunk_flops(s.K, s.V, BV).values()), dev)
    return {"BV": BV, "programs": programs, "waves": waves, "step_us": step * 1e6,
            "seconds": waves * s.chunks * step}


def best_single_pass(s: Shape, dev: Device) -> dict:
    """:func:`single_pass_s` at the V-tile (V, V/2, … down to 16) that gives the shortest time."""
    tiles = [bv for bv in (s.V, s.V // 2, s.V // 4, s.V // 8) if bv >= 16 and s.V % bv == 0]
    return min((single_pass_s(s, dev, bv) for bv in tiles), key=lambda r: r["seconds"])


def two_pass_s(s: Shape, dev: Device) -> dict | None:
    """The chunk-group two-pass design: each sequence split into ``G`` groups of consecutive
    chunks, ``G`` the most that keeps ``N·HV·G`` programs within one wave (None where
    ``G = 1``: the sequences alone fill the GPU, and the single pass is this design).

    - pass 1, per (group, head): each chunk's factors (KKᵀ, the inverse, W, U), the group's
      state from zero (``W S``, the update) and its transition ``M ← (e^{Γ_C} − K̂ᵀW) M``
      (a ``[K, 64]·[64, K]`` and a ``[K, K]·[K, K]`` product per chunk): ``S ↦ M S + B``;
    - fixup, per head: ``G`` serial steps ``S ← M S + B`` (``2K²V`` FLOPs each);
    - pass 2, per (group, head): the single pass from the group's start state.
    Bytes beyond the single pass: k, v, g, β read again, and M, B (fp32) written and read."""
    pairs = s.N * s.HV
    G = min(s.chunks, dev.sms // pairs)
    if G <= 1:
        return None
    per_group = -(-s.chunks // G)
    f = chunk_flops(s.K, s.V)
    pass1 = sum(f[p] for p in ("gram", "inverse", "w", "u", "w_s", "state"))
    pass1 += 2 * s.K * CHUNK * s.K + 2 * s.K ** 3
    pass2 = sum(f.values())
    fixup = G * step_s(2 * s.K * s.K * s.V, dev)
    seconds = per_group * (step_s(pass1, dev) + step_s(pass2, dev)) + fixup
    again = s.T * (s.H * s.K + s.HV * s.V) * s.act + 2 * s.T * s.HV * s.gate
    maps = 2 * pairs * G * (s.K * s.K + s.K * s.V) * 4
    return {"groups": G, "programs": pairs * G, "chunks_per_group": per_group, "seconds": seconds,
            "fixup_us": fixup * 1e6, "flops": s.NT * s.HV * (pass1 + pass2),
            "bytes": total_bytes(fused_tensors(s)) + again + maps}


def _read(rel: str, data: Path) -> dict | None:
    path = data / rel
    return json.loads(path.read_text()) if path.exists() else None


def flashinfer_ms(case: str, data: Path) -> tuple[float, str] | None:
    """FlashInfer's measured H100 time at ``case`` and the file it comes from: the first of
    :data:`FLASHINFER_FILES` that timed it (an arm that disagreed with the fp32 reference has no
    time). From the breakdown: the sum of its kernels' times per call."""
    for rel in FLASHINFER_FILES:
        d = _read(rel, data)
        for row in (d or {}).get("rows", []):
            if row.get("case") != case:
                continue
            if "arms" in row and "median_ms" in row["arms"].get("flashinfer", {}):
                return row["arms"]["flashinfer"]["median_ms"], f"data/{rel}"
            if row.get("arm") == "flashinfer" and "replay" in row:
                return sum(k["us"] for k in row["replay"]["kernels"]) / 1e3, f"data/{rel}"
    return None


def fastest_reference_ms(case: str, data: Path) -> tuple[float, str, str] | None:
    """The fastest reference time at ``case`` in any H100 table (``ms, arm, file``)."""
    best = None
    for rel in REFERENCE_FILES:
        for row in (_read(rel, data) or {}).get("rows", []):
            if row.get("case") != case or "arms" not in row:
                continue
            for arm in REFERENCE_ARMS:
                ms = row["arms"].get(arm, {}).get("median_ms")
                if ms is not None and (best is None or ms < best[0]):
                    best = (ms, arm, f"data/{rel}")
    return best


def lab_chunk_loop_ms(case: str, data: Path) -> tuple[float, str] | None:
    """The lab's chunk loop (:mod:`.chunk_loop`, the fused dataflow in plain Triton, one program
    per (sequence, head)) as measured on an H100, and the file."""
    for rel in REFERENCE_FILES:
        for row in (_read(rel, data) or {}).get("rows", []):
            ms = row.get("arms", {}).get("lab_chunk_loop", {}).get("median_ms") if row.get("case") == case else None
            if ms is not None:
                return ms, f"data/{rel}"
    return None


def model_row(case: str, s: Shape, data: Path) -> dict:
    """Everything the model says about one shape, beside the measured H100 times (µs, MB)."""
    ours, fused = three_kernel_tensors(s), fused_tensors(s)
    single, two = best_single_pass(s, H100), two_pass_s(s, H100)
    fused_b = total_bytes(fused)
    if two is None or single["seconds"] <= two["seconds"]:
        design, compute_s, design_b = "single pass", single["seconds"], fused_b
    else:
        design, compute_s, design_b = "two-pass", two["seconds"], two["bytes"]
    estimate_s = max(byte_floor_s(design_b, H100), compute_s)
    row = {"case": case, **asdict(s), "T": s.T, "NT": s.NT, "breakdown": case in BREAKDOWN_CASES,
           "ours_mb": {k: v / 1e6 for k, v in bytes_per_kernel(ours).items()},
           "ours_total_mb": total_bytes(ours) / 1e6, "fused_mb": fused_b / 1e6,
           "bytes_ratio": total_bytes(ours) / fused_b, "ours_gflop": three_kernel_flops(s) / 1e9,
           "fused_gflop": fused_flops(s) / 1e9,
           "ours_byte_floor_us": {d.name: byte_floor_s(total_bytes(ours), d) * 1e6 for d in (H100, H200)},
           "fused_byte_floor_us": {d.name: byte_floor_s(fused_b, d) * 1e6 for d in (H100, H200)},
           "fused_flop_floor_us": {d.name: flop_floor_s(fused_flops(s), d) * 1e6 for d in (H100, H200)},
           "single_pass": {k: v for k, v in single.items() if k != "seconds"}
                          | {"us": single["seconds"] * 1e6, "gflop": fused_flops(s, single["BV"]) / 1e9},
           "two_pass": None if two is None else
                       {k: v for k, v in two.items() if k not in ("seconds", "flops", "bytes")}
                       | {"us": two["seconds"] * 1e6, "gflop": two["flops"] / 1e9, "mb": two["bytes"] / 1e6},
           "design": design, "estimate_us": estimate_s * 1e6}
    fi, best, loop = flashinfer_ms(case, data), fastest_reference_ms(case, data), lab_chunk_loop_ms(case, data)
    if fi and (best is None or fi[0] < best[0]):
        best = (fi[0], "flashinfer", fi[1])
    row["flashinfer_h100_ms"], row["flashinfer_file"] = fi if fi else (None, None)
    if fi:
        row["ratio_to_flashinfer"] = estimate_s / 1e-3 / fi[0]
        # To tie FlashInfer, the design's serial steps must run at this fraction of the SM's
        # tensor peak (and its bytes at this fraction of the HBM bandwidth).
        row["needed_tensor_efficiency"] = compute_s / 1e-3 / fi[0]
        row["needed_bandwidth_fraction"] = byte_floor_s(design_b, H100) / 1e-3 / fi[0]
    if best:
        row["fastest_h100_ms"], row["fastest_arm"], row["fastest_file"] = best
        row["ratio_to_fastest"] = estimate_s / 1e-3 / best[0]
    if loop:
        # The chunk loop runs whole heads (BV = V): its own occupancy floor against its time.
        row["lab_chunk_loop_h100_ms"], row["lab_chunk_loop_file"] = loop
        row["lab_chunk_loop_efficiency"] = single_pass_s(s, H100, s.V)["seconds"] / 1e-3 / loop[0]
    return row


#: The reference benchmark's twelve shapes as ``(preset, N, L)`` and the presets' ``(H, HV)``: the
#: same as :data:`mamba_edu.benchmarks.references.CASES` and ``PRESETS`` (a test checks; the lab's
#: models import nothing from the benchmarks, ``tests/project/test_layering.py``).
REFERENCE_CASES = [("qwen3-next", 1, 512), ("qwen3-next", 16, 256), ("qwen3-next", 8, 256),
                   ("qwen3-next", 8, 1024), ("qwen3-next", 1, 2048), ("qwen3-next", 1, 8192),
                   ("qwen3-next", 1, 32768), ("qwen3-next", 8, 4096), ("qwen3.5-tp8", 1, 512),
                   ("qwen3.5-tp8", 16, 256), ("qwen3.5-tp8", 8, 1024), ("qwen3.5-tp8", 1, 8192)]
PRESETS = {"qwen3-next": (16, 32), "qwen3.5-tp8": (2, 8)}


def reference_shapes() -> list[tuple[str, Shape]]:
    """The reference benchmark's twelve shapes, named as its rows are (``qwen3-next 8x1024``),
    bf16 with fp32 gates, no tracking, as the benchmark runs them."""
    return [(f"{p} {n}x{length}", Shape(n, length, *PRESETS[p])) for p, n, length in REFERENCE_CASES]


def table(data: Path | None = None) -> list[dict]:
    from mamba_edu._runtime import data_dir
    data = data_dir() if data is None else data
    return [model_row(case, s, data) for case, s in reference_shapes()]


def format_table(rows: list[dict]) -> str:
    """The rows as a fixed-width text table (H100 SXM; times in µs)."""
    head = (f"{'shape':20} {'ours MB':>8} {'fused MB':>8} {'ratio':>5} {'bytes':>6} {'FLOPs':>6} "
            f"{'1-pass':>7} {'BV':>3} {'2-pass':>7} {'est.':>7} {'FI':>7} {'est/FI':>6} "
            f"{'fastest':>7} {'est/fastest':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        fi, best, two = r["flashinfer_h100_ms"], r.get("fastest_h100_ms"), r["two_pass"]
        lines.append(
            f"{r['case'] + (' *' if r['breakdown'] else ''):20} {r['ours_total_mb']:8.1f} {r['fused_mb']:8.1f} "
            f"{r['bytes_ratio']:5.2f} {r['fused_byte_floor_us'][H100.name]:6.1f} "
            f"{r['fused_flop_floor_us'][H100.name]:6.1f} {r['single_pass']['us']:7.1f} "
            f"{r['single_pass']['BV']:3d} " + (f"{two['us']:7.1f} " if two else f"{'—':>7} ")
            + f"{r['estimate_us']:7.1f} "
            + (f"{fi * 1e3:7.1f} {r['ratio_to_flashinfer']:6.2f} " if fi else f"{'—':>7} {'—':>6} ")
            + (f"{best * 1e3:7.1f} {r['ratio_to_fastest']:11.2f}" if best else f"{'—':>7} {'—':>11}"))
    files = sorted({r["flashinfer_file"] for r in rows if r["flashinfer_file"]})
    lines += ["* a breakdown shape. H100 SXM: 3.35 TB/s, 989 TFLOP/s dense bf16, 132 SMs. bytes, FLOPs: the",
              "fused kernel's floors; 1-pass: its occupancy floor at the best V-tile BV; 2-pass: the chunk-group",
              "design (— where the sequences fill the GPU); est.: the faster design, at least its byte floor.",
              "FI: FlashInfer measured on an H100 (" + ", ".join(files) + ");",
              "fastest: the fastest reference measured on an H100, FlashInfer included (fastest_file in the JSON)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mamba_edu.lab.fused_bytes",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help=f"write the JSON here (the committed copy is {OUT})")
    args = parser.parse_args(argv)
    rows = table()
    print(format_table(rows))
    if args.out:
        import subprocess

        import torch
        import triton
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        meta = {"commit": commit.stdout.strip() or None, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "device": "model (no GPU)", "torch": torch.__version__, "triton": triton.__version__,
                "clock_log": None, "command": "python -m mamba_edu.lab.fused_bytes --out " + str(args.out),
                "devices": [asdict(H100), asdict(H200)], "chain_step_us": CHAIN_STEP_S * 1e6,
                "chunk_mflop": sum(chunk_flops(128, 128).values()) / 1e6}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
