"""What keeps a notebook's judge from outliving its grading or reaching beyond it (Linux).

The grader becomes a child subreaper (orphans of its descendants, ``setsid`` or not, come back to
it, so :func:`kill_descendants` reaches them all) and not dumpable (no other process of its user
writes into its output or reads its memory). Each judge starts under :func:`launch`, this file run
as a script: a PID namespace of its own where one can be had, :class:`JudgeLimits` and Landlock's
:func:`confine`. Where the system lacks a call it is skipped; ``docs/teaching.md`` says what then
holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass

GIB = 2**30
MAX_FILE_BYTES, MAX_READ_BYTES = 2 * GIB, 64 * 2**20  # the largest file a judge writes; notebook read
CPU_GRACE_S = 5  # CPU seconds between a judge's SIGXCPU (which it may catch) and its SIGKILL
CPU_EXCEEDED = 128 + signal.SIGXCPU  # the launcher's exit status for a judge past its CPU time
LINUX = sys.platform.startswith("linux")
_PDEATHSIG, _DUMPABLE, _SUBREAPER, _NO_NEW_PRIVS = 1, 4, 36, 38  # prctl options
_NEWUSER, _NEWPID = 0x10000000, 0x20000000  # unshare flags


def _prctl(option: int, value: int) -> bool:
    try:
        return LINUX and ctypes.CDLL(None).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants."""
    return _prctl(_SUBREAPER, 1)


def not_dumpable() -> bool:
    """Close ``/proc/<pid>/fd`` and this process's memory to its user's other processes."""
    return _prctl(_DUMPABLE, 0)


def _proc(name: str):
    """``(pid, bytes of /proc/<pid>/<name>)`` for every process whose file can be read."""
    for entry in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        try:
            with open(f"/proc/{entry}/{name}", "rb") as f:
                yield int(entry), f.read()
        except OSError:
            continue


def children(pid: int | None = None) -> list[int]:
    """The processes whose parent is ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    # "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after the last ")"
    return [child for child, stat in _proc("stat") if int(stat[stat.rfind(b")") + 2:].split()[1]) == pid]


def kill_descendants(deadline_s: float = 10.0, keep=frozenset()) -> int:
    """SIGKILL and reap every descendant of this process but the children in ``keep`` and theirs
    (orphans come back to a subreaper, so repeating on the children reaches them all); how many."""
    killed, end = 0, time.monotonic() + deadline_s
    while time.monotonic() < end and (kids := [pid for pid in children() if pid not in keep]):
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        for pid in kids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return killed


def read_regular(path, max_bytes: int = MAX_READ_BYTES) -> bytes:
    """The bytes of ``path``, read once; a link, pipe, device or folder is refused at the open, a
    file over ``max_bytes`` with ``ValueError``."""
    from mamba_edu.profiling.trace_files import open_regular

    with os.fdopen(open_regular(path, "a notebook", follow_links=False), "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} holds more than the {max_bytes} bytes read")
    return data


# --- Landlock: the folders a judge may read and write ----------------------------------------

_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446  # Landlock's system calls, the same on every arch
_FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}  # by ABI version
_READ, _FILE_ONLY = 0b1101, 0b110 | 1 << 14 | 1 << 15  # execute and read; what a rule on a file may hold
_TCP, _SCOPES = 0b11, 0b11  # bind and connect (ABI 4); abstract sockets and signals (ABI 6)


def _landlock(call: int, *args) -> int:
    result = ctypes.CDLL(None, use_errno=True).syscall(call, *args)
    if result < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where it has none."""
    try:
        return _landlock(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1)) if LINUX else 0
    except (OSError, AttributeError):
        return 0


def confine(readable, writable) -> None:
    """Confine this process and all it starts: read (and run) only under ``readable``, write only
    under ``writable``; no ptrace or ``/proc/<pid>/mem`` outside, no TCP, no signal outside (ABI 6).
    Raises ``OSError`` where Landlock fails: a judge never starts unconfined when it was asked."""
    abi = landlock_abi()
    if abi == 0:
        raise OSError("this kernel has no Landlock")
    fs = _FS_RIGHTS[max(v for v in _FS_RIGHTS if v <= abi)]
    attr = (ctypes.c_uint64 * 3)(fs, _TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 8 * (3 if abi >= 6 else 2 if abi >= 4 else 1)
    ruleset = _landlock(_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for path, rights in [(p, _READ) for p in readable] + [(p, fs) for p in writable]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # a folder this system does not have
            try:
                allowed = rights if os.path.isdir(path) else rights & _FILE_ONLY
                rule = ctypes.create_string_buffer(allowed.to_bytes(8, "little") + fd.to_bytes(4, "little"))
                _landlock(_ADD_RULE, ruleset, 1, rule, ctypes.c_uint32(0))  # 1: a rule on a path
            finally:
                os.close(fd)
        if not _prctl(_NO_NEW_PRIVS, 1):
            raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")
        _landlock(_RESTRICT, ruleset, ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


# --- the judge's launcher: a PID namespace of its own, resource limits ------------------------

@dataclass(frozen=True)
class JudgeLimits:
    """One judge's limits, for it and every process it starts: ``memory``, bytes of address space
    (none where a GPU is visible: CUDA reserves far more than it uses); ``cpu_seconds`` of all its
    threads (then SIGXCPU, :data:`CPU_GRACE_S` later SIGKILL); ``tasks`` more processes and
    threads (:func:`task_cap`). Files: at most :data:`MAX_FILE_BYTES` each, no core files."""

    memory: int = 8 * GIB
    cpu_seconds: int = 1800
    tasks: int = 1024

    def __post_init__(self):
        for name, least in (("memory", GIB), ("cpu_seconds", 1), ("tasks", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < least:
                raise ValueError(f"JudgeLimits {name} must be a whole number of at least {least}, "
                                 f"got {value!r}")

    def address_space(self) -> int | None:
        """The address-space cap in bytes, None where a GPU is visible."""
        return None if gpu_visible() else self.memory

    def memory_text(self) -> str:
        """The memory limit in words, for a verdict."""
        cap = self.address_space()
        return (f"the notebook may use {cap / GIB:g} GiB of address space" if cap
                else "no address-space limit is set where a GPU is visible")

    def launcher(self, readable=(), writable=()) -> list[str]:
        """The command to prepend to a judge's: it starts under these limits, confined to the
        ``readable`` and ``writable`` folders when some are given."""
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
    """Lower ``limit`` to ``soft``, and its hard limit to ``hard`` (default ``soft``) so that it
    cannot be raised again; never above the present hard limit."""
    hard = soft if hard is None else hard
    present = resource.getrlimit(limit)[1]
    if present != resource.RLIM_INFINITY:
        soft, hard = min(soft, present), min(hard, present)
    resource.setrlimit(limit, (soft, hard))


def task_cap(tasks: int, namespace: str | None) -> int:
    """``RLIMIT_NPROC`` for ``tasks`` more tasks. Linux counts the tasks of the user of the judge's
    user namespace: in one of its own (``"user"``) its own alone, else all of this user's, now."""
    if namespace == "user":
        return tasks
    count = 0
    for _, status in _proc("status"):
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if b"Uid" in fields and int(fields[b"Uid"].split()[0]) == os.getuid():
            count += int(fields.get(b"Threads", 0))
    return count + tasks


def new_pid_namespace() -> str | None:
    """Start this process's next child in a PID namespace of its own, where it can signal no
    process outside: as root directly (``"pid"``), else in a user namespace that maps this user to
    itself (``"user"``); None where neither is allowed."""
    if not LINUX:
        return None
    libc = ctypes.CDLL(None)
    if libc.unshare(_NEWPID) == 0:
        return "pid"
    if libc.unshare(_NEWUSER | _NEWPID) != 0:
        return None
    uid, gid = os.getuid(), os.getgid()
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass  # unmapped, the judge sees itself as nobody; the file permissions are still its user's
    return "user"


def exit_status(status: int, cpu_used: float, cpu_seconds: int) -> int:
    """The launcher's exit status for its child's wait ``status``: :data:`CPU_EXCEEDED` when a
    signal ended it past its CPU time, 128 + the signal for another signal, else the child's."""
    if not os.WIFSIGNALED(status):
        return os.waitstatus_to_exitcode(status)
    sig = os.WTERMSIG(status)
    return CPU_EXCEEDED if sig in (signal.SIGXCPU, signal.SIGKILL) and cpu_used >= cpu_seconds else 128 + sig


def death_cause(returncode: int, limits: JudgeLimits) -> str:
    """Why a judge started by :meth:`JudgeLimits.launcher` ended, from the launcher's exit status."""
    if returncode == CPU_EXCEEDED:
        return f"it used its {limits.cpu_seconds} s of CPU time, the limit"
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if not sig:
        return f"exit status {returncode}"
    try:
        return f"killed by {signal.Signals(sig).name}"
    except ValueError:
        return f"killed by signal {sig}"


def launch(argv: list[str]) -> int:
    """The launcher: ``--memory B --cpu S --tasks N [--read P]… [--write P]… -- JUDGE…``. Its
    child dies with it, takes the limits (and, with folders, Landlock) and becomes the judge; in
    the launcher's process group, a judge that signals its group (``os.kill(0, …)``, or its
    parent, PID 0 in its own namespace) ends itself and its launcher alone."""
    split = argv.index("--")
    pairs = list(zip(argv[:split:2], argv[1:split:2]))
    options = {name[2:]: int(value) for name, value in pairs if name not in ("--read", "--write")}
    readable = [value for name, value in pairs if name == "--read"]
    writable = [value for name, value in pairs if name == "--write"]
    namespace = new_pid_namespace()
    max_tasks = task_cap(options["tasks"], namespace) if os.geteuid() != 0 else 0  # root ignores the cap
    child = os.fork()
    if child == 0:
        try:
            _prctl(_PDEATHSIG, signal.SIGKILL)
            _lower_limit(resource.RLIMIT_CORE, 0)
            _lower_limit(resource.RLIMIT_FSIZE, MAX_FILE_BYTES)
            _lower_limit(resource.RLIMIT_CPU, options["cpu"], options["cpu"] + CPU_GRACE_S)
            for limit, value in ((resource.RLIMIT_AS, options["memory"]), (resource.RLIMIT_NPROC, max_tasks)):
                if value:  # 0: a GPU is visible, or root
                    _lower_limit(limit, value)
            if readable or writable:
                confine(readable, writable)
            os.execvp(argv[split + 1], argv[split + 1:])
        except BaseException as err:  # noqa: BLE001 - reported, then the child ends
            print(f"the judge could not start: {err}", file=sys.stderr)
        os._exit(127)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _, status, usage = os.wait4(child, 0)
    return exit_status(status, usage.ru_utime + usage.ru_stime, options["cpu"])


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
