"""Registers, spills and shared memory of the prefill kernels on an H100/H200, compiled on a CPU.

``python -m mamba_edu.lab.bench_sm90_resources [--out FILE] [--case NAME ...]`` needs no GPU. Per case
(the reference benchmark's shapes, :data:`mamba_edu.benchmarks.references.CASES`) it

1. runs the package's prefill (:func:`mamba_edu.kernels.gdn_prefill`, as the benchmark's ``ours``
   arm calls it), the lab's :func:`~mamba_edu.lab.scan_builds_wu.prefill_scan_builds_wu` and
   :func:`~mamba_edu.lab.chunk_loop.prefill_chunk_loop` (and, at the first case, its other
   tilings :data:`LOOP_CONFIGS`) in the Triton interpreter, recording each kernel launch's
   arguments instead of running it (a child process: the interpreter is chosen when the kernels
   are imported);
2. compiles every recorded launch for sm_90a in a second child (Triton's own compiler, no
   driver), with the fp16 tensors made bf16 (the interpreter refuses bf16; the GPU runs bf16);
3. asks ``ptxas -v`` (shipped with Triton) for registers per thread and spill bytes, reads the
   shared memory from the compiled kernel, and says how many programs of it fit one SM by
   registers (65,536) and by shared memory (228 KiB);
4. adds each kernel's byte model (``model_mb``: each tensor read or written once, bf16) for the
   package's kernels and the ``scan_builds_wu`` variant: the DRAM bytes a GPU run should find
   (:mod:`mamba_edu.benchmarks.breakdown` measures them), so a GPU minute tests a prediction.

A kernel that spills, or fits one program per SM, is slow before it runs; a number here is a
compile fact, not a timing. It is Triton's output on this machine (the version is
recorded), which may differ from the Triton of the GPU machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

import torch

TARGET_CAPABILITY = 90
# The chunk loop's other tilings, compiled at the first case only (its code does not depend on
# the shape): narrower V-tiles hold less state, more warps spread the registers.
LOOP_CONFIGS = [(128, 8), (128, 16), (64, 4), (64, 8), (32, 4), (32, 8), (16, 8)]
SHARED_PER_SM, SHARED_RESERVED = 228 * 1024, 1024  # an H100/H200 SM; the driver keeps 1 KiB per program
_PTXAS_LINE = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _describe(value):
    """A launch argument made picklable: a tensor becomes ``("tensor", dtype, size, stride,
    offset, storage elements)``, so that the compile step rebuilds one with the same alignment."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype).removeprefix("torch."), tuple(value.shape),
                tuple(value.stride()), value.storage_offset(),
                value.untyped_storage().nbytes() // value.element_size())
    return value


def _rebuild(value, bf16: bool):
    if isinstance(value, tuple) and value[:1] == ("tensor",):
        _, dtype, size, stride, offset, numel = value
        dtype = getattr(torch, dtype)
        if bf16 and dtype == torch.float16:
            dtype = torch.bfloat16
        return torch.empty(numel, dtype=dtype).as_strided(size, stride, offset)
    return value


def record(cases: list[str]) -> list[dict]:
    """Step 1 (under ``TRITON_INTERPRET=1``): the launches of each case, nothing run."""
    from triton.runtime.interpreter import InterpretedFunction

    from mamba_edu.benchmarks.references import CASES, PRESETS, case_name
    from mamba_edu.kernels import build_chunk_meta_with_indices, gdn_prefill
    from mamba_edu.kernels.inputs import random_prefill_inputs
    from mamba_edu.lab.chunk_loop import prefill_chunk_loop
    from mamba_edu.lab.scan_builds_wu import prefill_scan_builds_wu

    launches, where = [], {}

    def run(self, *args, grid, warmup, **kwargs):
        launches.append({**where, "kernel": (self.fn.__module__, self.fn.__name__),
                         "grid": tuple(grid(kwargs) if callable(grid) else grid),
                         "args": [_describe(a) for a in args],
                         "kwargs": {k: _describe(v) for k, v in kwargs.items()}})

    shapes = {case_name(p, lengths): (p, lengths) for p, lengths in CASES}
    original, InterpretedFunction.run = InterpretedFunction.run, run
    try:
        for name in cases:
            preset, lengths = shapes[name]
            H, HV = PRESETS[preset]
            x = random_prefill_inputs(lengths, H, HV, 128, 128, dtype=torch.float16, device="cpu")
            meta, indices = build_chunk_meta_with_indices(lengths, "cpu",
                                                          state_indices=list(range(1, len(lengths) + 1)))
            pool = torch.zeros(len(lengths) + 1, HV, 128, 128)
            where.update(case=name, arm="ours")
            gdn_prefill(**x, state_pool=pool, meta=meta, **indices, impl="triton")
            where.update(arm="lab_scan_builds_wu")
            prefill_scan_builds_wu(x["q"], x["k"], x["v"], x["g"], x["beta"], pool,
                                   indices["state_indices"], meta, 128 ** -0.5, True)
            for block_v, warps in [(None, 4)] + (LOOP_CONFIGS if name == cases[0] else []):
                where.update(arm="lab_chunk_loop" if block_v is None else
                             f"lab_chunk_loop BV={block_v} warps={warps}")
                prefill_chunk_loop(x["q"], x["k"], x["v"], x["g"], x["beta"], pool,
                                   indices["state_indices"], meta, 128 ** -0.5, True,
                                   block_v=block_v, num_warps=warps)
    finally:
        InterpretedFunction.run = original
    return launches


#: Which stage of a byte model each compiled kernel is (the package's three and the variant's two).
STAGE_OF = {"chunk_prepare_kernel": "prepare", "chunk_scan_kernel": "scan",
            "chunk_output_kernel": "output", "prepare_t_kernel": "prepare", "scan_t_kernel": "scan"}


def scan_builds_wu_bytes(T: int, N: int, H: int, HV: int, act: int = 2) -> dict[str, int]:
    """HBM bytes each kernel of :mod:`mamba_edu.lab.scan_builds_wu` moves at minimum (each tensor
    read or written once, K = V = 128), in the form of the package's
    :func:`~mamba_edu.benchmarks.kernels._stage_bytes` (the output kernel is the same one)."""
    from mamba_edu.benchmarks.kernels import K, V, _stage_bytes
    NT = T // 64 + N  # upper bound on the number of chunks
    keys, inverse, h = T * H * K * act, NT * HV * 64 * 64 * act, NT * HV * K * V * act
    prepare = 2 * keys + 4 * T * HV * 4 + inverse                      # k, g, β in; k̂, Γ, β, T out
    scan = keys + inverse + T * HV * V * act + 2 * T * HV * 4          # k̂, T, v, Γ, β in
    scan += 2 * N * HV * K * V * 4 + T * HV * V * act + h              # S in and out; Ṽ, h out
    return {"prepare": prepare, "scan": scan, "output": _stage_bytes(T, N, H, HV, act)["output"]}


def model_megabytes(case: str, arm: str) -> dict[str, float]:
    """The byte model of ``arm`` (``ours`` or ``lab_scan_builds_wu``) at a reference ``case``, MB
    per stage; empty for an arm without one (the chunk loop)."""
    from mamba_edu.benchmarks.kernels import _stage_bytes
    from mamba_edu.benchmarks.references import PRESETS
    preset, shape = case.split()
    n, length = map(int, shape.split("x"))
    model = {"ours": _stage_bytes, "lab_scan_builds_wu": scan_builds_wu_bytes}.get(arm)
    return {} if model is None else {k: v / 1e6 for k, v in model(n * length, n, *PRESETS[preset]).items()}


def parse_ptxas(text: str) -> dict:
    """``{"registers", "spill_stores", "spill_loads"}`` from ``ptxas -v``'s report of one kernel."""
    regs, spills = _PTXAS_LINE.search(text), _SPILLS.search(text)
    if regs is None or spills is None:
        raise ValueError(f"ptxas -v printed no register or spill line: {text.strip()[:200]!r}")
    return {"registers": int(regs.group(1)), "spill_stores": int(spills.group(1)),
            "spill_loads": int(spills.group(2))}


def compile_launch(launch: dict, bf16: bool = True) -> dict:
    """Step 2 (under ``TRITON_INTERPRET=0``): one launch compiled for sm_90a, with its resources."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import JITFunction, create_function_from_signature

    module, name = launch["kernel"]
    fn = getattr(importlib.import_module(module), name)
    while not isinstance(fn, JITFunction):  # @triton.heuristics wraps the kernel; its values are recorded
        fn = fn.fn
    target = GPUTarget("cuda", TARGET_CAPABILITY, 64)
    backend = make_backend(target)
    args = [_rebuild(a, bf16) for a in launch["args"]]
    kwargs = {k: _rebuild(v, bf16) for k, v in launch["kwargs"].items()}
    kwargs.update(debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, specialization, options = create_function_from_signature(fn.signature, fn.params, backend)(
        *args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    kernel = triton_compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                            options=options.__dict__)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        report = subprocess.run([_ptxas_path(), "-v", f"--gpu-name=sm_{TARGET_CAPABILITY}a",
                                 ptx, "-o", os.path.join(tmp, "k.cubin")],
                                capture_output=True, text=True, check=True)
    threads = 32 * kernel.metadata.num_warps
    used = parse_ptxas(report.stdout + report.stderr)
    return {"case": launch["case"], "arm": launch["arm"], "kernel": name, "grid": list(launch["grid"]),
            "num_warps": kernel.metadata.num_warps, "num_stages": kernel.metadata.num_stages,
            **used, "shared_bytes": kernel.metadata.shared,
            "register_limited_programs_per_sm": 65536 // (used["registers"] * threads),
            "shared_limited_programs_per_sm": SHARED_PER_SM // (kernel.metadata.shared + SHARED_RESERVED)}


def _child(step: str, interpret: str, payload: str, result: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": interpret}
    subprocess.run([sys.executable, "-m", "mamba_edu.lab.bench_sm90_resources", "--step", step,
                    payload, result], env=env, check=True)


def main(argv=None) -> int:
    from mamba_edu.benchmarks.references import CASES, case_name, commit_hash

    parser = argparse.ArgumentParser(prog="python -m mamba_edu.lab.bench_sm90_resources",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=[case_name(*c) for c in CASES],
                        help="a reference shape (repeat; default: all of them)")
    parser.add_argument("--out", help="write the JSON here (default: print it)")
    parser.add_argument("--step", choices=["record", "compile"], help=argparse.SUPPRESS)
    parser.add_argument("files", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:  # a child: read the payload, write the result
        with open(args.files[0], "rb") as f:
            payload = pickle.load(f)
        out = record(payload) if args.step == "record" else [compile_launch(x) for x in payload]
        with open(args.files[1], "wb") as f:
            pickle.dump(out, f)
        return 0
    cases = args.case or [case_name(p, n) for p, n in CASES]
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, n) for n in ("cases", "launches", "rows")]
        with open(paths[0], "wb") as f:
            pickle.dump(cases, f)
        _child("record", "1", paths[0], paths[1])
        _child("compile", "0", paths[1], paths[2])
        with open(paths[2], "rb") as f:
            rows = pickle.load(f)
    for r in rows:
        r["model_mb"] = model_megabytes(r["case"], r["arm"]).get(STAGE_OF.get(r["kernel"]))
    import triton
    ptxas = subprocess.run([_ptxas_path(), "--version"], capture_output=True, text=True).stdout
    result = {"meta": {"commit": commit_hash(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "device": f"none: compiled on a CPU for sm_{TARGET_CAPABILITY}a, not run",
                       "machine_gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                       "torch": torch.__version__, "triton": triton.__version__,
                       "ptxas": ptxas.strip().splitlines()[-1], "dtype": "bfloat16",
                       "command": "python -m mamba_edu.lab.bench_sm90_resources"},
              "rows": rows}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    for r in rows:
        print(f"{r['case']:22} {r['arm']:15} {r['kernel']:22} warps {r['num_warps']} regs {r['registers']:3} "
              f"spills {r['spill_stores']}/{r['spill_loads']} B smem {r['shared_bytes']}"
              + ("" if r["model_mb"] is None else f" model {r['model_mb']:.0f} MB"), file=sys.stderr)
    return 0


def _ptxas_path() -> str:
    """The ptxas Triton itself would use for sm_90a (Triton 3.9 ships a second one for newer PTX)."""
    from triton.backends.nvidia.compiler import get_ptxas
    return get_ptxas(TARGET_CAPABILITY).path


if __name__ == "__main__":
    raise SystemExit(main())
