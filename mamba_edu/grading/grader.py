"""Grading submitted notebooks: one judge process per notebook, watched from outside it.

:func:`grade_paths` refuses what is not a notebook, copies the notebook's folder and the package
(as it was when the run began) to throwaway folders of this notebook's own, starts the judge
(:mod:`~mamba_edu.grading.judge`) there under the launcher of :mod:`~mamba_edu.grading.containment`
(or bubblewrap), gives it the seed once its cells ran, reads its bounded reports tagged with a
secret, and kills it and all it started before the verdict counts (``docs/teaching.md``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import mamba_edu
from mamba_edu.exercises import core
from mamba_edu.exercises.core import ExerciseResult, NotebookResult
from mamba_edu.grading.containment import (JudgeLimits, become_subreaper, children, death_cause,
                                           kill_descendants, landlock_abi, not_dumpable, read_regular)
from mamba_edu.grading.review import review_flags, summary
from mamba_edu.profiling.trace_files import TraceError

PACKAGE_DIR = Path(mamba_edu.__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
CONFINED = landlock_abi() > 0  # judges run confined by Landlock (containment.confine)
#: The only variables a judge inherits: what Python, torch and Triton need. No token, no seed.
JUDGE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "TRITON_INTERPRET",
             "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LD_LIBRARY_PATH")
#: What every confined judge may read besides its own folders and Python's.
SYSTEM_FOLDERS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/proc", "/sys",
                  "/dev")
MAX_LINE, MAX_LINES = 64 * 1024, 10_000  # the longest report line a judge may write, and the most


def _refusal(path: Path) -> tuple[str | None, bytes]:
    """Why ``path`` cannot be graded (or None), and its bytes, read once: what is validated is
    what the judge runs."""
    if path.is_symlink():
        return "is a symbolic link (submit the notebook itself)", b""
    try:
        raw = read_regular(path)
    except TraceError as err:  # refused at the open: a folder, a pipe, a device; or unreadable
        return (f"cannot be read ({err})" if "cannot be opened" in str(err) else "is not a regular file"), b""
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
    cells = json.loads(raw)["cells"]
    return ["".join(cell.get("source", "")) for cell in cells if cell.get("cell_type") == "code"]


def every_exercise(stem: str, status: str, message: str) -> list[ExerciseResult]:
    """Each exercise of notebook ``stem``, all with ``status`` and ``message``."""
    return [ExerciseResult(n, ex.title, status, message, points=ex.points)
            for n, ex in sorted(core.REGISTRY[stem].items())]


def handout_cells(stem: str, cells: list[str]) -> list[int]:
    """The numbers (from 1) of the ``cells`` that are code cells of the checkout's handout ``stem``
    (none without a handout: grading from a wheel)."""
    handout = REPO_DIR / "notebooks" / f"{stem}.ipynb"
    ours = set(code_cells(handout.read_bytes())) if handout.is_file() else set()
    return [i for i, cell in enumerate(cells, 1) if cell in ours]


def static_review(stem: str, cells: list[str], handout: list[int]) -> dict[int, list]:
    """The review scan's flags of the cells the learner wrote, by exercise: a cell that defines an
    exercise's function flags it, another cell the notebook (0)."""
    by_exercise = {}
    for flag in review_flags(cells):
        if flag.cell not in handout:
            defined = set(re.findall(r"^\s*def\s+(\w+)", cells[flag.cell - 1], re.MULTILINE))
            for number in [n for n, ex in core.REGISTRY[stem].items() if defined & set(ex.names)] or [0]:
                by_exercise.setdefault(number, []).append(flag)
    return by_exercise


# --- a judge's folders and environment --------------------------------------------------------

def throwaway_copy(notebook: Path, raw: bytes, workdir: Path) -> Path:
    """The notebook's folder copied to ``workdir/folder`` (regular files and folders, no other
    notebook), the notebook itself as ``raw``, the bytes that were validated."""
    def ignore(directory, names):
        return {name for name in names if name.endswith(".ipynb") or name in ("__pycache__", ".git", ".venv")
                or (p := Path(directory, name)).is_symlink() or not (p.is_file() or p.is_dir())}

    folder = workdir / "folder"
    shutil.copytree(notebook.parent, folder, ignore=ignore, symlinks=True)
    (folder / notebook.name).write_bytes(raw)
    return folder


def private_package(snapshot: dict[str, bytes], root: Path) -> Path:
    """A copy of the package (and of ``data/``, which it reads) under ``root`` for one judge,
    written from the snapshot taken when the run began."""
    for name, data in snapshot.items():
        (root / "mamba_edu" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "mamba_edu" / name).write_bytes(data)
    if (REPO_DIR / "data").is_dir():
        shutil.copytree(REPO_DIR / "data", root / "data", symlinks=False)
    return root


def judge_folders(workdir: Path, package_root: Path) -> tuple[list[str], list[str]]:
    """What a confined judge may read (the system, Python, its package copy) and write (its
    ``workdir``, a GPU's devices): not the checkout, ``/tmp`` or another student's folder."""
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parent)}
    devices = ["/dev/null", *map(str, Path("/dev").glob("nvidia*")), "/dev/shm"]
    return [*SYSTEM_FOLDERS, *sorted(python), str(package_root)], [str(workdir), *devices]


def bwrap_prefix(workdir: Path, package_root: Path) -> list[str]:
    """``--sandbox``: bubblewrap around the judge, everything read-only but ``workdir``; no
    network; a PID namespace of its own; the solutions hidden."""
    args = [shutil.which("bwrap"), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs",
            "/tmp", "--bind", str(workdir), str(workdir), "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--die-with-parent", "--new-session"]
    # read-only too, wherever they live (under /tmp, a clone or a venv): Python, the package
    for path in sorted({p.resolve() for p in (Path(sys.prefix), package_root, REPO_DIR, REPO_DIR / "data")}):
        args += ["--ro-bind", str(path), str(path)]
    if (REPO_DIR / "notebooks" / "solutions").is_dir():
        args += ["--tmpfs", str(REPO_DIR / "notebooks" / "solutions")]
    return args


def judge_environment(private: Path) -> dict:
    """The judge's environment: :data:`JUDGE_ENV` from this process's; caches and temp files in
    ``private``."""
    return {**{k: os.environ[k] for k in JUDGE_ENV if k in os.environ},
            "MPLBACKEND": "Agg", "TMPDIR": str(private), "HOME": str(private),
            "IPYTHONDIR": str(private / "ipython"), "MPLCONFIGDIR": str(private / "mpl"),
            "TRITON_CACHE_DIR": str(private / "triton")}


def judge_command(package_root: Path) -> list[str]:
    """An isolated Python (``-I``: no user site, no ``PYTHON*`` variables, not the current folder
    on the path; ``-B``: no bytecode written) that imports the package from ``package_root`` and
    runs the judge."""
    return [sys.executable, "-I", "-B", "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); from mamba_edu.grading.judge import main; main()",
            str(package_root)]


class Environment:
    """What one run's notebooks share: the package as it was when the run began and, where judges
    are not confined, the state of the folders through which a notebook could reach a later one
    (Python's site folders, the package, the checkout's notebooks). A change gives the notebook
    just judged 0, and no later notebook of the run is graded."""

    def __init__(self, confined: bool):
        import site

        self.package = {str(p.relative_to(PACKAGE_DIR)): p.read_bytes() for p in PACKAGE_DIR.rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts}
        folders = [*site.getsitepackages(), site.getusersitepackages(), PACKAGE_DIR, REPO_DIR / "notebooks"]
        self.folders = [] if confined else [Path(f) for f in folders if Path(f).is_dir()]
        self.state, self.broken, self.lock = self.now(), "", threading.Lock()

    def now(self) -> dict[str, tuple]:
        """Size, modification and change time (which no ordinary process can set back) of each
        file and link under the watched folders."""
        state = {}
        for folder in self.folders:
            for directory, names, files in os.walk(folder):
                for path in [os.path.join(directory, n) for n in files + names]:
                    with contextlib.suppress(OSError):
                        if not os.path.isdir(path) or os.path.islink(path):
                            st = os.lstat(path)
                            state[path] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return state

    def changed_by(self, name: str) -> str:
        """Why the notebook ``name``, just judged, gets 0 for changing the environment, or ``""``."""
        with self.lock:
            now, before = self.now(), self.state
            changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))
            self.state = now
            if changed and not self.broken:
                more = f" and {len(changed) - 1} more" if changed[1:] else ""
                self.broken = f"{name} changed {changed[0]}{more}"
                return f"the notebook changed the environment ({self.broken})"
        return ""


# --- one judge --------------------------------------------------------------------------------

#: The judges running now (several with ``--jobs``) and this process's children from before
#: grading: what is spared when what a judge left behind is killed.
_WORKERS: set[int] = set()
_WORKERS_LOCK = threading.Lock()


def _read_lines(stream, into: queue.Queue) -> None:
    """Pass on the judge's lines, then None at its end; a line longer than :data:`MAX_LINE` bytes,
    or one past :data:`MAX_LINES`, passes ``b""`` and stops the reading (the judge is then killed)."""
    for _ in range(MAX_LINES):
        line = stream.readline(MAX_LINE)
        if not line.endswith(b"\n"):  # the end, or a line cut at MAX_LINE
            into.put(b"" if line else None)
            return
        into.put(line)
    into.put(b"")


def _outcome(proc: subprocess.Popen, lines: queue.Queue, secret: str, timeout: int, limits: JudgeLimits,
             seed: int) -> dict:
    """The judge's verdict from its lines that carry ``secret``: ``{"exercises": [[number, status,
    message], …], "review": {exercise (0: the notebook): [flag, …]}}`` or ``{"zero": reason}``.
    The seed goes to the judge when it asks; a verdict counts only if the judge then ends by
    itself."""
    step, exercise, review, refused = "its start", 0, {}, None
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            return {"zero": f"{step} ran longer than the timeout ({timeout} s)"}
        if line == b"":
            return {"zero": f"the judge wrote more than the report allows while running {step}"}
        report = {}
        if line and line.startswith(secret.encode()):
            with contextlib.suppress(ValueError):
                report = json.loads(line[len(secret):])
        report = report if isinstance(report, dict) else {}
        final = report and not {"step", "review", "refused"} & set(report)
        if line is None or proc.poll() not in (None, 0) or (final and proc.wait(60)):
            return {"zero": f"the judge died while running {step} ({death_cause(proc.wait(), limits)})"}
        if final:
            return {"zero": f"the notebook {refused}"} if refused else {**report, "review": review}
        if report.get("step") == "seed":
            with contextlib.suppress(OSError):
                proc.stdin.write(f"{seed}\n".encode())
                proc.stdin.close()
        elif "step" in report:
            step = str(report["step"])[:200]
            exercise = int(step.rsplit(" ", 1)[-1]) if step.startswith("the check of exercise") else 0
        elif "review" in report:
            review.setdefault(exercise, []).append(str(report["review"])[:300])
        elif "refused" in report and refused is None:
            refused = str(report["refused"])[:300]


def run_judge(path: Path, raw: bytes, timeout: int, sandbox: bool, package: dict[str, bytes],
              limits: JudgeLimits, seed: int) -> NotebookResult:
    """Grade one notebook (validated: ``raw``) in a judge of its own, over a private copy of the
    ``package`` snapshot; never raises for what the notebook does."""
    cells = code_cells(raw)
    orders = {"secret": secrets.token_hex(16), "notebook": path.stem, "cells": cells,
              "memory": limits.memory_text(), "handout": handout_cells(path.stem, cells)}
    with tempfile.TemporaryDirectory(prefix="mamba_edu-grade-", ignore_cleanup_errors=True) as tmp:
        workdir, package_root = Path(tmp, "work"), private_package(package, Path(tmp, "package"))
        folder = throwaway_copy(path, raw, workdir)
        (workdir / "private").mkdir()
        # bubblewrap mounts, which Landlock forbids: with --sandbox it is the boundary instead
        confined = judge_folders(workdir, package_root) if CONFINED and not sandbox else ((), ())
        command = (limits.launcher(*confined) + (bwrap_prefix(workdir, package_root) if sandbox else [])
                   + judge_command(package_root))
        with _WORKERS_LOCK:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env=judge_environment(workdir / "private"),
                                    cwd=folder, start_new_session=True)
            _WORKERS.add(proc.pid)
        lines = queue.Queue()
        threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
        try:
            with contextlib.suppress(OSError):
                proc.stdin.write(json.dumps(orders).encode() + b"\n")
                proc.stdin.flush()
            outcome = _outcome(proc, lines, orders["secret"], timeout, limits, seed)
        finally:  # the verdict counts once the judge and all it started are gone
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            with contextlib.suppress(OSError):
                proc.stdin.close()
            with _WORKERS_LOCK:
                _WORKERS.discard(proc.pid)
                kill_descendants(keep=frozenset(_WORKERS))
    if "zero" in outcome:
        return NotebookResult(path.name, "zero", str(outcome["zero"]))
    seen, flags = outcome["review"], static_review(path.stem, cells, orders["handout"])

    def review(n: int) -> str:  # what the judge saw up to n's check, then the scan's flags of 0 and n
        scan = summary(flags.get(0, []) + flags.get(n, []))
        judge = [line for k in sorted(seen) if k <= n for line in seen[k]]  # a later verdict may be forged
        return "; ".join(judge + ([scan] if scan else []))
    registered = core.REGISTRY[path.stem]
    return NotebookResult(path.name, "graded", exercises=[
        ExerciseResult(n, registered[n].title, status, message, review(n), registered[n].points)
        for n, status, message in outcome["exercises"]])


def fresh_seed() -> int:
    """A grading seed: fresh check inputs per run (recorded, it replays a grade exactly)."""
    return secrets.randbelow(2**31)


def grade_paths(paths: list[Path], timeout: int, sandbox: bool = False, started=None,
                limits: JudgeLimits = JudgeLimits(), seed: int | None = None,
                environment: Environment | None = None) -> list[NotebookResult]:
    """Grade each notebook of ``paths`` (named like one with exercises) in a judge under ``limits``,
    its checks drawing from ``seed`` (None: a fresh one); ``started(path)`` before each. A run that
    calls this several times passes each call its one ``environment`` (None: one for this call)."""
    not_dumpable()      # no notebook writes into this process's output or reads its memory
    become_subreaper()  # what a judge leaves behind comes back here, to be killed
    with _WORKERS_LOCK:
        _WORKERS.update(children())  # the caller's own children are not the notebooks' to lose
    environment = environment or Environment(CONFINED and not sandbox)
    seed = fresh_seed() if seed is None else seed
    results = []
    for path in paths:
        if started is not None:
            started(path)
        start = time.perf_counter()
        refusal, raw = _refusal(path)
        if refusal:
            result = NotebookResult(path.name, "refused", f"{path.name} {refusal}")
        elif environment.broken:
            why = f"{environment.broken} earlier in this run; restore the environment, then grade again"
            result = NotebookResult(path.name, "zero", why)
        else:
            try:
                result = run_judge(path, raw, timeout, sandbox, environment.package, limits, seed)
            except Exception as err:  # noqa: BLE001 - the grader's own trouble with this notebook
                why = f"the grader could not grade it: {type(err).__name__}: {err}"
                result = NotebookResult(path.name, "zero", why)
            if why := environment.changed_by(f"{path.parent.name}/{path.name}"):
                result.status, result.reason = "zero", why
        if result.status != "graded":
            result.exercises = every_exercise(path.stem, core.FAIL, "not graded: " + result.reason)
        result.seconds = time.perf_counter() - start
        results.append(result)
    return results
