"""What a judge watches while a notebook runs: an audit hook, and the modules as they were.

:class:`Watch` is a Python audit hook (``sys.addaudithook``: once added, no code in the process can
remove it). It refuses every write outside the notebook's own folders (an ``open`` for writing,
``os.remove``, ``os.rename``, ``shutil.rmtree`` …) and reports it at once, which gives the
notebook 0; and it reports, for review, what the notebook's own code does that a check cannot
judge: frame and memory inspection, code objects made or run by hand, ``ctypes``, processes,
tracing. A report leaves the process when it happens, so the notebook cannot take it back.

:class:`Pristine` remembers the package's modules, classes and functions and the builtins before
the cells run, and puts back whatever the cells replaced, so that the checks run with what the
grader loaded.
"""

from __future__ import annotations

import builtins
import functools
import os
import sys
import types

#: Audit events the notebook's own code raises only to look behind the checks, by reason.
FLAGGED = {"frame or memory inspection": ("sys._getframe", "sys._current_frames", "gc.get_objects",
                                          "gc.get_referrers", "gc.get_referents", "object.__getattr__"),
           "code built or run by hand": ("code.__new__", "function.__new__", "exec", "compile",
                                         "marshal.loads"),
           "ctypes": ("ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.string_at",
                      "ctypes.cdata", "ctypes.call_function"),
           "starts a process": ("subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.exec",
                                "os.posix_spawn", "os.spawn"),
           "tracing or auditing": ("sys.setprofile", "sys.settrace", "sys.addaudithook"),
           "patches a class": ("object.__setattr__", "object.__delattr__")}
_REASON = {event: reason for reason, events in FLAGGED.items() for event in events}
#: Audit events that change the file system, with the positions of their path arguments.
WRITES = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
          "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,), "os.truncate": (0,),
          "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (0, 1)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
#: The most review lines one notebook sends (each distinct reason and line once).
MAX_FLAGS = 20


class Watch:
    """The audit hook of one judge: ``writable`` are the folders it may write into; ``say`` sends
    a report line (``refused=`` a write, ``review=`` a flag); ``handout`` the numbers of the code
    cells that are the handout's own, unchanged (their ``eval`` is the course's, not flagged)."""

    def __init__(self, writable: list[str], say, handout=()):
        self.writable = tuple(os.path.realpath(p) for p in writable) + ("/dev/null",)
        self.say, self.handout, self.sent, self.busy = say, set(handout), set(), False

    def is_notebook_code(self, frame) -> bool:
        """Code of a notebook cell the learner wrote (IPython names cell N ``<ipython-input-N-…>``)
        or of a module in the notebook's folder."""
        name = frame.f_code.co_filename
        if name.startswith("<ipython-input-"):
            return int(name.split("-")[2]) not in self.handout
        return name.startswith(os.getcwd() + os.sep)

    def inside(self, path) -> bool:
        if isinstance(path, int):  # a descriptor: it was opened (and judged) before
            return True
        path = os.path.realpath(os.fsdecode(path))
        return any(path == root or path.startswith(root + os.sep) for root in self.writable)

    def __call__(self, event: str, args: tuple) -> None:
        if self.busy:  # the hook's own calls (realpath, getframe) are not the notebook's
            return
        self.busy = True
        try:
            self.judge(event, args)
        finally:
            self.busy = False

    def judge(self, event: str, args: tuple) -> None:
        paths = ()
        if event == "open" and args[0] is not None:
            mode, flags = args[1] or "", args[2] or 0
            if any(c in mode for c in "wax+") or flags & _WRITE_FLAGS:
                paths = (args[0],)
        elif event in WRITES:
            paths = tuple(args[i] for i in WRITES[event] if i < len(args))
        outside = [p for p in paths if not self.inside(p)]
        if outside:
            self.say(refused=f"tried to write {os.fsdecode(outside[0])!s:.200}, outside its folder")
            raise PermissionError(f"the grader lets a notebook write only inside its folder, not {outside[0]}")
        reason = _REASON.get(event)
        if reason is not None:
            caller = sys._getframe(2)
            if self.is_notebook_code(caller):
                self.flag(f"{reason} ({event})", caller)

    def flag(self, reason: str, frame) -> None:
        key = (reason, frame.f_code.co_filename, frame.f_lineno)
        if key not in self.sent and len(self.sent) < MAX_FLAGS:
            self.sent.add(key)
            where = frame.f_code.co_filename.removeprefix("<ipython-input-").split("-")[0]
            self.say(review=f"{reason} in {frame.f_code.co_name}, cell {where} line {frame.f_lineno}"[:300])


#: The modules put back after the cells: the package's and the builtins. (torch fills and wraps
#: its own namespaces lazily; a cell's patch of torch is flagged by the static review instead.)
_WATCHED = ("mamba_edu", "builtins")


class Pristine:
    """The watched modules' namespaces and the package's classes and functions as they are now."""

    def __init__(self):
        self.modules = {name: (m, dict(vars(m))) for name, m in list(sys.modules.items())
                        if m is not None and name.split(".")[0] in _WATCHED}
        self.classes, self.code = {}, {}
        for name, (module, namespace) in self.modules.items():
            if name.startswith("mamba_edu"):
                for value in namespace.values():
                    if isinstance(value, type) and value.__module__ == name:
                        self.classes[value] = dict(vars(value))
                    elif isinstance(value, types.FunctionType) and value.__module__ == name:
                        self.code[value] = value.__code__

    def restore(self) -> list[str]:
        """Put back what changed since; returns the functions and classes that were replaced or
        added, by name (a module's cache filled by the package's own code is put back unnamed)."""
        changed = []
        for name, (module, namespace) in self.modules.items():
            now = vars(module)
            changed += [f"{name}.{k}" for k, v in namespace.items()
                        if now.get(k, _GONE) is not v and (_code(v) or _code(now.get(k)))]
            if name.startswith("mamba_edu"):  # (Triton's interpreter adds names of its own: they stay)
                added = [k for k in now if k not in namespace and not k.startswith("__")
                         and (_notebooks(now[k]) or hasattr(builtins, k))]
                changed += [f"{name}.{k} (added)" for k in added]
                for k in added:
                    del now[k]
            now.update(namespace)
        for cls, namespace in self.classes.items():
            for k, v in namespace.items():
                if cls.__dict__.get(k, _GONE) is not v and k not in ("__dict__", "__weakref__"):
                    changed.append(f"{cls.__module__}.{cls.__qualname__}.{k}")
                    setattr(cls, k, v)
        for function, code in self.code.items():
            if function.__code__ is not code:
                changed.append(f"{function.__module__}.{function.__qualname__} (its code)")
                function.__code__ = code
        return changed


_GONE = object()


def _notebooks(value) -> bool:
    """Made by the notebook's cells (IPython runs them as ``__main__``)."""
    return getattr(value, "__module__", None) == "__main__"


def _code(value) -> bool:
    """A function, method or class: what a patch replaces (a cache the package fills, even with a
    callable model, is not one)."""
    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
                              functools.partial))
