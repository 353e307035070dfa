"""Grading submitted notebooks: one judge process per notebook, watched from outside it.

For every notebook, :func:`grade_paths`

1. refuses what is not a notebook (a symbolic link, a folder, a file that is not a valid one),
2. copies the notebook's folder to a throwaway directory (regular files only: no symbolic links,
   no other notebooks, so no ``solutions/``) and the package to a private copy, written from the
   snapshot taken when grading began, that this notebook alone imports,
3. starts one judge there (:mod:`~mamba_edu.grading.judge`: it runs the notebook, then the
   checks) as an isolated Python, under the launcher of :mod:`~mamba_edu.grading.containment`
   (a PID namespace of its own where one can be had, resource limits and, where the kernel has
   Landlock, a file system it reads only where Python and the system live and writes only in
   its own folders), with ``--sandbox`` inside bubblewrap instead, with an allow-list of
   environment variables; the grading seed goes to the judge only after its cells ran,
4. reads the judge's reports (bounded), counting only the lines that start with the secret it
   gave the judge on stdin. A step (a cell, a check) that runs past ``timeout``, a judge that dies
   first (``os._exit``, a limit reached, a signal), or a write outside the notebook's folder gives
   the notebook 0 with the reason; grading goes on with the next notebook. Where judges are not
   confined, a change to Python's site folders or the package gives 0 and stops the run
   (:class:`Environment`),
5. kills the judge and everything it started before the verdict is reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
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
                                           landlock_abi, not_dumpable, read_regular)
from mamba_edu.grading.review import review_flags
from mamba_edu.profiling.trace_files import TraceError

PACKAGE_DIR = Path(mamba_edu.__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
#: Whether judges run confined by Landlock (:func:`~mamba_edu.grading.containment.confine`).
CONFINED = landlock_abi() > 0


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


def static_review(stem: str, cells: list[str], handout: list[int]) -> dict[int, list[str]]:
    """The static review's flags (:mod:`~mamba_edu.grading.review`) of the cells the learner
    wrote, by exercise: a cell that defines an exercise's function flags that exercise, another
    cell all of them (0)."""
    by_exercise = {}
    for flag in review_flags(cells):
        if flag.cell in handout:
            continue
        defined = set(re.findall(r"^\s*def\s+(\w+)", cells[flag.cell - 1], re.MULTILINE))
        owners = [n for n, ex in core.REGISTRY[stem].items() if defined & set(ex.names)] or [0]
        for number in owners:
            by_exercise.setdefault(number, []).append(f"cell {flag.cell} line {flag.line} {flag.reason}: {flag.text}")
    return by_exercise


def handout_cells(stem: str, cells: list[str]) -> list[int]:
    """The numbers (from 1) of the ``cells`` that are code cells of the handout ``stem`` as the
    checkout has it (none when the checkout has no handout: grading from a wheel)."""
    handout = REPO_DIR / "notebooks" / f"{stem}.ipynb"
    ours = set(code_cells(handout.read_bytes())) if handout.is_file() else set()
    return [i for i, cell in enumerate(cells, 1) if cell in ours]


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


def judge_environment(private: Path) -> dict:
    """The judge's environment: :data:`JUDGE_ENV` from this process's, the caches and temp files
    in ``private``."""
    return {**{k: os.environ[k] for k in JUDGE_ENV if k in os.environ},
            "MPLBACKEND": "Agg", "TMPDIR": str(private), "HOME": str(private),
            "IPYTHONDIR": str(private / "ipython"), "MPLCONFIGDIR": str(private / "mpl"),
            "TRITON_CACHE_DIR": str(private / "triton")}


# --- the package: a private copy per notebook; the environment, watched where not confined ------

def _package_snapshot(root: Path = PACKAGE_DIR) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


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


def watched_folders() -> list[Path]:
    """What a judge that is not confined could change to reach a later notebook: Python's site
    folders (a ``.pth`` runs in every later Python), the package, the checkout's notebooks."""
    import site

    folders = [*map(Path, site.getsitepackages()), Path(site.getusersitepackages()), PACKAGE_DIR,
               REPO_DIR / "notebooks"]
    return [f for f in folders if f.is_dir()]


def environment_state(folders: list[Path]) -> dict[str, tuple]:
    """Size, modification and change time of every file under ``folders`` (the change time moves
    with every write, and no process of an ordinary user can set it back)."""
    state = {}
    for folder in folders:
        for directory, names, files in os.walk(folder):
            for name in files + [n for n in names if Path(directory, n).is_symlink()]:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(directory, name))
                    state[os.path.join(directory, name)] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return state


class Environment:
    """What one grading run's notebooks share: the package as it was when the run began (each
    judge imports a private copy of it) and, where judges are not confined (no Landlock, or
    ``--sandbox``'s bubblewrap), the state of :func:`watched_folders` between notebooks: a change
    is the last notebook's, which then gets 0, and every later notebook of the run is not graded
    (the environment can no longer be trusted: restore it, then grade again)."""

    def __init__(self, confined: bool):
        self.package = _package_snapshot()
        self.folders = [] if confined else watched_folders()
        self.state, self.broken, self.lock = environment_state(self.folders), "", threading.Lock()

    def changed_by(self, name: str) -> str:
        """Why the notebook ``name``, just judged, gets 0 for the environment, or ``""``."""
        if not self.folders:
            return ""
        with self.lock:
            now = environment_state(self.folders)
            changed = sorted(k for k in set(now) | set(self.state) if now.get(k) != self.state.get(k))
            self.state = now
            if changed and not self.broken:
                self.broken = f"{name} changed {changed[0]}" + (f" and {len(changed) - 1} more" if changed[1:] else "")
                return f"the notebook changed the environment ({self.broken})"
        return ""


# --- one judge --------------------------------------------------------------------------------

#: The judges running now (several with ``--jobs``) and the children this process had before
#: grading began: what :func:`run_judge` spares when it kills what a judge left behind.
_WORKERS: set[int] = set()
_WORKERS_LOCK = threading.Lock()


#: The longest report line a judge may write, and the most lines it may write (bytes, lines).
MAX_LINE, MAX_LINES = 64 * 1024, 10_000


def _read_lines(stream, into: queue.Queue) -> None:
    """Pass on the judge's lines, each at most :data:`MAX_LINE` bytes: past it (or past
    :data:`MAX_LINES` lines) pass ``b""`` and stop reading (the judge is then killed)."""
    for _ in range(MAX_LINES):
        line = stream.readline(MAX_LINE)
        if not line:
            break
        if not line.endswith(b"\n"):
            into.put(b"")
            return
        into.put(line)
    else:
        into.put(b"")
        return
    into.put(None)


def _outcome(proc: subprocess.Popen, lines: queue.Queue, secret: str, timeout: int, limits: JudgeLimits,
             seed: int) -> dict:
    """The judge's verdict, ``{"exercises": [[number, status, message], …], "review": {…}}`` or
    ``{"zero": reason}``, from the lines that carry ``secret``; the seed goes to the judge when it
    asks, after the cells ran. ``review`` maps an exercise number (0: the whole notebook) to the
    flags raised while it was judged. A verdict counts only if the judge then ends by itself (a
    judge alone in its PID namespace survives the signals it sends its own group: its launcher
    does not)."""
    step, exercise, review, refused = "its start", 0, {}, None
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            return {"zero": f"{step} ran longer than the timeout ({timeout} s)"}
        if line == b"":
            return {"zero": f"the judge wrote more than the report allows while running {step}"}
        try:
            report = json.loads(line[len(secret):]) if line and line.startswith(secret.encode()) else {}
        except ValueError:
            report = {}
        if not isinstance(report, dict):
            report = {}
        final = report and not {"step", "review", "refused"} & set(report)
        if line is None or proc.poll() not in (None, 0) or (final and proc.wait(60)):
            return {"zero": f"the judge died while running {step} ({death_cause(proc.wait(), limits)})"}
        if final:
            return {"zero": f"the notebook {refused}"} if refused else {**report, "review": review}
        if report.get("step") == "seed":
            with contextlib.suppress(BrokenPipeError, OSError):
                proc.stdin.write(f"{seed}\n".encode())
                proc.stdin.close()
        elif "step" in report:
            step = str(report["step"])[:200]
            exercise = int(step.rsplit(" ", 1)[-1]) if step.startswith("the check of exercise") else 0
        elif "review" in report:
            review.setdefault(exercise, []).append(str(report["review"])[:300])
        elif "refused" in report and refused is None:
            refused = str(report["refused"])[:300]


def judge_command(package_root: Path) -> list[str]:
    """An isolated Python (``-I``: no user site, no ``PYTHON*`` variables, not the current folder
    first on the path; ``-B``: no bytecode written) that imports the package from ``package_root``
    and runs the judge."""
    return [sys.executable, "-I", "-B", "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); from mamba_edu.grading.judge import main; main()",
            str(package_root)]


#: What every judge may read besides its own folders: the system's and Python's.
SYSTEM_FOLDERS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/proc", "/sys", "/dev")


def judge_folders(workdir: Path, package_root: Path) -> tuple[list[str], list[str]]:
    """What a confined judge may read, and write: Python (its prefixes, with the libraries), the
    system's folders and its private package copy to read; its ``workdir`` and the devices a GPU
    needs to write. Not the checkout, the solutions, ``/tmp`` or any other student's folder."""
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    devices = ["/dev/null", *map(str, Path("/dev").glob("nvidia*")), "/dev/shm"]
    return [*SYSTEM_FOLDERS, *sorted(python), str(package_root)], [str(workdir), *devices]


def run_judge(path: Path, raw: bytes, timeout: int, sandbox: bool, package_root: Path,
              limits: JudgeLimits, seed: int) -> NotebookResult:
    """Grade one notebook (validated: ``raw``) in a judge of its own; never raises for what the
    notebook does."""
    secret = secrets.token_hex(16)
    workdir = Path(tempfile.mkdtemp(prefix="mamba_edu-grade-"))
    folder, private = throwaway_copy(path, raw, workdir), workdir / "private"
    private.mkdir()
    # bubblewrap mounts, which Landlock forbids: with --sandbox it is the boundary instead
    confined = judge_folders(workdir, package_root) if CONFINED and not sandbox else ((), ())
    command = (limits.launcher(*confined) + (bwrap_prefix(workdir, package_root) if sandbox else [])
               + judge_command(package_root))
    cells = code_cells(raw)
    orders = {"secret": secret, "notebook": path.stem, "cells": cells, "memory": limits.memory_text(),
              "handout": handout_cells(path.stem, cells)}
    with _WORKERS_LOCK:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env=judge_environment(private), cwd=folder, start_new_session=True)
        _WORKERS.add(proc.pid)
    lines = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(json.dumps(orders).encode() + b"\n")
            proc.stdin.flush()
        outcome = _outcome(proc, lines, secret, timeout, limits, seed)
    finally:  # the verdict counts once the judge and all it started are gone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with _WORKERS_LOCK:
            _WORKERS.discard(proc.pid)
            kill_descendants(keep=frozenset(_WORKERS))
        shutil.rmtree(workdir, ignore_errors=True)
    if "zero" in outcome:
        return NotebookResult(path.name, "zero", str(outcome["zero"]))
    registered, review = core.REGISTRY[path.stem], outcome["review"]
    for number, flags in static_review(path.stem, cells, orders["handout"]).items():
        review.setdefault(number, []).extend(flags)
    return NotebookResult(path.name, "graded", exercises=[
        ExerciseResult(n, registered[n].title, status, message, "; ".join(review.get(0, []) + review.get(n, [])),
                       registered[n].points)
        for n, status, message in outcome["exercises"]])


def fresh_seed() -> int:
    """A grading seed: fresh check inputs per run (record it to replay a grade exactly)."""
    return secrets.randbelow(2**31)


def grade_paths(paths: list[Path], timeout: int, sandbox: bool = False, report=None,
                started=None, limits: JudgeLimits = JudgeLimits(), seed: int | None = None,
                environment: Environment | None = None) -> list[NotebookResult]:
    """Grade every notebook in ``paths`` (each already one with registered exercises), each judge
    under ``limits``, its checks drawing their inputs from ``seed`` (None: a fresh one per
    notebook); call ``started(path)`` before each and ``report(result)`` after each. A run that
    calls this several times passes them all one ``environment`` (None: one for this call)."""
    not_dumpable()      # no notebook writes into this process's output or reads its memory
    become_subreaper()  # what a judge leaves behind comes back here, to be killed
    with _WORKERS_LOCK:
        _WORKERS.update(children())  # the caller's own children are not the notebooks' to lose
    environment = environment or Environment(CONFINED and not sandbox)
    results = []
    for path in paths:
        if started is not None:
            started(path)
        start, registered = time.perf_counter(), core.REGISTRY[path.stem]
        refusal, raw = _refusal(path)
        if refusal:
            result = NotebookResult(path.name, "refused", f"{path.name} {refusal}")
        elif environment.broken:
            result = NotebookResult(path.name, "zero", f"{environment.broken} earlier in this run; restore the "
                                                       "environment, then grade again")
        else:
            workdir = Path(tempfile.mkdtemp(prefix="mamba_edu-package-"))
            try:
                result = run_judge(path, raw, timeout, sandbox, private_package(environment.package, workdir), limits,
                                   fresh_seed() if seed is None else seed)
            except Exception as err:  # noqa: BLE001 - the grader's own trouble with this notebook
                result = NotebookResult(path.name, "zero", f"the grader could not grade it: {type(err).__name__}: {err}")
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            if why := environment.changed_by(f"{path.parent.name}/{path.name}"):
                result.status, result.reason = "zero", why
        if result.status != "graded":
            result.exercises = [ExerciseResult(n, registered[n].title, core.FAIL, "not graded: " + result.reason,
                                               points=registered[n].points) for n in sorted(registered)]
        result.seconds = time.perf_counter() - start
        results.append(result)
        if report is not None:
            report(result)
    return results
