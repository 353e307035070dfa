"""What a grading process does so that nothing a notebook starts outlives its grading.

* :func:`become_subreaper` — Linux's ``PR_SET_CHILD_SUBREAPER``: every orphan among this
  process's descendants is re-parented to it instead of to init, also one that left the process
  group with ``setsid`` or double-forked. So the descendants stay findable.
* :func:`kill_descendants` — kill every child, reap it, and repeat: the grandchildren of a killed
  child become children in turn, until none is left. Run before a verdict is written.
* :func:`not_dumpable` — ``PR_SET_DUMPABLE = 0``: another process of the same user can no longer
  open ``/proc/<pid>/fd/*`` (write into this process's stdout) or read its memory (the report's
  secret). Root still can.
* :func:`limit_resources` — no core files, a cap on the size of any file written.
* :func:`read_regular` — read a file a learner controls: opened without following a link and
  without blocking, refused unless it is a regular file, capped; read once, so what was checked
  is what is used.
* :class:`KernelLimits` and :func:`launch` — the learner's kernel starts under a small launcher
  (this file run as a script, standard library only) that puts it in a PID namespace of its own
  and sets its resource limits, then reports why it ended (:func:`death_cause`).

Each is a no-op where the system has no such call (not Linux): the container recipe in
``docs/teaching.md`` is then the boundary.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass

_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 4, 36
#: The largest file a grading process or its kernel may write (bytes).
MAX_FILE_BYTES = 2 * 2**30


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants (see the module docstring)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def not_dumpable() -> bool:
    """Close ``/proc/<pid>/fd`` and the memory of this process to its user's other processes."""
    return _prctl(_PR_SET_DUMPABLE, 0)


def lower_limit(limit: int, soft: int, hard: int | None = None) -> None:
    """Lower the resource limit ``limit`` to ``soft`` and its hard limit to ``hard`` (default
    ``soft``), so that the process cannot raise it again; never above the present hard limit."""
    hard = soft if hard is None else hard
    _, present = resource.getrlimit(limit)
    if present != resource.RLIM_INFINITY:
        soft, hard = min(soft, present), min(hard, present)
    resource.setrlimit(limit, (soft, hard))


def limit_resources() -> None:
    """No core files; no file larger than :data:`MAX_FILE_BYTES` (inherited by the kernel, which
    cannot raise either again)."""
    lower_limit(resource.RLIMIT_CORE, 0)
    lower_limit(resource.RLIMIT_FSIZE, MAX_FILE_BYTES)


def children(pid: int | None = None) -> list[int]:
    """The processes whose parent is ``pid`` (default: this one), from ``/proc``."""
    pid = os.getpid() if pid is None else pid
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after the last ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def kill_descendants(deadline_s: float = 10.0, keep=frozenset()) -> int:
    """SIGKILL and reap every descendant of this process but the children in ``keep`` and
    theirs (a subreaper adopts the orphans, so repeating on the children reaches them all).
    Returns how many were killed."""
    killed, end = 0, time.monotonic() + deadline_s
    while time.monotonic() < end:
        kids = [pid for pid in children() if pid not in keep]
        if not kids:
            break
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return killed


#: The largest notebook or kernel reply the grader reads (bytes).
MAX_READ_BYTES = 64 * 2**20


def read_regular(path, max_bytes: int = MAX_READ_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``. A symbolic link, a named
    pipe, a device or a folder is refused at the open (``ValueError``, one line), before a byte
    is read (:func:`mamba_edu.profiling.trace_files.open_regular`), so nothing can block the
    grader or swap the file after a check."""
    from mamba_edu.profiling.trace_files import open_regular

    with os.fdopen(open_regular(path, "a notebook or a reply", follow_links=False), "rb") as f:
        if os.fstat(f.fileno()).st_size > max_bytes:
            raise ValueError(f"{path} holds more than the {max_bytes} bytes read")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} grew past the {max_bytes} bytes read")
    return data


# --- the learner's kernel: a PID namespace of its own, resource limits ------------------------

GIB = 2**30
_CLONE_NEWUSER, _CLONE_NEWPID = 0x10000000, 0x20000000
_PR_SET_PDEATHSIG = 1
#: The seconds of CPU time between the kernel's SIGXCPU (which it may catch) and its SIGKILL.
CPU_GRACE_S = 5
#: The launcher's exit status for a kernel stopped by its CPU-time limit (128 + SIGXCPU).
CPU_EXCEEDED = 128 + signal.SIGXCPU


@dataclass(frozen=True)
class KernelLimits:
    """The resource limits of one notebook's kernel; each process it starts gets the same ones.

    Measured on this course's solutions (``python -m mamba_edu grade notebooks/solutions``, CPU
    only, ``TRITON_INTERPRET=1 OMP_NUM_THREADS=1``, every process of the run read from ``/proc``
    every 0.2 s: ``VmPeak``, ``VmHWM``, user + system time, ``Threads``): over the 11 kernels the
    largest address space was 2.72 GiB (2783 MiB), the largest resident set 552 MiB, the most CPU
    time 36.1 s, the most threads 17 (25 tasks in the whole run). The defaults leave room for a
    learner's larger tensors, a slower machine and torch's thread pool on many cores:

    * ``memory`` — bytes of address space (``RLIMIT_AS``): 8 GiB, 2.9× the peak. Not set where a
      GPU is visible (:func:`gpu_visible`): CUDA reserves address space far beyond the memory it
      uses, so there the machine's memory (or a container's) is the bound.
    * ``cpu_seconds`` — CPU time of the kernel, all its threads together, over the whole notebook
      (``RLIMIT_CPU``): 1800 s, 50× the peak. Past it the kernel gets SIGXCPU (ignored by the
      first process of a PID namespace), :data:`CPU_GRACE_S` s later SIGKILL. The per-cell
      ``--timeout`` bounds wall time.
    * ``tasks`` — processes and threads (``RLIMIT_NPROC``): 1024 more. Linux counts the tasks of
      the user in the kernel's user namespace: in one of its own (a user other than root) the
      kernel's alone, else every task of the user (:func:`task_cap`). Root ignores the limit: as
      root (a container, CI) there is no such bound.

    Files: at most :data:`MAX_FILE_BYTES` each, inherited from the worker.
    """

    memory: int = 8 * GIB
    cpu_seconds: int = 1800
    tasks: int = 1024

    def __post_init__(self):
        for name, least in (("memory", GIB), ("cpu_seconds", 1), ("tasks", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < least:
                raise ValueError(f"KernelLimits {name} must be a whole number of at least {least}, got {value!r}")

    def address_space(self) -> int | None:
        """The address-space cap in bytes, or None where none is set (a GPU is visible)."""
        return None if gpu_visible() else self.memory

    def memory_text(self) -> str:
        """The memory limit in words, for a verdict."""
        cap = self.address_space()
        if cap is None:
            return "no address-space limit is set where a GPU is visible"
        return f"the kernel may use {cap / GIB:g} GiB of address space"

    def launcher(self) -> list[str]:
        """The command that starts a kernel under these limits: prepend it to the kernel's."""
        return [sys.executable, "-I", os.path.abspath(__file__), "--memory", str(self.address_space() or 0),
                "--cpu", str(self.cpu_seconds), "--tasks", str(self.tasks), "--"]


def gpu_visible() -> bool:
    """Whether a CUDA device may be visible to a kernel started from this process."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/dxg")


def user_tasks(uid: int | None = None) -> int:
    """How many tasks (processes and threads) the user ``uid`` (default: this one) runs now."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                if int(fields["Uid"].split()[0]) == uid:
                    count += int(fields["Threads"])
            except (OSError, KeyError, ValueError):
                continue
    return count


def set_kernel_limits(memory: int, cpu_seconds: int, max_tasks: int) -> None:
    """Apply :class:`KernelLimits` to this process (``memory`` 0: no address-space cap;
    ``max_tasks``: the whole ``RLIMIT_NPROC``, see :func:`task_cap`)."""
    if memory:
        lower_limit(resource.RLIMIT_AS, memory)
    lower_limit(resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + CPU_GRACE_S)
    if os.geteuid() != 0:  # root ignores it
        lower_limit(resource.RLIMIT_NPROC, max_tasks)


def task_cap(tasks: int, namespace: str | None) -> int:
    """``RLIMIT_NPROC`` for ``tasks`` more tasks. Linux counts the user's tasks in the user
    namespace the kernel runs in: in one of its own (``namespace == "user"``) only the kernel's,
    else every task of the user, counted now (before a namespace that would hide them)."""
    return tasks if namespace == "user" else user_tasks() + tasks


def new_pid_namespace() -> str | None:
    """Start this process's next child in a PID namespace of its own, where no process outside
    has a PID: it cannot signal the worker or the grader. As root directly; else through a user
    namespace of its own that maps this user to itself. Returns ``"pid"``, ``"user"`` (a user
    namespace too) or None where neither is allowed (a container without the right, a
    distribution that forbids user namespaces)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWPID) == 0:
        return "pid"
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID) != 0:
        return None
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass  # unmapped, the kernel sees itself as nobody; the file permissions are still its user's
    return "user"


def _exec_kernel(command: list[str], memory: int, cpu_seconds: int, max_tasks: int) -> None:
    """In the launcher's child: die with the launcher, take the limits, become the kernel. Never
    returns. It stays in the launcher's process group: what Jupyter sends the group (interrupt,
    terminate, kill) reaches it, and a kernel that signals its group (``os.kill(0, …)``, or
    ``os.getppid()``, which is 0 in its own namespace) ends itself and its launcher alone."""
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        set_kernel_limits(memory, cpu_seconds, max_tasks)
        os.execvp(command[0], command)
    except BaseException as err:  # noqa: BLE001 - reported, then the child ends
        print(f"the kernel could not start: {err}", file=sys.stderr)
    os._exit(127)


def exit_status(status: int, cpu_used: float, cpu_seconds: int) -> int:
    """The launcher's exit status for its child's wait ``status``: :data:`CPU_EXCEEDED` when a
    signal ended it after its CPU-time limit, 128 + the signal for another signal, else its own."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGXCPU, signal.SIGKILL) and cpu_used >= cpu_seconds:
            return CPU_EXCEEDED
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


def death_cause(returncode: int | None, limits: KernelLimits) -> str:
    """Why a kernel started by :meth:`KernelLimits.launcher` ended, from the launcher's exit
    status (``None`` while it runs: an empty string)."""
    if returncode is None:
        return ""
    if returncode == CPU_EXCEEDED:
        return f"it used its {limits.cpu_seconds} s of CPU time, the kernel's limit"
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if sig:
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit status {returncode}"


def launch(argv: list[str]) -> int:
    """The launcher (``python -I containment.py --memory B --cpu S --tasks N -- KERNEL...``): a
    PID namespace for the kernel where one can be had, its limits, and its end reported as
    :func:`exit_status`. An interrupt is the kernel's (it reaches both through their group)."""
    split = argv.index("--")
    options = {name.lstrip("-"): int(value) for name, value in zip(argv[:split:2], argv[1:split:2])}
    namespace = new_pid_namespace()
    max_tasks = task_cap(options["tasks"], namespace) if os.geteuid() != 0 else 0  # root: no such limit
    child = os.fork()
    if child == 0:
        _exec_kernel(argv[split + 1:], options["memory"], options["cpu"], max_tasks)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _, status, usage = os.wait4(child, 0)
    return exit_status(status, usage.ru_utime + usage.ru_stime, options["cpu"])


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
