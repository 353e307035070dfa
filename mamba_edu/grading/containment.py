"""What keeps one notebook's judge from outliving its grading or reaching beyond it (Linux).

The grader is a child subreaper (:func:`become_subreaper`: the orphans of its descendants come
back to it, also after ``setsid``) so that :func:`kill_descendants` reaches them all, and not
dumpable (:func:`not_dumpable`: another process of its user cannot write into its output or read
its memory). Each judge starts under :func:`launch`, a small launcher (this file run as a script)
that gives it a PID namespace of its own where one can be had and :class:`JudgeLimits`, then
reports why it ended (:func:`death_cause`). Each is a no-op where the system has no such call (not
Linux): the container recipe in ``docs/teaching.md`` is then the boundary.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass

GIB = 2**30
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 1, 4, 36
_CLONE_NEWUSER, _CLONE_NEWPID = 0x10000000, 0x20000000
_PR_SET_NO_NEW_PRIVS = 38
#: The largest file a judge may write, and the largest notebook the grader reads (bytes).
MAX_FILE_BYTES, MAX_READ_BYTES = 2 * GIB, 64 * 2**20
#: The seconds of CPU time between the judge's SIGXCPU (which it may catch) and its SIGKILL.
CPU_GRACE_S = 5
#: The launcher's exit status for a judge stopped by its CPU-time limit (128 + SIGXCPU).
CPU_EXCEEDED = 128 + signal.SIGXCPU


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def not_dumpable() -> bool:
    """Close ``/proc/<pid>/fd`` and the memory of this process to its user's other processes."""
    return _prctl(_PR_SET_DUMPABLE, 0)


def children(pid: int | None = None) -> list[int]:
    """The processes whose parent is ``pid`` (default: this one), from ``/proc``."""
    pid, found = os.getpid() if pid is None else pid, []
    for entry in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
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
    while time.monotonic() < end and (kids := [pid for pid in children() if pid not in keep]):
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


def read_regular(path, max_bytes: int = MAX_READ_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (else ``ValueError``), read
    once. A link, a pipe, a device or a folder is refused at the open, before a byte is read."""
    from mamba_edu.profiling.trace_files import open_regular

    with os.fdopen(open_regular(path, "a notebook", follow_links=False), "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} holds more than the {max_bytes} bytes read")
    return data


# --- Landlock: the folders a judge may read and write ----------------------------------------

_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446  # the same on every arch
_RULE_PATH_BENEATH = 1
#: Landlock's file-system rights, by the ABI version that added them.
_FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_READ = 0b1101            # execute, read a file, read a folder
_FILE_ONLY = 0b110 | 1 << 14 | 1 << 15  # the rights a rule on a file (not a folder) may carry
_TCP = 0b11               # bind, connect (ABI 4)
_SCOPES = 0b11            # abstract unix sockets, signals (ABI 6)


def _landlock(call: int, *args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(call, *args)
    if result < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where it has none (not Linux, too old, disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return _landlock(_LANDLOCK_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0


def confine(readable, writable) -> None:
    """Confine this process and all it will start: read (and run) only under ``readable``, read
    and write only under ``writable``; no ptrace or ``/proc/<pid>/mem`` of a process outside, no
    TCP, no signal to a process outside (from ABI 6). Raises ``OSError`` where Landlock fails:
    a judge is never started unconfined when confinement was asked for."""
    abi = landlock_abi()
    if abi == 0:
        raise OSError("this kernel has no Landlock")
    fs = _FS_RIGHTS[max(v for v in _FS_RIGHTS if v <= abi)]
    attr = (ctypes.c_uint64 * 3)(fs, _TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 8 * (3 if abi >= 6 else 2 if abi >= 4 else 1)
    ruleset = _landlock(_LANDLOCK_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for paths, rights in ((readable, _READ), (writable, fs)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # a folder this system does not have
                try:
                    allowed = rights if os.path.isdir(path) else rights & _FILE_ONLY
                    rule = ctypes.create_string_buffer(allowed.to_bytes(8, "little") + fd.to_bytes(4, "little"))
                    _landlock(_LANDLOCK_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, ctypes.c_uint32(0))
                finally:
                    os.close(fd)
        if not _prctl(_PR_SET_NO_NEW_PRIVS, 1):
            raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")
        _landlock(_LANDLOCK_RESTRICT, ruleset, ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


# --- the judge's launcher: a PID namespace of its own, resource limits ------------------------

@dataclass(frozen=True)
class JudgeLimits:
    """The resource limits of one notebook's judge; each process it starts gets the same ones.

    * ``memory`` — bytes of address space (``RLIMIT_AS``). Not set where a GPU is visible
      (:func:`gpu_visible`): CUDA reserves address space far beyond the memory it uses.
    * ``cpu_seconds`` — CPU time of the judge, all its threads together (``RLIMIT_CPU``): past it
      SIGXCPU, :data:`CPU_GRACE_S` s later SIGKILL. The grader's ``--timeout`` bounds wall time.
    * ``tasks`` — more processes and threads (``RLIMIT_NPROC``, see :func:`task_cap`); root
      ignores it.

    Files: at most :data:`MAX_FILE_BYTES` each, no core files. ``docs/teaching.md`` gives the
    measurements the defaults come from.
    """

    memory: int = 8 * GIB
    cpu_seconds: int = 1800
    tasks: int = 1024

    def __post_init__(self):
        for name, least in (("memory", GIB), ("cpu_seconds", 1), ("tasks", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < least:
                raise ValueError(f"JudgeLimits {name} must be a whole number of at least {least}, got {value!r}")

    def address_space(self) -> int | None:
        """The address-space cap in bytes, or None where none is set (a GPU is visible)."""
        return None if gpu_visible() else self.memory

    def memory_text(self) -> str:
        """The memory limit in words, for a verdict."""
        cap = self.address_space()
        if cap is None:
            return "no address-space limit is set where a GPU is visible"
        return f"the notebook may use {cap / GIB:g} GiB of address space"

    def launcher(self, readable=(), writable=()) -> list[str]:
        """The command that starts a judge under these limits: prepend it to the judge's. With
        ``readable`` or ``writable`` folders, the judge is confined to them (:func:`confine`)."""
        folders = [arg for path in readable for arg in ("--read", str(path))]
        folders += [arg for path in writable for arg in ("--write", str(path))]
        return [sys.executable, "-I", os.path.abspath(__file__), "--memory", str(self.address_space() or 0),
                "--cpu", str(self.cpu_seconds), "--tasks", str(self.tasks), *folders, "--"]


def gpu_visible() -> bool:
    """Whether a CUDA device may be visible to a judge started from this process."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/dxg")


def _lower_limit(limit: int, soft: int, hard: int | None = None) -> None:
    """Lower ``limit`` to ``soft`` and its hard limit to ``hard`` (default ``soft``), so that the
    process cannot raise it again; never above the present hard limit."""
    hard = soft if hard is None else hard
    _, present = resource.getrlimit(limit)
    if present != resource.RLIM_INFINITY:
        soft, hard = min(soft, present), min(hard, present)
    resource.setrlimit(limit, (soft, hard))


def task_cap(tasks: int, namespace: str | None) -> int:
    """``RLIMIT_NPROC`` for ``tasks`` more tasks. Linux counts the tasks of the user of the user
    namespace the judge runs in: in one of its own (``"user"``) the judge's alone, else every task
    of the user, counted now from ``/proc``."""
    if namespace == "user":
        return tasks
    count = 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            count += int(fields["Threads"]) if int(fields["Uid"].split()[0]) == os.getuid() else 0
        except (OSError, KeyError, ValueError):
            continue
    return count + tasks


def new_pid_namespace() -> str | None:
    """Start this process's next child in a PID namespace of its own, where no process outside
    has a PID: it cannot signal the grader. As root directly; else through a user namespace that
    maps this user to itself. Returns ``"pid"``, ``"user"`` or None where neither is allowed."""
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
        pass  # unmapped, the judge sees itself as nobody; the file permissions are still its user's
    return "user"


def exit_status(status: int, cpu_used: float, cpu_seconds: int) -> int:
    """The launcher's exit status for its child's wait ``status``: :data:`CPU_EXCEEDED` when a
    signal ended it after its CPU-time limit, 128 + the signal for another signal, else its own."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGXCPU, signal.SIGKILL) and cpu_used >= cpu_seconds:
            return CPU_EXCEEDED
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


def death_cause(returncode: int | None, limits: JudgeLimits) -> str:
    """Why a judge started by :meth:`JudgeLimits.launcher` ended, from the launcher's exit status."""
    if returncode == CPU_EXCEEDED:
        return f"it used its {limits.cpu_seconds} s of CPU time, the limit"
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if sig:
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit status {returncode}"


def launch(argv: list[str]) -> int:
    """The launcher (``python -I containment.py --memory B --cpu S --tasks N [--read P]… [--write
    P]… -- JUDGE...``). Its child dies with it, takes the limits (and, with folders, Landlock's
    confinement) and becomes the judge; it stays in the launcher's process group, so a judge that
    signals its group (``os.kill(0, …)``, or ``os.getppid()``, which is 0 in its own namespace)
    ends itself and its launcher alone."""
    split = argv.index("--")
    pairs = list(zip(argv[:split:2], argv[1:split:2]))
    options = {name.lstrip("-"): int(value) for name, value in pairs if name not in ("--read", "--write")}
    folders = {name: [value for n, value in pairs if n == name] for name in ("--read", "--write")}
    namespace = new_pid_namespace()
    max_tasks = task_cap(options["tasks"], namespace) if os.geteuid() != 0 else 0  # root: no such limit
    child = os.fork()
    if child == 0:
        try:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            _lower_limit(resource.RLIMIT_CORE, 0)
            _lower_limit(resource.RLIMIT_FSIZE, MAX_FILE_BYTES)
            _lower_limit(resource.RLIMIT_CPU, options["cpu"], options["cpu"] + CPU_GRACE_S)
            if options["memory"]:  # 0: a GPU is visible
                _lower_limit(resource.RLIMIT_AS, options["memory"])
            if max_tasks:  # 0: root, which the limit does not bind
                _lower_limit(resource.RLIMIT_NPROC, max_tasks)
            if folders["--read"] or folders["--write"]:
                confine(folders["--read"], folders["--write"])
            os.execvp(argv[split + 1], argv[split + 1:])
        except BaseException as err:  # noqa: BLE001 - reported, then the child ends
            print(f"the judge could not start: {err}", file=sys.stderr)
        os._exit(127)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _, status, usage = os.wait4(child, 0)
    return exit_status(status, usage.ru_utime + usage.ru_stime, options["cpu"])


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
