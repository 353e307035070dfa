"""Grading submitted notebooks: one judge process per notebook, watched from outside it.

For every notebook, :func:`grade_paths`

1. refuses what is not a notebook (a symbolic link, a folder, a file that is not a valid one),
2. copies the notebook's folder to a throwaway directory (regular files only: no symbolic links,
   no other notebooks, so no ``solutions/``) and the package to a private copy, written from the
   snapshot taken when grading began, that this notebook alone imports,
3. starts one judge there (:mod:`~mamba_edu.grading.judge`: it runs the notebook, then the
   checks) under the launcher of :mod:`~mamba_edu.grading.containment` (a PID namespace of its
   own where one can be had, resource limits), with ``--sandbox`` inside bubblewrap too, with an
   allow-list of environment variables and a fresh grading seed,
4. reads the judge's reports, counting only the lines that start with the secret it gave the
   judge on stdin. A step (a cell, a check) that runs past ``timeout``, a judge that dies first
   (``os._exit``, a limit reached, a signal), or a change to the package gives the notebook 0 with
   the reason; grading goes on with the next notebook,
5. kills the judge and everything it started before the verdict is reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import mamba_edu
from mamba_edu.exercises import core
from mamba_edu.exercises.core import ExerciseResult, NotebookResult
from mamba_edu.grading.containment import (JudgeLimits, become_subreaper, children, death_cause, kill_descendants,
                                             not_dumpable, read_regular)
from mamba_edu.profiling.trace_files import TraceError

PACKAGE_DIR = Path(mamba_edu.__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent


# --- what may be graded -----------------------------------------------------------------------

def _refusal(path: Path) -> tuple[str | None, bytes]:
    """Why ``path`` cannot be graded (or None), and its bytes: read once, so that what is
    validated here is what the judge runs (no swap after the check)."""
    if path.is_symlink():
        return "is a symbolic link (submit the notebook itself)", b""
    try:
        raw = read_regular(path)
    except TraceError as err:  # refused at the open: a folder, a pipe, a device; or unreadable
        return ("is not a regular file" if "cannot be opened" not in str(err) else f"cannot be read ({err})"), b""
    except ValueError as err:
        return f"is too large to be a notebook ({str(err)[-60:]})", b""
    try:
        data = json.loads(raw)
    except ValueError as err:
        return f"is not a JSON notebook ({type(err).__name__}: {str(err)[:80]})", b""
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        return "is not a Jupyter notebook (no list of cells)", b""
    try:
        import nbformat
        nbformat.validate(nbformat.from_dict(data))
    except Exception as err:  # noqa: BLE001 - any validation error is a refusal
        return f"is not a valid notebook ({type(err).__name__})", b""
    return None, raw


def code_cells(raw: bytes) -> list[str]:
    """The sources of a notebook's code cells, from its validated bytes."""
    return ["".join(cell.get("source", "")) for cell in json.loads(raw)["cells"] if cell.get("cell_type") == "code"]


def throwaway_copy(notebook: Path, raw: bytes, workdir: Path) -> Path:
    """The notebook's folder copied under ``workdir``: regular files and folders only, no other
    notebook; the notebook itself as ``raw``, the bytes that were validated."""
    folder = workdir / "folder"

    def ignore(directory, names):
        return {name for name in names if name.endswith(".ipynb") or name in ("__pycache__", ".git", ".venv")
                or (p := Path(directory, name)).is_symlink() or not (p.is_file() or p.is_dir())}

    shutil.copytree(notebook.parent, folder, ignore=ignore, symlinks=True)
    (folder / notebook.name).write_bytes(raw)
    return folder


def bwrap_prefix(workdir: Path, package_root: Path) -> list[str]:
    """bubblewrap around the judge: everything read-only but ``workdir`` (the copy, a private temp
    dir); no network; its own PID namespace; the solutions hidden."""
    args = [shutil.which("bwrap"), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--bind", str(workdir), str(workdir), "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--die-with-parent", "--new-session"]
    # read-only too, wherever they live (under /tmp, a clone or a venv): Python, the package
    for path in sorted({p.resolve() for p in (Path(sys.prefix), package_root, REPO_DIR, REPO_DIR / "data")}):
        args += ["--ro-bind", str(path), str(path)]
    if (REPO_DIR / "notebooks" / "solutions").is_dir():
        args += ["--tmpfs", str(REPO_DIR / "notebooks" / "solutions")]
    return args


#: The only variables the judge inherits: what Python, torch and Triton need to run. Tokens,
#: credentials and the grading seed stay behind (the judge gets the seed after the cells ran).
JUDGE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "TRITON_INTERPRET",
             "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LD_LIBRARY_PATH")


def judge_environment(package_root: Path, private: Path) -> dict:
    """The judge's environment: :data:`JUDGE_ENV` from this process's, the private package first
    on the path, the caches and temp files in ``private``."""
    return {**{k: os.environ[k] for k in JUDGE_ENV if k in os.environ},
            "PYTHONPATH": os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")])),
            "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "TMPDIR": str(private),
            "IPYTHONDIR": str(private / "ipython"), "MPLCONFIGDIR": str(private / "mpl"),
            "TRITON_CACHE_DIR": str(private / "triton")}


# --- the package: a private copy per notebook -------------------------------------------------

#: The modules a verdict depends on: a change to them in the installed package gives 0.
GUARDED = ("exercises", "profiling/syncs.py", "profiling/fake_device.py", "probes.py")


def _package_snapshot(root: Path = PACKAGE_DIR) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _changed(snapshot: dict[str, bytes], root: Path) -> list[str]:
    now = _package_snapshot(root) if root.is_dir() else {}
    return [n for n in sorted(set(snapshot) | set(now)) if snapshot.get(n) != now.get(n)]


def private_package(snapshot: dict[str, bytes], workdir: Path) -> Path:
    """A private copy of the package (and of ``data/``, which it reads) for one notebook's judge,
    written from the snapshot taken when grading began."""
    for name, data in snapshot.items():
        path = workdir / "mamba_edu" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if (REPO_DIR / "data").is_dir():
        shutil.copytree(REPO_DIR / "data", workdir / "data", symlinks=False)
    return workdir


# --- one judge --------------------------------------------------------------------------------

#: The judges running now (several with ``--jobs``) and the children this process had before
#: grading began: what :func:`run_judge` spares when it kills what a judge left behind.
_WORKERS: set[int] = set()
_WORKERS_LOCK = threading.Lock()


def _read_lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def _outcome(proc: subprocess.Popen, lines: queue.Queue, secret: str, timeout: int, limits: JudgeLimits) -> dict:
    """The judge's verdict, ``{"exercises": [[number, status, message], …]}`` or ``{"zero": reason}``,
    from the lines that carry ``secret``. A verdict counts only if the judge then ends by itself
    (a judge alone in its PID namespace survives the signals it sends its own group: its launcher
    does not)."""
    step = "its start"
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            return {"zero": f"{step} ran longer than the timeout ({timeout} s)"}
        report = json.loads(line[len(secret):]) if line and line.startswith(secret.encode()) else {}
        if line is None or proc.poll() not in (None, 0) or (report and "step" not in report and proc.wait(60)):
            return {"zero": f"the judge died while running {step} ({death_cause(proc.wait(), limits)})"}
        if report and "step" not in report:
            return report
        step = report.get("step", step)


def run_judge(path: Path, raw: bytes, timeout: int, sandbox: bool, package_root: Path,
              limits: JudgeLimits, seed: int) -> NotebookResult:
    """Grade one notebook (validated: ``raw``) in a judge of its own; never raises for what the
    notebook does."""
    secret = secrets.token_hex(16)
    workdir = Path(tempfile.mkdtemp(prefix="mamba_edu-grade-"))
    folder, private = throwaway_copy(path, raw, workdir), workdir / "private"
    private.mkdir()
    command = limits.launcher() + (bwrap_prefix(workdir, package_root) if sandbox else []) + [
        sys.executable, "-P", "-m", "mamba_edu.grading.judge"]
    orders = {"secret": secret, "notebook": path.stem, "cells": code_cells(raw), "memory": limits.memory_text(),
              "seed": str(seed)}
    with _WORKERS_LOCK:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env=judge_environment(package_root, private), cwd=folder, start_new_session=True)
        _WORKERS.add(proc.pid)
    lines = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(json.dumps(orders).encode() + b"\n")
            proc.stdin.close()
        outcome = _outcome(proc, lines, secret, timeout, limits)
    finally:  # the verdict counts once the judge and all it started are gone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()
        with _WORKERS_LOCK:
            _WORKERS.discard(proc.pid)
            kill_descendants(keep=frozenset(_WORKERS))
        shutil.rmtree(workdir, ignore_errors=True)
    if "zero" in outcome:
        return NotebookResult(path.name, "zero", str(outcome["zero"]))
    titles = {n: ex.title for n, ex in core.REGISTRY[path.stem].items()}
    return NotebookResult(path.name, "graded", exercises=[ExerciseResult(n, titles[n], status, message)
                                                          for n, status, message in outcome["exercises"]])


def fresh_seed() -> int:
    """A grading seed: fresh check inputs per run (record it to replay a grade exactly)."""
    return secrets.randbelow(2**31)


def grade_paths(paths: list[Path], timeout: int, sandbox: bool = False, report=None,
                started=None, limits: JudgeLimits = JudgeLimits(), seed: int | None = None) -> list[NotebookResult]:
    """Grade every notebook in ``paths`` (each already one with registered exercises), each judge
    under ``limits``, its checks drawing their inputs from ``seed`` (None: a fresh one per
    notebook); call ``started(path)`` before each and ``report(result)`` after each."""
    not_dumpable()      # no notebook writes into this process's output or reads its memory
    become_subreaper()  # what a judge leaves behind comes back here, to be killed
    with _WORKERS_LOCK:
        _WORKERS.update(children())  # the caller's own children are not the notebooks' to lose
    snapshot = _package_snapshot()
    results = []
    for path in paths:
        if started is not None:
            started(path)
        start, registered = time.perf_counter(), core.REGISTRY[path.stem]
        refusal, raw = _refusal(path)
        touched = []
        if refusal:
            result = NotebookResult(path.name, "refused", f"{path.name} {refusal}")
        else:
            installed = _package_snapshot()
            workdir = Path(tempfile.mkdtemp(prefix="mamba_edu-package-"))
            try:
                result = run_judge(path, raw, timeout, sandbox, private_package(snapshot, workdir), limits,
                                   fresh_seed() if seed is None else seed)
                touched = _changed(snapshot, workdir / "mamba_edu")
            except Exception as err:  # noqa: BLE001 - the grader's own trouble with this notebook
                result = NotebookResult(path.name, "zero", f"the grader could not grade it: {type(err).__name__}: {err}")
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            touched += [f"installed {n}" for n in _changed(installed, PACKAGE_DIR) if n.startswith(GUARDED)]
        if touched:
            result.status = "zero"
            result.reason = (f"the notebook changed the package ({', '.join(touched[:5])}); the "
                             "grader's private copy is thrown away")
        if result.status != "graded":
            result.exercises = [ExerciseResult(n, registered[n].title, core.FAIL, "not graded: " + result.reason)
                                for n in sorted(registered)]
        result.seconds = time.perf_counter() - start
        results.append(result)
        if report is not None:
            report(result)
    return results

