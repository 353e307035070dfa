"""Bound launches: every kernel call after the first of its kind goes straight to the compiled
kernel's launcher.

An eager forward launches about 440 Triton kernels, and each ``kernel[grid](*args)`` through
Triton's ``JITFunction.run`` binds the arguments, computes their specialisation and a cache key,
and runs the launch hooks: about a dozen Python calls per launch, more host time than the GPU
spends on a small kernel. Every layer launches the same kernels with arguments of the same kind,
so the work is the same every time.

``@bound_kernel`` over ``@triton.jit`` makes a :class:`BoundKernel`. Its ``kernel[grid](*args)``
first computes the call's *kind*: for every argument its value, or for a tensor its dtype and
whether its address is 16-byte aligned (what Triton specialises a pointer on), plus the launch
options and the current device. That key holds everything Triton's specialisation reads (ints by
their exact value, where Triton keeps only their class: 1, divisible by 16, their width), so equal
keys mean the same compiled kernel. A new kind goes through ``JITFunction.run``, which compiles or
finds the kernel, launches it and returns it; the kernel is kept for the key. A batch of a new
length is a new kind (its token count is an argument), so the first layer of its forward binds and
the other layers reuse; at most :data:`MAX_KINDS` kinds are kept per kernel. A known kind calls
``CompiledKernel.run`` (the C launcher's Python face, the same from Triton 3.6 to 3.9) with the
current stream.

It takes ``JITFunction.run`` for every call where the shortcut could differ: under the interpreter
(there is no compiled kernel), with launch hooks set (a profiler such as Proton), or when a kernel
parameter is passed by keyword (the launcher takes them in signature order).

Its measurements against the plain launches (Python calls in the CPU emulation of ``bench-host``,
the eager forward on an H100) are in ``docs/results.md``, "Host cost per eager prefill" and "The
lean engine on a GPU".
"""

from __future__ import annotations

import functools

import torch


MAX_KINDS = 4096  # per kernel; past it the kinds are forgotten and bind again (a server sees many lengths)


class BoundKernel:
    """A ``@triton.jit`` kernel (``fn``) launched as the module docstring says.

    ``launches``, ``binds`` (through ``JITFunction.run``, once per kind) and ``fallbacks``
    count what happened, for the tests.
    """

    def __init__(self, fn):
        self.fn = fn
        self.bound: dict = {}
        self.setup = None  # (knobs.runtime, interpreted, parameter count, device and stream getters)
        self.launches = self.binds = self.fallbacks = 0

    def __getitem__(self, grid):
        return functools.partial(self._launch, grid)  # a partial: no Python frame of its own

    def _setup(self):
        """What every launch reads, looked up at the first (Triton imported by then)."""
        from triton import knobs
        from triton.runtime.driver import driver

        from mamba_edu._runtime import triton_interpreted
        interpreted = triton_interpreted()
        getters = (None, None) if interpreted else (driver.active.get_current_device,
                                                    driver.active.get_current_stream)
        self.setup = (knobs.runtime, interpreted, len(self.fn.arg_names), *getters)
        return self.setup

    def _launch(self, grid, *args, **options):
        self.launches += 1
        knobs, interpreted, n_params, current_device, current_stream = self.setup or self._setup()
        # Triton 3.6-3.9 keep the hooks as chains (empty: falsy `calls`); older ones as None
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        hooked = getattr(enter, "calls", enter) or getattr(leave, "calls", leave)
        if interpreted or hooked or len(args) != n_params:
            self.fallbacks += 1
            return self.fn[grid](*args, **options)
        device = current_device()
        key = (device, tuple(options.items()), tuple([
            (a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a for a in args]))
        kernel = self.bound.get(key)
        if kernel is None:
            self.binds += 1
            if len(self.bound) >= MAX_KINDS:
                self.bound.clear()
            kernel = self.bound[key] = self.fn[grid](*args, **options)  # compiles or finds it, launches
            return kernel
        grid = grid + (1, 1)  # grids are tuples of 1 to 3 ints
        kernel.run(grid[0], grid[1], grid[2], current_stream(device), kernel.function,
                   kernel.packed_metadata, None, None, None, *args)
        return kernel


def bound_kernel(fn) -> BoundKernel:
    """Decorator, over ``@triton.jit`` (and ``@triton.autotune``): see the module docstring."""
    return BoundKernel(fn)
