"""``python -m mamba_edu bench-host``: the host cost of one eager prefill forward, the CUDA path
emulated on a CPU.

On a GPU the eager prefill of ``qwen3.5-tp8`` (1 x 512 tokens) spends ~50 us of host time per
kernel: the eager numbers measure our Python. This command shows it without a GPU: the engine's
real Python runs on its CUDA path (planning, metadata, the strategy's code, the model, and
Triton's launch path up to the C launcher), but no kernel runs and no memory is touched.

How the CUDA path is emulated (everything below is undone when the run ends):

* **Tensors**: the model is built inside a ``FakeTensorMode`` and moved to a *fake* ``cuda:0``
  device (shape, dtype, strides, no data; a CPU-only torch computes them as ``meta``). So
  ``tensor.device.type == "cuda"`` everywhere and the code takes its CUDA branches (``impl=
  "auto"`` picks Triton, host lists are "pinned" and uploaded); each torch op pays its Python
  dispatch into the fake mode and computes nothing. Device tensors of at most
  :data:`SHADOW_NUMEL` elements made from host data (the uploaded index lists and what is
  computed from them) carry a real CPU *shadow* of their values, so a strategy that reads device
  data on the host (``naive``, ``precomputed``: ``mask.any()``, ``.tolist()``) gets the values a
  GPU would give; every such read is counted as a sync. A read of data that has no shadow is an
  error, never a made-up value.
* **CPU-only torch**: the few ``Tensor`` methods whose C++ binding opens a ``cuda`` device guard
  (indexing, ``copy_``, ``int()`` ...) run with their fake tensors reporting ``meta``;
  ``pin_memory`` returns the host tensor itself; ``data_ptr`` of a fake tensor gives a fake,
  256-byte aligned address (Triton reads it for its alignment specialization).
* **Triton**: with ``TRITON_INTERPRET=0`` the kernels are real ``JITFunction``\\ s. The active
  driver is a stub (``triton.runtime.driver.active``): ``get_current_device`` makes the Python
  calls ``torch.cuda.current_device`` makes (3), ``get_current_stream`` is a C callable as
  torch's is, the target is sm_90 (H100). ``JITFunction._do_compile`` is replaced: a cache miss
  stores a stub ``CompiledKernel`` in the kernel's real cache, whose ``launch_metadata`` is
  Triton's and whose ``run`` is a copy of ``CudaLauncher.__call__`` (scratch allocation
  included) ending in a counting no-op where the C launcher would be. So ``kernel[grid](...)``
  runs ``JITFunction.run`` for real: heuristics, argument binding and specialization, the cache
  key, the global-value check, the grid, the launcher.

What is counted, per strategy and per forward (``Engine.forward_prefill`` of a prepared batch,
as ``bench`` times it; preparing and aborting the batch are outside):

* ``launches``: Triton kernel launches (at the stub launcher), by kernel name;
* ``torch_ops``: top-level aten ops (a dispatch into the fake mode), split into ``kernels``
  (ops that launch device work: compute, device-to-device copies, fills), ``h2d`` (host-to-device
  uploads), ``syncs`` (device data read on the host), ``views`` and ``allocs`` (no device work);
* ``gpu_ops`` = launches + torch kernels + h2d: the work items a GPU trace would show (cuBLAS may
  run two kernels for one GEMM; an approximation, see ``docs``);
* ``py_calls``: Python frames entered (``sys.setprofile`` 'call' events: calls and generator
  resumptions, ``py_gen_resumes`` of them generator frames) outside the emulation: the fake
  mode's dispatch, the guard wrappers and the stub launcher's no-op are not counted, the stub
  driver and the copy of ``CudaLauncher.__call__`` are (they stand for Python that runs on a GPU);
* ``host_ms``: wall time of the forward (median and spread of ``--runs`` after ``--warmup``),
  ``dispatch_ms`` the part of it spent inside the fake mode's dispatch (the emulation's cost of
  the torch ops: on a GPU those ops cost a C++ dispatch and a launch, not measured here), and
  ``host_ms_python`` = host_ms - dispatch_ms: our Python and Triton's, the stub launch included.

Run on a quiet machine for the times; the counts do not depend on it. It only uses the package's
stable API (``Engine``, ``Request``, ``build_model``) plus torch and Triton, so it runs against an
older checkout too: ``PYTHONPATH=/tmp/before python mamba_edu/benchmarks/host.py --out ...``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from mamba_edu.benchmarks.common import commit_hash, package_checkout

DESCRIPTION = __doc__.split("\n\n")[0].replace("``python -m mamba_edu bench-host``: ", "")
STRATEGIES = ("naive", "precomputed", "sync_free", "fused")
DEFAULT_OUT = "out/bench/host.json"
#: Device tensors made from host data up to this many elements carry their real values.
SHADOW_NUMEL = 1 << 16
#: Fake addresses handed to Triton (aligned like the caching allocator's blocks).
_ALIGN = 256


class EmulationError(RuntimeError):
    """The emulated CUDA path met something it cannot emulate honestly (a read of device data
    whose value is unknown, Triton already in its interpreter)."""


# --- the run's stamp ------------------------------------------------------------------------------

def _dirty() -> bool | None:
    """Whether the package's checkout differs from its commit (None: unknown, no git there)."""
    if os.environ.get("MAMBA_EDU_COMMIT"):
        return None
    try:
        out = subprocess.run(["git", "-C", str(package_checkout()), "status", "--porcelain",
                              "--untracked-files=no", "--", "mamba_edu"],
                             capture_output=True, text=True, check=True).stdout
        return bool(out.strip())
    except (OSError, subprocess.CalledProcessError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def stamp() -> dict:
    """commit, date, device, versions (the convention of the other benchmarks' ``meta``)."""
    import torch
    from importlib.metadata import PackageNotFoundError, version
    try:
        triton_version = version("triton")
    except PackageNotFoundError:
        triton_version = None
    return dict(commit=commit_hash(), dirty=_dirty(),
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                device=f"{_cpu_name()} ({os.cpu_count()} CPUs), emulated cuda:0 (sm_90)",
                torch=torch.__version__, triton=triton_version, python=platform.python_version(),
                clock_log=None, load_avg=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                package=str(package_checkout()))


# --- tensors: a fake cuda device ----------------------------------------------------------------

#: Tensor methods whose C++ binding opens a device guard for their tensor (none for cuda in a
#: CPU-only torch): they run with the fake tensors reporting ``meta``.
_GUARDED = ("__getitem__", "__setitem__", "__int__", "__float__", "__index__", "__bool__",
            "__invert__", "copy_", "new", "new_tensor", "nonzero", "item", "tolist", "index_put_",
            "masked_fill_", "index_copy_", "index_fill_")


def _make_mode(stats):
    """The ``FakeTensorMode`` of the emulation; ``stats`` (a :class:`_Stats`) counts its ops."""
    import torch
    from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                               DynamicOutputShapeException, FakeTensor,
                                               FakeTensorMode)
    from torch.utils._pytree import tree_leaves, tree_map

    aten = torch.ops.aten
    allocs = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
              aten.new_empty.default, aten.new_empty_strided.default}
    device = torch.device("cuda", 0)
    queries = {aten.sym_size, aten.sym_stride, aten.sym_numel, aten.sym_storage_offset,
               aten.is_contiguous}

    def fake(t):
        return isinstance(t, FakeTensor)

    def shadow_of(t):
        return getattr(t, "_emu_shadow", None) if fake(t) else t

    def kind(func, args, out) -> str:
        if func is aten._local_scalar_dense.default:
            return "syncs"
        if func.namespace == "prim" or func.overloadpacket in queries:
            return "meta"  # t.device, sizes, strides: a C getter on a real tensor, no op
        if func in allocs:
            return "allocs"
        schema = func._schema
        if func.is_view or (not schema.is_mutable and schema.returns
                            and all(r.alias_info is not None for r in schema.returns)):
            return "views"
        ins = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
        if any(not fake(t) and t.device.type == "cpu" and t.dim() > 0 for t in ins):
            return "h2d"  # a host tensor into device memory: one upload
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if outs and all(t.device.type == "cpu" for t in outs) and any(fake(t) for t in ins):
            return "syncs"  # device data copied to the host
        return "kernels"

    class EmulatedCuda(FakeTensorMode):
        avoid_device_init = True

        def __init__(self):
            super().__init__(allow_non_fake_inputs=True)
            self._depth = 0
            self.host_real = False  # off while the model is built: its weights stay fake

        def dispatch(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self._depth:  # the fake mode's own nested ops
                return super().dispatch(func, types, args, kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                what, out = self._run(func, types, args, kwargs)
                if _Stats.current is not None:
                    _Stats.current.op(str(func.overloadpacket).split(".")[-1],
                                      what or kind(func, args, out))
                return out
            finally:
                if _Stats.current is not None:
                    _Stats.current.dispatch_s += time.perf_counter() - start
                self._depth -= 1

        def _run(self, func, types, args, kwargs):
            leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            to = kwargs.get("device")
            if self.host_real and not any(map(fake, leaves)) and (to is None or torch.device(to).type == "cpu"):
                return "host", func(*args, **kwargs)  # host data stays real, as on a GPU
            if func is aten._local_scalar_dense.default:
                value = shadow_of(args[0])
                if value is None:
                    raise EmulationError("a read of device data whose value the emulation does not "
                                         f"know ({func}): it cannot stand in for the GPU's value")
                return "syncs", value.item()
            known = self.host_real and all(shadow_of(t) is not None for t in leaves)
            small = all(t.numel() <= SHADOW_NUMEL for t in leaves)
            real = None
            try:
                out = super().dispatch(func, types, args, kwargs)
            except (DataDependentOutputException, DynamicOutputShapeException):
                real = _on_host(func, args, kwargs) if known and small and leaves else None
                if real is None:
                    raise EmulationError(f"an op whose result depends on device data the emulation "
                                         f"does not know ({func})") from None
                out = tree_map(lambda r: super(EmulatedCuda, self).dispatch(
                    aten.empty_strided.default, types, (r.shape, r.stride()),
                    dict(dtype=r.dtype, device=device)) if isinstance(r, torch.Tensor) else r, real)
            else:
                if known and small and func not in allocs and all(
                        t.numel() <= SHADOW_NUMEL for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
                    real = _on_host(func, args, kwargs)
            if real is None and func._schema.is_mutable:
                for arg, value in zip(func._schema.arguments, args):
                    if arg.alias_info is not None and arg.alias_info.is_write and fake(value):
                        value._emu_shadow = None  # written with values the emulation does not know
            if real is not None:
                for f, r in zip(tree_leaves(out), tree_leaves(real)):
                    if fake(f) and isinstance(r, torch.Tensor) and f.shape == r.shape:
                        f._emu_shadow = r
            return None, out

    def _on_host(func, args, kwargs):
        """The op on the shadows (real CPU tensors), or None where it cannot run there."""
        def host(x):
            if isinstance(x, torch.Tensor):
                return shadow_of(x)
            if isinstance(x, torch.device) and x.type != "cpu":
                return torch.device("cpu")
            return x
        hargs, hkwargs = tree_map(host, args), tree_map(host, kwargs)
        if "device" in hkwargs:
            hkwargs["device"] = torch.device("cpu")
        try:
            out = func(*hargs, **hkwargs)
        except Exception:  # noqa: BLE001 - no host value: the op stays fake only
            return None
        return out

    return EmulatedCuda()


@contextlib.contextmanager
def _tensor_patches(mode):
    """The ``Tensor`` method patches of a CPU-only torch (see the module docstring)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves

    meta, cuda = torch.device("meta"), torch.device("cuda", 0)

    def on_device(t):
        return isinstance(t, FakeTensor) and t.fake_device.type == "cuda"

    def guarded(name):
        # fake_device.call_on_meta does the same; this module keeps its own so that it runs
        # against an older checkout too (its "before" measurement)
        method = getattr(torch.Tensor, name)

        def call(self, *args, **kwargs):
            moved = [t for t in tree_leaves((self, args, kwargs)) if on_device(t)]
            if name == "tolist" and on_device(self):  # a read: the shadow's values, one sync
                mode_stats = _Stats.current
                value = getattr(self, "_emu_shadow", None)
                if value is None:
                    raise EmulationError("a .tolist() of device data whose values the emulation "
                                         "does not know")
                if mode_stats is not None:
                    mode_stats.op("tolist", "syncs")
                return value.tolist()
            for t in moved:
                t.fake_device = meta
            try:
                out = method(self, *args, **kwargs)
            finally:
                for t in moved:
                    t.fake_device = cuda
            for t in tree_leaves(out) if moved else ():
                if isinstance(t, FakeTensor) and t.fake_device.type == "meta":
                    t.fake_device = cuda
            return out
        call.__name__ = name
        return call

    def data_ptr(self):
        return _ALIGN * (1 + id(self) % (1 << 30))

    def pin_memory(self, *args, **kwargs):
        return self

    saved = {name: FakeTensor.__dict__.get(name) for name in (*_GUARDED, "data_ptr")}
    wrappers = {name: guarded(name) for name in _GUARDED}
    wrappers["data_ptr"] = data_ptr
    old_pin = torch.Tensor.pin_memory
    for name, fn in wrappers.items():
        setattr(FakeTensor, name, fn)
    torch.Tensor.pin_memory = pin_memory
    try:
        yield [fn.__code__ for fn in wrappers.values()] + [pin_memory.__code__]
    finally:
        torch.Tensor.pin_memory = old_pin
        for name, method in saved.items():
            if method is None:
                delattr(FakeTensor, name)
            else:
                setattr(FakeTensor, name, method)


# --- Triton: a stub driver and compiled kernel ----------------------------------------------------

class _Tls:
    is_initializing = False


def _is_initialized():  # torch.cuda.is_initialized
    return True


def _lazy_init():  # torch.cuda._lazy_init: returns at once once initialized
    if _is_initialized() or _Tls.is_initializing:
        return


def _current_device():  # torch.cuda.current_device: Python, then a C getter
    _lazy_init()
    return abs(0)


class _FakeDriver:
    """``triton.runtime.driver.active`` without a GPU (see the module docstring)."""

    def __init__(self, real):
        from triton.backends.compiler import GPUTarget
        self._real = real
        self._target = GPUTarget("cuda", 90, 32)
        self.get_current_device = _current_device
        self.get_current_stream = int  # torch._C._cuda_getCurrentRawStream: a C call, 0 = default

    def get_current_target(self):
        return self._target

    def get_active_torch_device(self):
        import torch
        return torch.device("cuda", 0)

    def get_device_capability(self, device=0):
        return (9, 0)

    def is_active(self):
        return True

    def __getattr__(self, name):  # anything else: refuse, never a silent real GPU call
        raise EmulationError(f"the emulated Triton driver has no {name!r}")


def _c_launch(*args):
    """Where the C launcher would be (not counted as a Python call; what it calls is): it calls
    the launch enter and exit hooks as Triton's C launcher does, and counts the launch. The
    kernel may write its tensor arguments: their host shadows are dropped (a later host read of
    one is an error, never a stale value)."""
    launch_metadata, enter, leave, kernel_args = args[8], args[9], args[10], args[15]
    if enter is not None:
        enter(launch_metadata)
    stats = _Stats.current
    stats.launches += 1
    stats.kernels[stats.kernel_name] = stats.kernels.get(stats.kernel_name, 0) + 1
    for arg in kernel_args:
        if getattr(arg, "_emu_shadow", None) is not None:
            arg._emu_shadow = None
    if leave is not None:
        leave(launch_metadata)


class _FakeLauncher:
    """A copy of ``CudaLauncher.__call__`` (Triton 3.7) ending in :func:`_c_launch`."""

    def __init__(self, name):
        self.name, self.num_ctas = name, 1
        self.global_scratch_size = self.profile_scratch_size = 0
        self.global_scratch_align = self.profile_scratch_align = 1
        self.launch_cooperative_grid = self.launch_pdl = False
        self.arg_annotations = self.kernel_signature = None
        self.launch = _c_launch

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                 launch_enter_hook, launch_exit_hook, *args):

        def allocate_scratch(size, align, allocator):
            if size > 0:
                raise EmulationError("a kernel with global scratch: not emulated")
            return None

        global_scratch = allocate_scratch(self.global_scratch_size, self.global_scratch_align, None)
        profile_scratch = allocate_scratch(self.profile_scratch_size, self.profile_scratch_align, None)
        _Stats.current.kernel_name = self.name
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    kernel_metadata, launch_metadata, launch_enter_hook, launch_exit_hook, global_scratch,
                    profile_scratch, self.arg_annotations, self.kernel_signature, args)


def _fake_compiled_kernel(fn, signature, constexprs, attrs):
    """A real ``CompiledKernel`` object (its ``run`` property, ``_init_handles`` and
    ``launch_metadata`` are Triton's own) made without compiling: loaded already, its launcher
    a :class:`_FakeLauncher`."""
    from triton.compiler.compiler import ASTSource, CompiledKernel
    kernel = object.__new__(CompiledKernel)
    kernel.src = ASTSource(fn, signature, constexprs, attrs)
    kernel.name = fn.__name__
    kernel.module, kernel.function, kernel.packed_metadata = object(), 0, ()
    kernel.metadata, kernel.hash = None, None
    kernel._run = _FakeLauncher(kernel.name)
    return kernel


@contextlib.contextmanager
def _triton_stub(stats):
    import triton.runtime.jit as jit
    from triton.runtime.driver import driver

    if not hasattr(jit.JITFunction, "_do_compile"):
        raise EmulationError(f"this Triton ({getattr(jit, '__file__', '?')}) has no "
                             "JITFunction._do_compile: the launch path cannot be emulated")
    old_driver, old_compile = driver._active, jit.JITFunction._do_compile

    def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel_cache = self.device_caches[device][0]
        kernel = kernel_cache[key] = _fake_compiled_kernel(self, signature, constexprs, attrs)
        stats.compiled += 1
        return kernel

    driver.set_active(_FakeDriver(old_driver))
    jit.JITFunction._do_compile = _do_compile
    try:
        yield [_do_compile.__code__]
    finally:
        jit.JITFunction._do_compile = old_compile
        driver._active = old_driver
        # kernels "compiled" here must not survive into a real run
        for fn in list(jit._triton_jit_function_registry.values()) if hasattr(
                jit, "_triton_jit_function_registry") else ():
            if isinstance(fn, jit.JITFunction):
                fn.device_caches.clear()


# --- counting -----------------------------------------------------------------------------------

class _Stats:
    """Counts of one forward."""
    current: _Stats | None = None

    def __init__(self):
        self.ops: collections.Counter = collections.Counter()
        self.kinds: collections.Counter = collections.Counter()
        self.kernels: dict = {}
        self.launches, self.compiled, self.dispatch_s = 0, 0, 0.0
        self.kernel_name = "?"

    def op(self, name, kind):
        self.kinds[kind] += 1
        if kind in ("kernels", "h2d", "syncs"):
            self.ops[f"{name} ({kind})" if kind != "kernels" else name] += 1


class _CallCounter:
    """``sys.setprofile``: Python frames entered, except below an emulation entry point."""

    def __init__(self, excluded_codes, excluded_files=()):
        self.excluded = set(excluded_codes)
        self.excluded_files = set(excluded_files)
        self.transparent = {_c_launch.__code__}  # stands for C: not counted, its callees are
        self.calls = self.gen_resumes = 0
        self.by_file: collections.Counter = collections.Counter()
        self._inside = None

    def __call__(self, frame, event, arg):
        if event == "call":
            if self._inside is not None:
                return
            code = frame.f_code
            if code in self.excluded or code.co_filename in self.excluded_files or (
                    code.co_name == "remove" and code.co_filename == _WEAKREF_FILE):
                self._inside = frame
                return
            if code in self.transparent:
                return
            self.calls += 1
            if code.co_flags & 0x2A0:  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR
                self.gen_resumes += 1
            self.by_file[code.co_filename] += 1
        elif event == "return" and frame is self._inside:
            self._inside = None


_WEAKREF_FILE = __import__("weakref").__file__


def _excluded_codes(mode_codes):
    """Entry points of the emulation: below them nothing is counted. The fake mode's dispatch,
    the ``device`` property of a fake tensor (a C getter on a real one), the patched methods, and
    what only a tensor subclass makes the dispatcher call (the Python dispatch-rule registry,
    the fake mode's weak-reference callbacks); the files come back as a second list."""
    import torch._library.simple_registry as registry
    import torch.utils.weak as weak
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    codes = list(mode_codes)
    for prop in ("device", "fake_device"):
        fget = getattr(FakeTensor.__dict__.get(prop), "fget", None)
        if fget is not None:
            codes.append(fget.__code__)
    for owner in (FakeTensor, FakeTensorMode):
        fn = owner.__dict__.get("__torch_dispatch__")
        fn = getattr(fn, "__func__", fn)
        if fn is not None:
            codes.append(fn.__code__)
    return codes, [registry.__file__, weak.__file__]


# --- the run ------------------------------------------------------------------------------------

def _check_triton_mode():
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        from triton import knobs
        knobs.runtime.interpret = False
    except (ImportError, AttributeError):
        pass
    kernels = sys.modules.get("mamba_edu.kernels")
    if kernels is not None:
        import triton.runtime.interpreter as interp
        for mod in [m for n, m in list(sys.modules.items()) if n.startswith("mamba_edu.kernels")]:
            for value in vars(mod).values():
                if isinstance(value, interp.InterpretedFunction):
                    raise EmulationError("mamba_edu's kernels were imported in Triton's interpreter "
                                         "(TRITON_INTERPRET=1) before this run: run bench-host in a "
                                         "process of its own")


def _to_device(model, device):
    """``model.to(device)`` for fake weights (``Module.to`` cannot swap a fake parameter)."""
    import torch
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(p.to(device), requires_grad=False)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = b.to(device)
    return model


def measure(preset="qwen3.5-tp8", lengths=(512,), strategies=STRATEGIES, runs=7, warmup=2,
            dtype="bfloat16", seed=0, count_calls=True, log=print) -> dict:
    """The results per strategy (see the module docstring)."""
    _check_triton_mode()
    import torch

    from mamba_edu.engine import Engine, Request
    from mamba_edu.model import build_model

    stats = _Stats()
    mode = _make_mode(stats)
    device = torch.device("cuda", 0)
    with _tensor_patches(mode) as tensor_codes, _triton_stub(stats) as triton_codes, mode:
        _Stats.current = stats
        try:
            model = _to_device(build_model(preset, device="cpu", dtype=getattr(torch, dtype), seed=seed),
                               device)
            mode.host_real = True
            gen = torch.Generator().manual_seed(seed)
            vocab = model.config.vocab
            prompts = [torch.randint(vocab, (n,), generator=gen).tolist() for n in lengths]
            excluded, excluded_files = _excluded_codes(tensor_codes + triton_codes)
            results = {}
            for strategy in strategies:
                results[strategy] = _one_strategy(Engine, Request, model, strategy, prompts, runs,
                                                  warmup, count_calls, (excluded, excluded_files), log)
        finally:
            _Stats.current = None
    return results


def _one_strategy(Engine, Request, model, strategy, prompts, runs, warmup, count_calls, excluded, log):
    engine = Engine(model, strategy=strategy, max_requests=max(1, len(prompts)), cache_chunk=64)
    serial = iter(range(1 << 30))

    def forward(profiler=None):
        batch = engine.prepare_prefill([Request((strategy, next(serial), i), p)
                                        for i, p in enumerate(prompts)])
        fresh = _Stats()
        _Stats.current, old = fresh, _Stats.current
        try:
            if profiler is not None:
                sys.setprofile(profiler)
            start = time.perf_counter()
            try:
                engine.forward_prefill(batch)
            finally:
                elapsed = time.perf_counter() - start
                sys.setprofile(None)
        finally:
            _Stats.current = old
            engine.abort_prefill(batch)
        return fresh, elapsed

    for _ in range(warmup):
        forward()
    times, counts = [], None
    for _ in range(runs):
        s, elapsed = forward()
        times.append((elapsed, s.dispatch_s))
        counts = counts or s
    calls = None
    if count_calls:
        counter = _CallCounter(*excluded)
        forward(counter)
        calls = counter
    return _summary(strategy, times, counts, calls, log)


def _summary(strategy, times, s, calls, log) -> dict:
    host = [t * 1e3 for t, _ in times]
    disp = [d * 1e3 for _, d in times]
    py = [(t - d) * 1e3 for t, d in times]
    gpu_ops = s.launches + s.kinds["kernels"] + s.kinds["h2d"]
    out = dict(
        launches=s.launches, launches_by_kernel=dict(sorted(s.kernels.items(), key=lambda kv: -kv[1])),
        torch_ops=sum(n for k, n in s.kinds.items() if k not in ("meta", "host")),
        torch_ops_by_kind=dict(s.kinds),
        torch_ops_launching=dict(s.ops.most_common()), syncs=s.kinds["syncs"], gpu_ops=gpu_ops,
        host_ms=_spread(host), dispatch_ms=_spread(disp), host_ms_python=_spread(py),
        host_us_per_gpu_op=round(statistics.median(host) * 1e3 / gpu_ops, 1) if gpu_ops else None,
        host_python_us_per_gpu_op=round(statistics.median(py) * 1e3 / gpu_ops, 1) if gpu_ops else None)
    if calls is not None:
        out.update(py_calls=calls.calls, py_gen_resumes=calls.gen_resumes,
                   py_calls_per_gpu_op=round(calls.calls / gpu_ops, 1) if gpu_ops else None,
                   py_calls_no_gen_per_gpu_op=(round((calls.calls - calls.gen_resumes) / gpu_ops, 1)
                                               if gpu_ops else None),
                   py_calls_by_file=_by_package(calls.by_file))
    log(f"{strategy:>12}: {s.launches:4d} launches + {s.kinds['kernels']:4d} torch kernels + "
        f"{s.kinds['h2d']} h2d = {gpu_ops:4d} GPU ops, {s.kinds['syncs']:3d} syncs, "
        f"{out.get('py_calls', '-')} Python calls ({out.get('py_calls_per_gpu_op', '-')}/op), host "
        f"{out['host_ms']['median']:.1f} ms (python {out['host_ms_python']['median']:.1f} ms)")
    return out


def _spread(values) -> dict:
    return dict(median=round(statistics.median(values), 3), min=round(min(values), 3),
                max=round(max(values), 3), runs=[round(v, 3) for v in values])


def _by_package(by_file) -> dict:
    """Python calls grouped: mamba_edu's modules by name, torch, triton, the rest."""
    groups: collections.Counter = collections.Counter()
    for path, n in by_file.items():
        p = path.replace(os.sep, "/")
        if p == __file__.replace(os.sep, "/"):
            groups["stub driver/launcher (for torch.cuda.current_device, CudaLauncher.__call__)"] += n
        elif "/mamba_edu/" in p:
            groups["mamba_edu/" + p.split("/mamba_edu/", 1)[1]] += n
        elif "/torch/" in p:
            groups["torch"] += n
        elif "/triton/" in p or p == "<string>":
            groups["triton"] += n
        else:
            groups["other"] += n
    return dict(groups.most_common())


# --- command line -------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="qwen3.5-tp8", help="model preset (mamba_edu/model/config.py)")
    p.add_argument("--lengths", default="512", help="prompt lengths, comma-separated (one request each)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated strategies")
    p.add_argument("--runs", type=int, default=7, help="timed forwards per strategy (median, spread)")
    p.add_argument("--warmup", type=int, default=2, help="untimed forwards first")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-calls", action="store_true", help="skip the (slow) Python call count")
    p.add_argument("--out", default=None,
                   help=f"JSON file (default {DEFAULT_OUT}); a path under data/ is written only when "
                        "given here")


def check_args(parser: argparse.ArgumentParser, args):
    args.lengths = tuple(int(x) for x in args.lengths.split(",") if x)
    args.strategies = tuple(s for s in args.strategies.split(",") if s)
    bad = [s for s in args.strategies if s not in STRATEGIES]
    if bad or not args.strategies:
        parser.error(f"--strategies must be among {list(STRATEGIES)}; got {bad or 'none'}")
    if not args.lengths or min(args.lengths) < 1:
        parser.error("--lengths must be positive ints")
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be >= 1 and --warmup >= 0")
    return args


def out_path(out: str | None) -> Path:
    """Where the JSON goes: ``--out`` as given, else :data:`DEFAULT_OUT` (never ``data/``)."""
    return Path(out) if out else Path(DEFAULT_OUT)


def run(args) -> int:
    path = out_path(args.out)
    meta = stamp()
    meta.update(preset=args.preset, lengths=list(args.lengths), dtype=args.dtype, runs=args.runs,
                warmup=args.warmup, seed=args.seed, method=(
                    "emulated CUDA eager path on a CPU: FakeTensorMode tensors on a fake cuda:0, "
                    "Triton JITFunction.run with a stub driver and a stub CompiledKernel (launch "
                    "counted at the stub C launcher); see mamba_edu/benchmarks/host.py"),
                command=" ".join([os.path.basename(sys.executable), *sys.argv]))
    print(f"bench-host: {args.preset} {list(args.lengths)} {args.dtype}, commit {meta['commit']}")
    try:
        results = measure(args.preset, args.lengths, args.strategies, args.runs, args.warmup,
                          args.dtype, args.seed, count_calls=not args.no_calls)
    except EmulationError as err:
        print(f"bench-host: {err}", file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(meta=meta, results=results), indent=1) + "\n")
    print(f"bench-host: wrote {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench-host", description=DESCRIPTION)
    add_arguments(parser)
    args = check_args(parser, parser.parse_args(argv))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
