"""Checks of notebook 03 (Triton kernels).

1. ``my_l2norm_kernel`` — a ``@triton.jit`` kernel that L2-normalises the rows of a row-strided
   matrix (eps inside the square root). The check launches it itself.
2. ``my_program_counts`` — predict-then-measure: how many programs each prefill kernel launches
   for a batch, written before the notebook shows the launchers and checked against the grids the
   package really launches (:func:`launched_programs`; prepare, scan and output kernel for every
   batch by default; a kernel that is not launched has no entry; tolerance 0).
3. ``my_recurrent_kernel`` — a ``@triton.jit`` kernel, one program per (sequence, value head),
   that runs the gated delta rule token by token over a packed batch and writes o and the final
   state. The check launches it and compares with :func:`mamba_edu.gdn.recurrent_gated_delta_rule`.
4. ``my_chunk_step_kernel`` — a ``@triton.jit`` kernel, one program per chunk, that does one step
   of the scan with ``tl.dot``: ``Ṽ = U − W S`` and ``S_next = e^{Γ_last} S + K̂ᵀ(e^{Γ_last−Γ} ⊙ Ṽ)``,
   on short chunks too. The check launches it and compares with the formulas in float64.

The kernels of exercises 1, 3 and 4 are launched by the checks with their own grids, so the
learner's answer must be a Triton kernel: a torch function cannot pass, nor a kernel that calls
the package's kernel helpers.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import random
import types
from contextlib import ExitStack
from unittest import mock

import numpy as np
import torch
import triton

from mamba_edu._runtime import default_device, triton_available, triton_interpreted, triton_missing_message
from mamba_edu.exercises.core import check_seed, checker, exercise
from mamba_edu.gdn import l2norm, recurrent_gated_delta_rule
from mamba_edu.testing import check as compare

try:
    from triton.runtime.interpreter import InterpretedFunction as _INTERPRETED
except ImportError:  # the stand-in module where Triton is not installed
    _INTERPRETED = triton.runtime.jit.JITFunction

NOTEBOOK = "03_triton_kernels"
check = checker(NOTEBOOK)


def _require_triton(number: int) -> None:
    """Without Triton (macOS, Windows) the checks cannot launch or record kernels: say so."""
    if not triton_available():
        raise AssertionError(triton_missing_message(f"exercise {number}'s check"))


def _require_kernel(fn, name: str) -> None:
    """A torch function (or a plain Python one) is not an answer to a kernel exercise, nor the
    package's kernel or one that calls the package's kernel helpers. Triton runs a kernel from its
    source, so the judge cannot make those absent: the names the kernel reads are checked here."""
    if type(fn) not in (triton.runtime.jit.JITFunction, _INTERPRETED):
        raise AssertionError(f"{name} is a {type(fn).__name__}, not a Triton kernel: decorate it "
                             "with @triton.jit (the check launches it with its own grid)")
    for used in [fn, *map(fn.fn.__globals__.get, fn.fn.__code__.co_names)]:
        where = used.__name__ if isinstance(used, types.ModuleType) else getattr(used, "__module__", None) or ""
        if where.startswith(("mamba_edu.kernels", "mamba_edu.exercises")):
            raise AssertionError(f"{name} calls {where}, which this exercise asks you to write yourself")


# ---------------------------------------------------------------------------------------------
# Exercise 1
# ---------------------------------------------------------------------------------------------

def _loads_outside(t: torch.Tensor, n_rows: int, outside: list):
    """Under Triton's interpreter, which does not bound-check: note in ``outside`` every load of an
    enabled lane that is not in rows ``0 … n_rows-1`` of the 2-D ``t`` (an unmasked row load reads
    whatever lies past the tensor; on a GPU, an illegal address). Compiled kernels run unwatched."""
    if not triton_interpreted():
        return contextlib.nullcontext()
    from triton.runtime.interpreter import InterpreterBuilder
    load = InterpreterBuilder.create_masked_load
    first = t.data_ptr()
    end = first + ((n_rows - 1) * t.stride(0) + t.shape[1]) * t.element_size()

    def watched(builder, ptrs, mask, *rest):
        enabled = ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)]
        if ((enabled < first) | (enabled >= end)).any():
            outside.append(ptrs)
        return load(builder, ptrs, mask, *rest)

    return mock.patch.object(InterpreterBuilder, "create_masked_load", watched)


@exercise(NOTEBOOK, 1, "a Triton L2-norm kernel", "my_l2norm_kernel", forbidden=("mamba_edu.kernels",))
def check_l2norm_kernel(kernel) -> str:
    """Launch ``kernel[(cdiv(n_rows, ROWS),)](x, y, n_rows, x.stride(0), D, BD, ROWS)`` on column
    slices of wider matrices (row stride ≠ D), D not a power of two, n_rows not a multiple of
    ROWS (drawn per grading run), one tiny row (Σx² < eps, where the place of eps decides), and
    guard rows after ``y`` that must stay untouched (an unmasked store would write there). In the
    interpreter, every load must stay inside x's rows (an unmasked row load reads past them)."""
    _require_triton(1)
    _require_kernel(kernel, "my_l2norm_kernel")
    dev = default_device()  # CUDA tensors on a GPU, CPU tensors in the interpreter
    gen = torch.Generator().manual_seed(check_seed(3))
    rng = random.Random(check_seed(3))
    for D, ROWS in ((24, 16), (16, 4)):
        n_rows = ROWS * rng.randint(1, 3) + rng.randint(1, ROWS - 1)  # a last block part full
        wide = torch.randn(n_rows, D + 7, generator=gen)
        wide[1, :D] *= 1e-4  # Σx² ≈ 1e-7·D/10 < 1e-6: eps outside the root gives another row
        x = wide.to(dev, copy=True)[:, :D]  # a column slice: row stride D + 7
        guard = ROWS + 8
        y = torch.full((n_rows + guard, D), float("nan"), device=dev)
        BD = triton.next_power_of_2(D)
        outside = []
        with _loads_outside(x, n_rows, outside):
            kernel[(triton.cdiv(n_rows, ROWS),)](x, y, n_rows, x.stride(0), D, BD, ROWS)
        case = f"n_rows={n_rows}, D={D}, ROWS={ROWS}, row stride {x.stride(0)}"
        if not torch.isnan(y[n_rows:]).all():
            raise AssertionError(f"{case}: the kernel wrote past row n_rows-1 of y (mask the rows "
                                 "and the columns of every store)")
        if outside:
            raise AssertionError(f"{case}: the kernel loaded elements outside rows 0 … n_rows-1 of x "
                                 "(mask the rows and the columns of every load: on a GPU a load past "
                                 "the tensor reads an illegal address)")
        if not torch.equal(x.cpu(), wide[:, :D]):
            raise AssertionError(f"{case}: the kernel changed x; write the rows into y only")
        compare(y[:n_rows], l2norm(wide[:, :D]), tol=1e-5, name=f"exercise 1 ({case})", quiet=True)
    return "a Triton kernel; strided rows, a tiny row and partial tiles normalised like mamba_edu.gdn.l2norm"


# ---------------------------------------------------------------------------------------------
# Exercise 2
# ---------------------------------------------------------------------------------------------

def _kernel_modules():
    """Every module of ``mamba_edu.kernels``, those of its subpackages (``prefill``) included."""
    import mamba_edu.kernels as package
    return [importlib.import_module(m.name)
            for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]


def _recorded_grids(lengths, H, HV, K, V) -> list[tuple[str, tuple[int, ...]]]:
    """The (kernel name, grid) of every launch that ``gdn_prefill(impl="triton")`` makes for
    this batch: each launched Triton kernel of ``mamba_edu.kernels`` (a
    :class:`~mamba_edu.kernels.launcher.BoundKernel`) is replaced by a recorder, so nothing
    runs and the inputs can stay uninitialised (``torch.empty`` touches no memory)."""
    from mamba_edu.kernels import build_chunk_meta, gdn_prefill
    from mamba_edu.kernels.launcher import BoundKernel

    launches = []

    class Recorder:
        def __init__(self, name, original):
            self.name, self.arg_names = name, getattr(original, "arg_names", [])

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                g = grid
                if callable(g):  # a grid that depends on the launch's (meta-)arguments
                    g = g({**dict(zip(self.arg_names, args)), **kwargs})
                launches.append((self.name, tuple(int(n) for n in g)))
            return launch

    dev = default_device()  # CUDA tensors on a GPU, CPU tensors in the interpreter
    T, N = sum(lengths), len(lengths)
    meta = build_chunk_meta(lengths, dev)
    e = lambda *shape: torch.empty(*shape, device=dev)  # noqa: E731
    with ExitStack() as stack:
        for module in _kernel_modules():
            for name, obj in list(vars(module).items()):
                if isinstance(obj, BoundKernel):  # a launched kernel, not a device helper
                    stack.enter_context(mock.patch.object(module, name, Recorder(name, obj)))
        gdn_prefill(e(T, H, K), e(T, H, K), e(T, HV, V), e(T, HV), e(T, HV),
                    state_pool=e(N, HV, K, V), meta=meta, state_indices=list(range(N)), impl="triton")
    return launches


def _expected_counts(lengths, H, HV, K, V) -> dict:
    """Programs per launched kernel (``prepare``, ``scan``, ``output``: the kernel's name without
    ``chunk_`` and ``_kernel``) and the longest serial chain ``scan_steps`` in chunks."""
    counts = {}
    for name, grid in _recorded_grids(lengths, H, HV, K, V):
        key = name.removeprefix("chunk_").removesuffix("_kernel")
        n = 1
        for d in grid:
            n *= d
        counts[key] = counts.get(key, 0) + n
    counts["scan_steps"] = max(-(-n // 64) for n in lengths)
    return counts


def launched_programs(lengths, H, HV, K, V) -> dict:
    """The measurement behind exercise 2, for the notebook to print: the programs per kernel that
    ``gdn_prefill`` launches for this batch (recorded, nothing run) and the longest chain."""
    _require_triton(2)
    return _expected_counts(list(lengths), H, HV, K, V)


@exercise(NOTEBOOK, 2, "programs of the prefill kernels", "my_program_counts",
          forbidden=("mamba_edu.kernels", "unittest.mock"))
def check_program_counts(fn) -> str:
    """Compare with the grids that ``gdn_prefill`` launches, at the real Qwen3-Next head shapes,
    the Qwen3.5 tensor-parallel-8 slice, the notebook's test batch, a batch of 64 sequence-head
    chains with V not a power of two, and batches on either side of the output kernel's V-tile
    threshold, and batches drawn per grading run (lengths on and off chunk boundaries, head
    groups, K and V of several sizes). A kernel that is not launched must have no entry."""
    _require_triton(2)
    rng = random.Random(check_seed(2))
    cases = [([8192], 16, 32, 128, 128), ([1024] * 8, 16, 32, 128, 128), ([512], 2, 8, 128, 128),
             # either side of the output kernel's tile rule: 256 and 264 (chunk, value head) tiles
             ([2048], 4, 8, 128, 128), ([2112], 4, 8, 128, 128), ([64] * 11, 8, 24, 128, 128),
             ([100, 30, 64, 5], 8, 16, 64, 96)]
    for _ in range(5):
        H = rng.choice([1, 2, 4, 8, 16])
        cases.append(([64 * rng.randint(0, 20) + rng.choice([1, 63, 64, 65, rng.randint(1, 64)])
                       for _ in range(rng.randint(1, 12))],
                      H, H * rng.choice([1, 2, 4]), rng.choice([16, 64, 128]), rng.choice([32, 64, 96, 128])))
    keys = ("prepare", "scan", "output", "scan_steps")
    for lengths, H, HV, K, V in cases:
        want = _expected_counts(lengths, H, HV, K, V)
        got = fn(list(lengths), H, HV, K, V)
        if not isinstance(got, dict) or any(got.get(k) != want.get(k) for k in keys):
            short = lengths if len(lengths) <= 5 else f"{lengths[:2]} … ({len(lengths)} sequences)"
            raise AssertionError(f"lengths={short}, H={H}, HV={HV}, K={K}, V={V}: got {got}, "
                                 f"expected {want} (the grids gdn_prefill launches)")
    return "program counts match the grids that gdn_prefill launches, and the longest serial chain"


# ---------------------------------------------------------------------------------------------
# Exercise 3
# ---------------------------------------------------------------------------------------------

def _with_spare_row(x: torch.Tensor, dev) -> torch.Tensor:
    """``x [T, …]`` on ``dev`` as the first T rows of a buffer one NaN row longer: a kernel that
    reads a token or a head too far reads NaN (and fails the comparison) inside memory it may
    read, instead of crashing the interpreter."""
    buffer = torch.full((x.shape[0] + 1, *x.shape[1:]), float("nan"), dtype=x.dtype, device=dev)
    buffer[:-1] = x
    return buffer[:-1]


@exercise(NOTEBOOK, 3, "the gated delta rule as a Triton kernel", "my_recurrent_kernel",
          forbidden=("mamba_edu.kernels",))
def check_recurrent_kernel(kernel) -> str:
    """Launch ``kernel[(N, HV)](q, k, v, g, beta, o, h0, ht, cu, scale, H, HV, K, V)`` on fresh
    packed batches (a 1-token sequence, head groups of 2 and 4 value heads per key head, K ≠ V)
    and compare o and the final states with the recurrent reference. ``o`` and ``ht`` start as
    NaN, so every element must be written."""
    _require_triton(3)
    _require_kernel(kernel, "my_recurrent_kernel")
    dev = default_device()  # CUDA tensors on a GPU, CPU tensors in the interpreter
    gen = torch.Generator().manual_seed(check_seed(9))
    for lengths, H, HV, K, V in (([5, 1, 13], 2, 4, 16, 32), ([7, 3], 1, 2, 32, 16), ([6, 2], 2, 8, 16, 16)):
        T, N = sum(lengths), len(lengths)
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        q = l2norm(torch.randn(T, H, K, generator=gen))
        k = l2norm(torch.randn(T, H, K, generator=gen))
        v = torch.randn(T, HV, V, generator=gen)
        g = -0.5 * torch.rand(T, HV, generator=gen)
        beta = torch.rand(T, HV, generator=gen)
        h0 = 0.1 * torch.randn(N, HV, K, V, generator=gen)
        scale = K ** -0.5
        o = _with_spare_row(torch.full((T, HV, V), float("nan")), dev)
        ht = torch.full((N, HV, K, V), float("nan"), device=dev)
        args = [_with_spare_row(t, dev) for t in (q, k, v, g, beta)]  # copies: q … beta stay as drawn
        kernel[(N, HV)](*args, o, h0.to(dev, copy=True), ht, torch.tensor(cu, dtype=torch.int32, device=dev),
                        scale, H, HV, K, V)
        ref = recurrent_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                         cu_seqlens=cu, use_qk_l2norm=False)
        case = f"lengths={lengths}, H={H}, HV={HV}, K={K}, V={V}"
        compare(o, ref.o, tol=1e-5, name=f"exercise 3 output o ({case})", quiet=True)
        compare(ht, ref.final_state, tol=1e-5, name=f"exercise 3 final states ({case})", quiet=True)
    return "a Triton kernel; o and the final states match recurrent_gated_delta_rule on packed batches"


# ---------------------------------------------------------------------------------------------
# Exercise 4
# ---------------------------------------------------------------------------------------------

def _chunk_step_reference(k, w, u, gamma, n, h):
    """``(Ṽ [NC, C, V], S_next [NC, K, V])`` in float64, over the first ``n[i]`` rows of chunk i."""
    v_new, h_next = torch.zeros(u.shape, dtype=torch.float64), torch.zeros(h.shape, dtype=torch.float64)
    for i, m in enumerate(n.tolist()):
        kk, ww, uu, gg = (t[i, :m].double() for t in (k, w, u, gamma))
        hh = h[i].double()
        v_new[i, :m] = uu - ww @ hh
        h_next[i] = gg[-1].exp() * hh + (kk * (gg[-1] - gg).exp()[:, None]).T @ v_new[i, :m]
    return v_new, h_next


@exercise(NOTEBOOK, 4, "one chunk step of the scan with tl.dot", "my_chunk_step_kernel",
          forbidden=("mamba_edu.kernels",))
def check_chunk_step_kernel(kernel) -> str:
    """Launch ``kernel[(NC,)](k, w, u, gamma, n, h, v_new, h_next, C, K, V)`` on batches of
    independent chunks (full and short ones, weak and strong gates, two tile shapes). The rows
    of a short chunk past ``n[i]`` hold NaN in every input and in ``v_new``: they must be neither
    read unmasked nor written. ``h`` must be left as it was."""
    _require_triton(4)
    _require_kernel(kernel, "my_chunk_step_kernel")
    dev = default_device()  # CUDA tensors on a GPU, CPU tensors in the interpreter
    tol = 1e-5 if triton_interpreted() else 5e-3  # a GPU runs fp32 dots as tf32
    gen = torch.Generator().manual_seed(check_seed(12))
    for C, K, V, lengths, strength in ((16, 16, 32, [16, 5, 1, 16], 0.05), (32, 16, 16, [32, 17, 2], 2.0)):
        NC = len(lengths)
        n = torch.tensor(lengths, dtype=torch.int32)
        padding = torch.arange(C)[None, :] >= n[:, None]                     # [NC, C]
        k = l2norm(torch.randn(NC, C, K, generator=gen))
        w = 0.5 * torch.randn(NC, C, K, generator=gen)
        u = torch.randn(NC, C, V, generator=gen)
        gamma = (-strength * torch.rand(NC, C, generator=gen)).cumsum(1)
        h = torch.randn(NC, K, V, generator=gen)
        for t in (k, w, u, gamma):
            t[padding] = float("nan")                                        # never to be read
        dk, dw, du, dgamma, dn, dh = (t.to(dev, copy=True) for t in (k, w, u, gamma, n, h))
        v_new = torch.full((NC, C, V), float("nan"), device=dev)
        h_next = torch.full((NC, K, V), float("nan"), device=dev)
        kernel[(NC,)](dk, dw, du, dgamma, dn, dh, v_new, h_next, C, K, V)
        want_v, want_h = _chunk_step_reference(k, w, u, gamma, n, h)  # from the inputs as drawn
        case = f"C={C}, K={K}, V={V}, tokens per chunk {lengths}"
        if not torch.equal(dh.cpu(), h):
            raise AssertionError(f"{case}: the kernel changed h; write the new state into h_next")
        if not torch.isnan(v_new.cpu()[padding]).all():
            raise AssertionError(f"{case}: the kernel wrote rows of v_new past n[i] (mask the store)")
        valid = ~padding
        compare(v_new.cpu()[valid], want_v[valid], tol=tol, name=f"exercise 4 Ṽ = U − W S ({case})", quiet=True)
        compare(h_next, want_h, tol=tol, name=f"exercise 4 S_next ({case})", quiet=True)
    return "a Triton kernel; Ṽ and S_next match the chunk step on full and short chunks"
