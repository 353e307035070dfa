"""Bound launches: each kernel call after the first of its kind goes straight to the compiled
kernel's launcher, past Triton's ``JITFunction.run`` (argument binder, specialisation, cache key,
hooks), which costs about a dozen Python calls per launch of an eager forward.

``kernel[grid](*args)`` on a :class:`BoundKernel` looks up the *kind* of the call: for every
argument its value, or for a tensor its dtype and whether its address is 16-byte aligned (what
Triton specialises a pointer on), plus the launch options and the current device. That key holds
everything Triton's specialisation reads (ints by exact value, where Triton keeps only their
class: 1, divisible by 16, their width), so equal keys mean the same compiled kernel. A new kind
goes through ``JITFunction.run``, which compiles or finds the kernel, launches it and returns it;
it is kept for the key. A known kind calls ``CompiledKernel.run`` (the C launcher's Python face,
unchanged from Triton 3.6 to 3.9) with the current stream.

It falls back to ``JITFunction.run`` for every call where the shortcut could differ: under the
interpreter (there is no compiled kernel), with launch hooks set (a profiler such as Proton),
or when a kernel parameter is passed by keyword (the launcher takes them in signature order).

Not on the default path: a variant stays in the lab until a same-run GPU measurement shows it
faster (``python -m mamba_edu.lab.bench_lab_bound``, CPU emulation and GPU eager arms). The
emulated count for one ``fused`` forward of ``qwen3.5-tp8`` is in
``data/bench/host_lab_bound_*.json``.
"""

from __future__ import annotations

import contextlib
import functools

import torch


class BoundKernel:
    """A ``@triton.jit`` kernel whose launches are bound per kind of call (module docstring).

    ``fn``: the JITFunction; ``launches``/``fallbacks``/``binds``: counters, for the tests and
    the benchmark (each launch is one of a fallback, a bind through Triton, or a bound launch).
    """

    def __init__(self, fn):
        from triton import knobs

        from mamba_edu._runtime import triton_interpreted
        self.knobs = knobs.runtime
        self.fn = fn
        self.n_params = len(fn.arg_names)
        self.interpreted = triton_interpreted()
        self.bound: dict = {}
        self.driver = None  # (current device, current stream) getters, fetched at the first bind
        self.launches = self.fallbacks = self.binds = 0

    def __getitem__(self, grid):
        return functools.partial(self._launch, grid)  # a partial: no Python frame of its own

    def _launch(self, grid, *args, **options):
        self.launches += 1
        # Triton 3.6-3.9 keep the hooks as chains (empty: falsy `calls`); older ones as None
        enter, leave = self.knobs.launch_enter_hook, self.knobs.launch_exit_hook
        hooked = getattr(enter, "calls", enter) or getattr(leave, "calls", leave)
        if self.interpreted or hooked or len(args) != self.n_params:
            self.fallbacks += 1
            return self.fn[grid](*args, **options)
        if self.driver is None:
            from triton.runtime.driver import driver
            self.driver = driver.active.get_current_device, driver.active.get_current_stream
        device = self.driver[0]()
        key = (device, tuple(options.items()), tuple([
            (a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a for a in args]))
        kernel = self.bound.get(key)
        if kernel is None:
            self.binds += 1
            kernel = self.bound[key] = self.fn[grid](*args, **options)  # compiles or finds it, launches
            return kernel
        grid = grid + (1, 1)  # grids are tuples of 1 to 3 ints
        kernel.run(grid[0], grid[1], grid[2], self.driver[1](device), kernel.function,
                   kernel.packed_metadata, None, None, None, *args)
        return kernel


def package_kernels() -> dict:
    """``{(module, name): JITFunction}`` of every kernel the package's launchers call."""
    from mamba_edu.kernels import attention, conv, decode, fused_ops
    from mamba_edu.kernels.prefill import output, prepare, scan
    names = {fused_ops: ("rms_norm_kernel", "silu_mul_kernel", "rope_kernel"),
             attention: ("causal_attention_kernel",),
             conv: ("conv1d_prefill_kernel", "conv1d_update_kernel"),
             decode: ("gdn_decode_kernel",),
             prepare: ("chunk_prepare_kernel",), scan: ("chunk_scan_kernel",),
             output: ("chunk_output_kernel",)}
    return {(module, name): getattr(module, name) for module, several in names.items() for name in several}


@contextlib.contextmanager
def bound_launches():
    """Inside: the package's launchers call :class:`BoundKernel` wrappers of their kernels (the
    module globals they read are swapped, and restored on exit). Yields ``{name: BoundKernel}``.
    For the lab's benchmarks and tests only: the package itself never enters it."""
    kernels = package_kernels()
    wrapped = {name: BoundKernel(fn) for (_, name), fn in kernels.items()}
    for (module, name) in kernels:
        setattr(module, name, wrapped[name])
    try:
        yield wrapped
    finally:
        for (module, name), fn in kernels.items():
            setattr(module, name, fn)
