"""Grading submitted notebooks: each in its own kernel, judged from outside it.

For every notebook, :func:`grade_paths` starts a worker process (``python -m
mamba_edu.exercises.grader --worker``) that

1. copies the notebook's folder to a throwaway directory (regular files only: no symbolic links,
   no other notebooks, so no ``solutions/``),
2. starts a Jupyter kernel there under a launcher (:mod:`~mamba_edu.exercises.containment`): in a
   PID namespace of its own where one can be had (it can signal no process outside: not the
   worker, not this process), with resource limits (:class:`~mamba_edu.exercises.containment.
   KernelLimits`: address space, CPU time, tasks, file size); its stdout and stderr go nowhere;
   with ``--sandbox``, inside bubblewrap too: the file system read-only but for that copy, no
   network, its own temp dir, the repository's ``notebooks/solutions`` hidden,
3. runs the notebook's code cells (a failing cell does not stop it),
4. calls each exercise's check **in the worker**, with proxies of the learner's functions
   (:mod:`mamba_edu.exercises.remote`): inputs go to the kernel, only plain tensors and numbers
   come back, references and verdicts are computed in the worker.

The worker reports to this process on a pipe, each report tagged with a secret this process gave
it on stdin, so a line the notebook writes cannot pass for one. The worker and its kernel import a
private copy of the package written for that notebook alone, so a notebook that edits "the
package" edits a copy the next notebook never sees (the installed package is never written to; a
change to its checks or sniffer while a notebook runs gives that notebook 0). A dead kernel, a
timeout, a limit reached (memory, CPU time), a ``BaseException`` (``os._exit``, ``exit()``,
``KeyboardInterrupt``) or a killed worker gives that notebook 0 with the reason, and grading goes on
with the next one.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mamba_edu
from mamba_edu.exercises.containment import (KernelLimits, become_subreaper, children, death_cause, kill_descendants,
                                             limit_resources, not_dumpable, read_regular)
from mamba_edu.profiling.trace_files import TraceError

PACKAGE_DIR = Path(mamba_edu.__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent


@dataclass
class ExerciseResult:
    number: int
    title: str
    status: str  # pass, fail, not done
    message: str = ""


@dataclass
class NotebookResult:
    """One notebook's grade. ``status``: ``graded``, ``zero`` (it ran, but something stopped
    grading it: the reason says what) or ``refused`` (not run: a symbolic link, not a file, not
    JSON); :mod:`~mamba_edu.exercises.classroom` adds ``missing`` (not submitted) and
    ``misnamed`` (a notebook whose name is not the course's: not run, no exercises)."""

    file: str
    status: str
    reason: str = ""
    exercises: list[ExerciseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return sum(e.status == "pass" for e in self.exercises) if self.status == "graded" else 0

    @property
    def total(self) -> int:
        return len(self.exercises)


# --- what may be graded -----------------------------------------------------------------------

def _refusal(path: Path) -> tuple[str | None, bytes]:
    """Why ``path`` cannot be graded (or None), and its bytes: read once, so that what is
    validated here is what the worker grades (no swap after the check)."""
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


def notebooks_in(path: Path) -> list[Path]:
    """``path`` itself if it names a notebook, else the entries directly inside it whose names end
    in ``.ipynb`` (files or not), sorted."""
    if path.suffix == ".ipynb" and (path.is_symlink() or not path.is_dir()):
        return [path]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith(".ipynb"))
    return []


def code_cells(raw: bytes) -> list[str]:
    """The sources of a notebook's code cells, from its validated bytes."""
    data = json.loads(raw)
    cells = []
    for cell in data["cells"]:
        if cell.get("cell_type") == "code":
            source = cell.get("source", "")
            cells.append("".join(source) if isinstance(source, list) else str(source))
    return cells


# --- the throwaway copy and the sandbox -------------------------------------------------------

def throwaway_copy(notebook: Path, raw: bytes, workdir: Path) -> Path:
    """The notebook's folder copied under ``workdir``: regular files and folders only, no other
    notebook; the notebook itself as ``raw``, the bytes that were validated."""
    folder = workdir / "folder"

    def ignore(directory, names):
        skip = set()
        for name in names:
            p = Path(directory) / name
            if p.is_symlink() or not (p.is_file() or p.is_dir()) or name.endswith(".ipynb") \
                    or name in ("__pycache__", ".git", ".venv", ".ipynb_checkpoints"):
                skip.add(name)
        return skip

    shutil.copytree(notebook.parent, folder, ignore=ignore, symlinks=True)
    (folder / notebook.name).write_bytes(raw)
    return folder


def bwrap_prefix(folder: Path, channel: Path, private: Path, hide: list[str] = ()) -> list[str]:
    """bubblewrap around the kernel: everything read-only but the copy, the channel and a private
    temp dir; no network; its own PID namespace; the solutions hidden."""
    bwrap = shutil.which("bwrap")
    args = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--bind", str(private), str(private), "--bind", str(folder), str(folder),
            "--bind", str(channel), str(channel),
            "--ro-bind", str(REPO_DIR), str(REPO_DIR),  # the grader's own package, also under /tmp
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session",
            "--unsetenv", "JPY_PARENT_PID"]  # its parent is the namespace's init: no parent polling
    # Read-only too, wherever they live (a clone or a venv under /tmp): the kernel's Python and
    # the recorded data the private package copy links to.
    for path in (Path(sys.prefix), (REPO_DIR / "data").resolve()):
        if path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for path in [REPO_DIR / "notebooks" / "solutions", *map(Path, hide)]:
        if path.is_dir():
            args += ["--tmpfs", str(path)]
    return args


# --- the worker (runs in its own process) -----------------------------------------------------

def grade_one(notebook: Path, raw: bytes, timeout: int, sandbox: bool, hide: list[str] = (),
              limits: KernelLimits = KernelLimits()) -> NotebookResult:
    """Run and grade one notebook (already validated), its kernel under ``limits``. Never raises
    for what the notebook does."""
    from mamba_edu.exercises import core
    from mamba_edu.exercises.core import KernelDied
    from mamba_edu.exercises.remote import KernelSession

    start = time.perf_counter()
    registered = core.REGISTRY[notebook.stem]
    cells = code_cells(raw)
    result = NotebookResult(notebook.name, "graded")
    workdir = Path(tempfile.mkdtemp(prefix="mamba_edu-grade-"))
    session = None
    try:
        folder = throwaway_copy(notebook, raw, workdir)
        channel, private = workdir / "channel", workdir / "private"
        channel.mkdir()
        private.mkdir()
        os.environ.update(IPYTHONDIR=str(private / "ipython"), MPLCONFIGDIR=str(private / "mpl"),
                          TRITON_CACHE_DIR=str(private / "triton"), JUPYTER_RUNTIME_DIR=str(private / "rt"),
                          TMPDIR=str(private))
        prefix = bwrap_prefix(folder, channel, private, hide) if sandbox else None
        session = KernelSession(folder, timeout, prefix, channel, limits)
        errors = session.run_notebook(cells)
        for number in sorted(registered):
            ex = registered[number]
            proxies, missing = [], []
            for name in ex.names:
                proxy = session.function(name, ex.forbidden, cells)
                (missing.append(name) if proxy is None else proxies.append(proxy))
            if missing:
                why = f"{', '.join(missing)} is not defined (did its cell run?)"
                if errors:
                    why += f"; {errors[0]}"
                result.exercises.append(ExerciseResult(number, ex.title, core.FAIL, why))
                continue
            verdict = core.judge(ex, *proxies)
            result.exercises.append(ExerciseResult(number, ex.title, verdict.status, verdict.message))
    except KernelDied as err:
        result.status, result.reason = "zero", str(err)
    except Exception as err:  # noqa: BLE001 - the grader's own trouble with this notebook
        result.status, result.reason = "zero", f"the grader could not grade it: {type(err).__name__}: {err}"
    finally:
        if session is not None:
            session.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    if result.status != "graded":
        result.exercises = [ExerciseResult(n, registered[n].title, core.FAIL, "not graded: " + result.reason)
                            for n in sorted(registered)]
    result.seconds = time.perf_counter() - start
    return result


def _worker_main(argv) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", type=Path, required=True)
    parser.add_argument("--timeout", type=int, required=True)
    parser.add_argument("--sandbox", action="store_true")
    parser.add_argument("--hide", action="append", default=[])
    parser.add_argument("--memory", type=int, required=True)
    parser.add_argument("--cpu", type=int, required=True)
    args = parser.parse_args(argv)
    not_dumpable()      # before the secret arrives: no other process reads it from this one
    become_subreaper()  # whatever the kernel starts, setsid or not, stays this process's to kill
    limit_resources()
    secret = sys.stdin.buffer.readline().decode().strip()
    raw = sys.stdin.buffer.read()  # the notebook as the grader validated it (never re-read)
    sys.stdin.close()
    out = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nothing else this process prints reaches the reporting pipe
    limits = KernelLimits(memory=args.memory, cpu_seconds=args.cpu)
    result = grade_one(args.worker, raw, args.timeout, args.sandbox, args.hide, limits)
    kill_descendants()  # the verdict is written once nothing the notebook started is alive
    out.write(secret + json.dumps(asdict(result)) + "\n")
    out.flush()
    return 0


# --- the grading process ----------------------------------------------------------------------

#: The modules a verdict depends on: a change to them in the installed package gives 0.
GUARDED = ("exercises", "profiling/syncs.py", "probes.py")


def _package_snapshot(root: Path = PACKAGE_DIR) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _changed(snapshot: dict[str, bytes], root: Path, only=None) -> list[str]:
    now = _package_snapshot(root) if root.is_dir() else {}
    names = sorted(set(snapshot) | set(now))
    if only:
        names = [n for n in names if n.startswith(only)]
    return [n for n in names if snapshot.get(n) != now.get(n)]


def private_package(snapshot: dict[str, bytes], workdir: Path) -> Path:
    """A private copy of the package for one notebook's worker and kernel, written from the
    snapshot taken when grading began: a notebook that edits "the package" edits this copy, which
    the next notebook never sees; the installed package is never written to."""
    for name, data in snapshot.items():
        path = workdir / "mamba_edu" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if (REPO_DIR / "data").is_dir():  # data_dir(): the recorded results; a copy, no path back
        shutil.copytree(REPO_DIR / "data", workdir / "data", symlinks=False)
    return workdir


#: The grading workers running now (several with ``--jobs``) and the children this process had
#: before grading began: what :func:`_run_worker` spares when it kills the processes this one
#: adopted from a worker that died.
_WORKERS: set[int] = set()
_WORKERS_LOCK = threading.Lock()


def _run_worker(path: Path, raw: bytes, timeout: int, sandbox: bool, package_root: Path,
                limits: KernelLimits) -> NotebookResult:
    try:
        return _worker_result(path, raw, timeout, sandbox, package_root, limits)
    finally:  # a worker killed from its kernel leaves its kernel's processes to us (a subreaper)
        with _WORKERS_LOCK:
            kill_descendants(keep=frozenset(_WORKERS))


def _worker_result(path: Path, raw: bytes, timeout: int, sandbox: bool, package_root: Path,
                   limits: KernelLimits) -> NotebookResult:
    secret = secrets.token_hex(16)
    cmd = [sys.executable, "-m", "mamba_edu.exercises.grader", "--worker", str(path.resolve()),
           "--timeout", str(timeout), "--hide", str(REPO_DIR / "notebooks" / "solutions"),
           "--memory", str(limits.memory), "--cpu", str(limits.cpu_seconds)] + (["--sandbox"] if sandbox else [])
    from mamba_edu.exercises.core import SEED_VARIABLE
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           # fresh check inputs per run; an instructor who exports it reproduces one run exactly
           SEED_VARIABLE: os.environ.get(SEED_VARIABLE) or str(secrets.randbelow(2**31))}
    budget = timeout * (len(code_cells(raw)) + 100) + 300
    with _WORKERS_LOCK:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True, cwd=package_root)
        _WORKERS.add(proc.pid)
    try:
        out, err = proc.communicate(secret.encode() + b"\n" + raw, timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        return NotebookResult(path.name, "zero", f"grading took longer than {budget} s")
    finally:
        try:
            os.killpg(proc.pid, 9)  # the worker's kernel and anything it left behind
        except ProcessLookupError:
            pass
        proc.wait()
        with _WORKERS_LOCK:
            _WORKERS.discard(proc.pid)
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    for line in out.splitlines():
        if line.startswith(secret):
            data = json.loads(line[len(secret):])
            data["exercises"] = [ExerciseResult(**e) for e in data["exercises"]]
            return NotebookResult(**data)
    tail = (err or "").strip().splitlines()[-1:]
    why = death_cause(proc.returncode, limits) + (f": {tail[0][:200]}" if tail else "")
    return NotebookResult(path.name, "zero", f"the worker process grading it died ({why})")


def grade_paths(paths: list[Path], timeout: int, sandbox: bool = False, report=None,
                started=None, limits: KernelLimits = KernelLimits()) -> list[NotebookResult]:
    """Grade every notebook in ``paths`` (each already one with registered exercises), each kernel
    under ``limits``; call ``started(path)`` before each and ``report(result)`` after each."""
    from mamba_edu.exercises import core

    not_dumpable()      # no notebook writes into this process's output or reads its memory
    become_subreaper()  # the processes of a worker that was killed come back here, to be killed
    with _WORKERS_LOCK:
        _WORKERS.update(children())  # the caller's own children are not the notebooks' to lose
    snapshot = _package_snapshot()
    results = []
    for path in paths:
        if started is not None:
            started(path)
        registered = core.REGISTRY[path.stem]
        refusal, raw = _refusal(path)
        touched = []
        if refusal:
            result = NotebookResult(path.name, "refused", f"{path.name} {refusal}")
        else:
            installed = _package_snapshot()
            workdir = Path(tempfile.mkdtemp(prefix="mamba_edu-package-"))
            try:
                root = private_package(snapshot, workdir)
                result = _run_worker(path, raw, timeout, sandbox, root, limits)
                touched = _changed(snapshot, root / "mamba_edu")
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            touched += [f"installed {n}" for n in _changed(installed, PACKAGE_DIR)
                        if n.startswith(GUARDED)]
        if touched:
            result.status = "zero"
            result.reason = (f"the notebook changed the package ({', '.join(touched[:5])}); the "
                             "grader's private copy is thrown away")
        if result.status != "graded":
            result.exercises = [ExerciseResult(n, registered[n].title, core.FAIL, "not graded: " + result.reason)
                                for n in sorted(registered)]
        results.append(result)
        if report is not None:
            report(result)
    return results


def execute_and_grade(path: Path, timeout: int) -> list[tuple[int, str, str, str]]:
    """Grade one notebook: ``[(number, title, status, message), …]`` (see :func:`grade_paths`)."""
    result = grade_paths([path], timeout)[0]
    return [(e.number, e.title, e.status, e.message) for e in result.exercises]


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
