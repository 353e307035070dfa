"""Each notebook's judge runs under resource limits and in a PID namespace of its own (issue 42):
a notebook that allocates past its address space, spins past its CPU time or kills the processes
grading it costs that notebook alone, with a verdict that says what happened, and the notebooks
after it are still graded. Through the real ``python -m mamba_edu grade``."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # the notebook tests need it; a bare GPU machine lacks it

from mamba_edu.grading.containment import (CPU_EXCEEDED, GIB, JudgeLimits, death_cause, exit_status,
                                             gpu_visible, task_cap)

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "mamba_edu" / "grading" / "containment.py"

#: Kills every ancestor of the judge up to the grading command, the grading command first (found
#: through /proc, which shows the outer process tree even inside a PID namespace), then its parent
#: as the judge sees it.
KILL_ANCESTORS = """
import os, signal
def parent(pid):
    with open(f'/proc/{pid}/stat') as f:
        return int(f.read().rsplit(')', 1)[1].split()[1])
chain, pid = [], parent('self')
while pid > 1:
    chain.append(pid)
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
        if b'mamba_edu\\0grade' in f.read():
            break
    pid = parent(pid)
else:
    chain = []  # no grading command above: kill nothing
for pid in reversed(chain):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
os.kill(os.getppid(), signal.SIGKILL)
"""


def launch(*command: str, memory: int = 0, cpu: int = 60, tasks: int = 1024, user=None):
    """Run ``command`` under the launcher (as ``user``, via setpriv, when given)."""
    prefix = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups"] if user else []
    python = "/usr/bin/python3" if user else sys.executable
    return subprocess.run([*prefix, python, "-I", str(LAUNCHER), "--memory", str(memory), "--cpu", str(cpu),
                           "--tasks", str(tasks), "--", *command], capture_output=True, text=True, timeout=120)


def own_pid_namespace() -> bool:
    run = launch(sys.executable, "-c", "import os; print(os.getpid(), os.getppid())")
    return run.stdout.split() == ["1", "0"]


# --- the launcher alone -----------------------------------------------------------------------

def test_the_launcher_sets_the_limits_and_the_judge_cannot_raise_them():
    code = ("import resource as r\n"
            "for name in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_CORE'):\n"
            "    print(*r.getrlimit(getattr(r, name)))\n"
            "try:\n"
            "    r.setrlimit(r.RLIMIT_AS, (r.RLIM_INFINITY, r.RLIM_INFINITY))\n"
            "except ValueError:\n"
            "    print('refused')\n")
    run = launch(sys.executable, "-c", code, memory=3 * GIB, cpu=40)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:5] == [f"{3 * GIB} {3 * GIB}", "40 45", f"{2 * GIB} {2 * GIB}", "0 0",
                                           "refused"], run.stdout


def test_an_allocation_past_the_address_space_fails_and_one_below_it_does_not():
    code = ("try:\n    bytearray(3 * 2**30)\nexcept MemoryError:\n    print('refused')\n"
            "bytearray(2**30)\nprint('1 GiB allocated')\n")
    assert launch(sys.executable, "-c", code, memory=2 * GIB).stdout.split("\n")[:2] == ["refused", "1 GiB allocated"]
    assert launch(sys.executable, "-c", code, memory=0).stdout.split("\n")[:1] == ["1 GiB allocated"]


@pytest.mark.extra
@pytest.mark.parametrize("catch", [False, True])
def test_a_spinning_judge_is_stopped_by_its_cpu_time(catch):
    """SIGXCPU ends it; one that ignores SIGXCPU gets SIGKILL CPU_GRACE_S seconds later."""
    code = ("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n" if catch else "") + "while True: pass"
    run = launch(sys.executable, "-c", code, cpu=2)
    assert run.returncode == CPU_EXCEEDED, (run.returncode, run.stderr)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs root (to run the launcher as another user) and /usr/bin/python3")
def test_a_user_judge_gets_its_tasks_bounded():
    """RLIMIT_NPROC binds a user other than root (root ignores it): threads past the cap fail."""
    code = ("import threading, time\nn = 0\ntry:\n    for _ in range(64):\n"
            "        threading.Thread(target=time.sleep, args=(3,), daemon=True).start(); n += 1\n"
            "except RuntimeError:\n    pass\nprint(n)\n")
    workdir = Path("/tmp")
    shutil.copy(LAUNCHER, workdir / "mamba_edu_launcher_test.py")
    try:
        capped = _as_nobody(workdir / "mamba_edu_launcher_test.py", code, tasks=16)
        free = _as_nobody(workdir / "mamba_edu_launcher_test.py", code, tasks=100_000)
    finally:
        (workdir / "mamba_edu_launcher_test.py").unlink()
    assert int(capped) < 16 and int(free) == 64, (capped, free)


def _as_nobody(launcher: Path, code: str, tasks: int) -> str:
    run = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3",
                          "-I", str(launcher), "--memory", "0", "--cpu", "60", "--tasks", str(tasks), "--",
                          "/usr/bin/python3", "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_task_cap_counts_the_users_tasks_outside_a_user_namespace_of_its_own():
    assert task_cap(10, "user") == 10
    assert task_cap(10, "pid") > 10 and task_cap(10, None) > 10


def test_exit_statuses_say_what_ended_the_judge():
    limits = JudgeLimits(cpu_seconds=30)
    killed = 9  # a wait status: ended by SIGKILL
    assert exit_status(killed, cpu_used=31.0, cpu_seconds=30) == CPU_EXCEEDED
    assert exit_status(killed, cpu_used=2.0, cpu_seconds=30) == 128 + 9
    assert exit_status(3 << 8, cpu_used=31.0, cpu_seconds=30) == 3
    assert death_cause(CPU_EXCEEDED, limits) == "it used its 30 s of CPU time, the limit"
    assert death_cause(128 + 9, limits) == death_cause(-9, limits) == "killed by SIGKILL"
    assert death_cause(3, limits) == "exit status 3"


def test_no_address_space_cap_where_a_gpu_is_visible(monkeypatch):
    limits = JudgeLimits(memory=8 * GIB)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not gpu_visible() and limits.address_space() == 8 * GIB and "8 GiB" in limits.memory_text()
    monkeypatch.setattr(os.path, "exists", lambda path: path == "/dev/nvidiactl")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert gpu_visible() and limits.address_space() is None and "GPU is visible" in limits.memory_text()
    assert limits.launcher()[limits.launcher().index("--memory") + 1] == "0"


# --- through the grade command ----------------------------------------------------------------

def notebook(folder: Path, stem: str, *cells: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, folder / f"{stem}.ipynb")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One run: 00 allocates past its address space, 01 spins past its CPU time, 02 kills the
    processes grading it, 03 does nothing wrong (graded, its exercises not done)."""
    folder = tmp_path_factory.mktemp("limits")
    notebook(folder, "00_start_here", "import numpy", "big = numpy.empty(5 * 2**30, numpy.uint8)", "y = 2")
    notebook(folder, "01_gated_deltanet_recurrence", "x = 1", "while True:\n    pass")
    notebook(folder, "02_chunked_prefill", "x = 1", KILL_ANCESTORS)
    notebook(folder, "03_triton_kernels", "x = 1")
    run = subprocess.run([sys.executable, "-m", "mamba_edu", "grade", str(folder), "--json", "--timeout", "300",
                          "--max-memory", "4", "--max-cpu", "15"],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.stdout.strip().startswith("{"), run.stderr[-3000:]
    return {nb["file"][:2]: nb for nb in json.loads(run.stdout)["notebooks"]}


@pytest.mark.extra
def test_past_its_address_space_a_notebook_gets_zero_saying_so(graded):
    nb = graded["00"]
    assert nb["status"] == "zero", nb
    assert nb["reason"].startswith("code cell 2 ran out of memory (the notebook may use 4 GiB of address space)"), nb


@pytest.mark.extra
def test_past_its_cpu_time_a_notebook_gets_zero_saying_so(graded):
    nb = graded["01"]
    assert nb["status"] == "zero", nb
    assert nb["reason"] == "the judge died while running code cell 2 (it used its 15 s of CPU time, the limit)", nb


@pytest.mark.extra
@pytest.mark.skipif(not own_pid_namespace(), reason="no PID namespace can be had here (see docs/teaching.md)")
def test_a_notebook_that_kills_the_processes_grading_it_costs_itself_alone(graded):
    from mamba_edu.grading.containment import landlock_abi

    nb = graded["02"]
    if landlock_abi() >= 6:  # Landlock scopes signals: the kill is refused, the notebook graded
        assert nb["status"] == "graded" and {e["status"] for e in nb["exercises"]} == {"fail"}, nb
        return
    assert nb["status"] == "zero" and nb["reason"].startswith("the judge died"), nb
    assert "SIGKILL" in nb["reason"], nb


@pytest.mark.extra
def test_the_notebooks_after_them_are_still_graded(graded):
    nb = graded["03"]
    assert nb["status"] == "graded" and {e["status"] for e in nb["exercises"]} == {"fail"}, nb
    assert list(graded) == ["00", "01", "02", "03"]


def test_a_cell_that_fails_to_allocate_is_told_from_other_errors():
    import numpy

    from mamba_edu.grading.judge import out_of_memory
    try:
        numpy.empty(2**62, numpy.uint8)
    except MemoryError as err:  # numpy's _ArrayMemoryError
        assert out_of_memory(err)
    assert out_of_memory(MemoryError()) and out_of_memory(RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert not out_of_memory(ValueError("memory is a word")) and not out_of_memory(NameError("name 'MemoryError'"))
