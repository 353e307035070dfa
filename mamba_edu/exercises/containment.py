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


def limit_resources() -> None:
    """No core files; no file larger than :data:`MAX_FILE_BYTES` (inherited by the kernel)."""
    for limit, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, MAX_FILE_BYTES)):
        soft, hard = resource.getrlimit(limit)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (cap, hard))


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
