"""One notebook's judge: the process that runs the notebook, then checks its answers.

The grader starts :func:`main` as an isolated Python in a throwaway copy of the notebook's folder
and writes one line of orders to its stdin (the report's secret, the notebook's name and code
cells). The judge adds its audit hook (:class:`Watch`, which no code in the process can remove),
runs the cells in an IPython shell of its own, puts back what they replaced in the package and
torch (:class:`Pristine`), asks for the grading seed, judges each exercise with the registry as it was
before any cell ran, and reports each step, flag and verdict as a JSON line that starts with the
secret. A ``BaseException`` that is not an ``Exception`` (``exit()``, ``KeyboardInterrupt``) or a
cell out of memory gives the notebook 0.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import inspect
import json
import logging
import os
import sys
import traceback
import types
from json import dumps  # bound before the notebook runs

from mamba_edu.exercises import core
from mamba_edu.exercises.absent import absent

# --- what the judge watches while the cells run ------------------------------------------------

#: Audit events the notebook's own code raises only to look behind the checks, by reason.
FLAGGED = {"frame or memory inspection": ("sys._getframe", "sys._current_frames", "gc.get_objects",
                                          "gc.get_referrers", "gc.get_referents", "object.__getattr__"),
           "code built or run by hand": ("code.__new__", "function.__new__", "exec", "compile",
                                         "marshal.loads"),
           "ctypes": ("ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.string_at", "ctypes.cdata",
                      "ctypes.call_function"),
           "starts a process": ("subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.exec",
                                "os.posix_spawn", "os.spawn"),
           "tracing or auditing": ("sys.setprofile", "sys.settrace", "sys.addaudithook"),
           "patches a class": ("object.__setattr__", "object.__delattr__")}
_REASON = {event: reason for reason, events in FLAGGED.items() for event in events}
#: Events no library raises on a learner's behalf: flagged when the notebook's code is anywhere on
#: the stack, not only right above the event (the others come from libraries in ordinary cells:
#: ``exec`` and ``sys._getframe`` from ``dataclasses`` and ``namedtuple``, ``sys.setprofile`` from
#: ``torch.profiler``).
ANYWHERE_ON_STACK = {"sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents"}
#: Audit events that change the file system, with the positions of their path arguments.
WRITES = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
          "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,), "os.truncate": (0,),
          "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (0, 1)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
MAX_FLAGS = 20  # the most review lines one notebook sends (each distinct reason and line once)


class Watch:
    """The audit hook of one judge: ``writable`` are the folders it may write into; ``say`` sends
    a report line (``refused=`` a write, ``review=`` a flag); ``handout`` numbers the code cells
    that are the handout's own, unchanged (their ``eval`` is the course's, not flagged)."""

    def __init__(self, writable: list[str], say, handout=()):
        self.writable = tuple(os.path.realpath(p) for p in writable) + ("/dev/null",)
        self.say, self.handout, self.sent, self.busy = say, set(handout), set(), False

    def __call__(self, event: str, args: tuple) -> None:
        if not self.busy:  # the hook's own calls (realpath, getframe) are not the notebook's
            self.busy = True
            try:
                self.judge(event, args)
            finally:
                self.busy = False

    def inside(self, path) -> bool:
        if isinstance(path, int):  # a descriptor: it was opened (and judged) before
            return True
        path = os.path.realpath(os.fsdecode(path))
        return any(path == root or path.startswith(root + os.sep) for root in self.writable)

    def mine(self, filename: str) -> bool:
        """Whether code of ``filename`` is the notebook's: a code cell that is not the handout's own
        (IPython names cell N ``<ipython-input-N-…>``), or a module of the notebook's folder."""
        if filename.startswith("<ipython-input-"):
            return int(filename.split("-")[2]) not in self.handout
        return filename.startswith(os.getcwd() + os.sep)

    def judge(self, event: str, args: tuple) -> None:
        paths = [args[i] for i in WRITES.get(event, ()) if i < len(args)]
        if event == "open" and args[0] is not None:  # open(path, mode, flags)
            mode, flags = args[1] or "", args[2] or 0
            if any(c in mode for c in "wax+") or flags & _WRITE_FLAGS:
                paths = [args[0]]
        outside = [p for p in paths if not self.inside(p)]
        if outside:
            self.say(refused=f"tried to write {os.fsdecode(outside[0])!s:.200}, outside its folder")
            raise PermissionError(f"the grader lets a notebook write only inside its folder, "
                                  f"not {outside[0]}")
        if event not in _REASON:
            return
        frame, reason = sys._getframe(2), f"{_REASON[event]} ({event})"
        while frame.f_code in _GETTERS:  # the library's frame getter: whoever called it
            frame = frame.f_back
        if event in ANYWHERE_ON_STACK:  # through a trampoline too (a Mock's side_effect, map, ...)
            frame = next((f for f in _stack(frame) if self.mine(f.f_code.co_filename)), frame)
        name = frame.f_code.co_filename
        where = name.split("-")[2] if name.startswith("<ipython-input-") else name
        key = (reason, name, frame.f_lineno)
        if self.mine(name) and key not in self.sent and len(self.sent) < MAX_FLAGS:
            self.sent.add(key)
            self.say(review=f"{reason} in {frame.f_code.co_name}, cell {where} line {frame.f_lineno}"[:300])


#: The library functions that hand their caller a frame: an event they raise is their caller's.
_GETTERS = {f.__code__ for f in (logging.currentframe, inspect.currentframe, inspect.stack, inspect.trace,
                                 traceback.extract_stack, traceback.walk_stack, traceback.print_stack)}
#: The modules put back after the cells: all of their namespaces.
_WATCHED = ("mamba_edu", "builtins")
#: The libraries the checks compute with: the functions and classes the cells replaced in their
#: modules are put back (torch fills its namespaces lazily, so only code counts), and so are
#: ``torch.Tensor``'s methods.
_LIBRARIES = ("torch", "numpy", "math", "operator", "functools")
#: What is put back after every call of an answer, too: the modules the checks compare with, and
#: the checks' own (the package's other modules carry the checks' instruments while an answer runs).
_HOT = ("builtins", "torch", "torch.linalg", "torch.testing", "torch.nn.functional", "torch.functional",
        "numpy", "math", "operator", "functools", "mamba_edu.testing")
_GONE = object()
_CLASS_CACHES = {"__slotnames__", "__annotations__"}  # what copy, pickle and typing add to a class


def _code(value) -> bool:
    """A function, method or class: what a patch replaces (not a cache the package fills)."""
    return issubclass(type(value), (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
                                    functools.partial))  # type(): a deprecated name warns on isinstance


def _own_wrapper(new, old, module: str) -> bool:
    """Whether ``new`` is the library's own wrapper of ``old`` (torch's dynamo wraps
    ``torch.manual_seed`` when it is first imported): code in the library's folder, around ``old``."""
    code, top = getattr(new, "__code__", None), getattr(sys.modules[module.split(".")[0]], "__file__", None)
    return (getattr(new, "__wrapped__", None) is old and code is not None and top is not None
            and code.co_filename.startswith(os.path.dirname(top) + os.sep))


def _stack(frame):
    """``frame`` and its callers, innermost first."""
    while frame is not None:
        yield frame
        frame = frame.f_back


class Pristine:
    """The watched modules' namespaces, and the package's classes and function code, as they are
    now."""

    def __init__(self):
        import torch
        self.modules = {name: (m, dict(vars(m))) for name, m in list(sys.modules.items())
                        if m is not None and name.split(".")[0] in _WATCHED + _LIBRARIES}
        own = [value for name, (_, namespace) in self.modules.items() if name.startswith("mamba_edu")
               for value in namespace.values()
               if isinstance(value, (type, types.FunctionType)) and value.__module__ == name]
        self.classes = {value: dict(vars(value)) for value in own + [torch.Tensor] if isinstance(value, type)}
        self.code = {value: value.__code__ for value in own if isinstance(value, types.FunctionType)}
        self.hot = [name for name in self.modules if name in _HOT or name.startswith("mamba_edu.exercises.")]

    def restore(self, hot: bool = False) -> list[str]:
        """Put back what changed since; the functions and classes replaced or added, by name.
        ``hot``: only the functions and classes in the modules of :data:`_HOT` and the checks' own,
        and ``torch.Tensor``'s (after each call of an answer: about 0.3 ms; a check's own caches,
        such as a model it built, stay)."""
        changed = []
        for name in self.hot if hot else self.modules:
            module, namespace = self.modules[name]
            now = vars(module)
            if hot or name.split(".")[0] in _LIBRARIES:  # a function replaced, not by the library itself
                replaced = [k for k, v in namespace.items() if _code(v) and now.get(k, _GONE) is not v
                            and not _own_wrapper(now.get(k), v, name)]
                changed += [f"{name}.{k}" for k in replaced]
                now.update({k: namespace[k] for k in replaced})
                continue
            changed += [f"{name}.{k}" for k, v in namespace.items()
                        if now.get(k, _GONE) is not v and (_code(v) or _code(now.get(k)))]
            if name.startswith("mamba_edu"):  # names the cells added (not Triton's interpreter's)
                added = [k for k in now if k not in namespace and not k.startswith("__")
                         and (getattr(now[k], "__module__", None) == "__main__" or hasattr(builtins, k))]
                changed += [f"{name}.{k} (added)" for k in added]
                for k in added:
                    del now[k]
            now.update(namespace)
        for cls, namespace in self.classes.items():
            if hot and cls.__module__ != "torch":
                continue
            for k in set(cls.__dict__) - set(namespace) - _CLASS_CACHES:  # also inherited ones (Tensor.__sub__)
                changed.append(f"{cls.__module__}.{cls.__qualname__}.{k} (added)")
                delattr(cls, k)
            for k, v in namespace.items():
                if cls.__dict__.get(k, _GONE) is not v and k not in ("__dict__", "__weakref__"):
                    changed.append(f"{cls.__module__}.{cls.__qualname__}.{k}")
                    setattr(cls, k, v)
        for function, code in () if hot else self.code.items():
            if function.__code__ is not code:
                changed.append(f"{function.__module__}.{function.__qualname__} (its code)")
                function.__code__ = code
        return changed


# --- the notebook's run and the checks ------------------------------------------------------

def guarded(fn, forbidden: tuple[str, ...], pristine: Pristine):
    """``fn`` as the check calls it: with ``forbidden`` absent, and failing if it called one of them,
    even if it caught what that raised, or if it replaced what the check compares with
    (``pristine.restore(hot=True)`` puts it back first). (A Triton kernel goes as it is:
    ``_require_kernel`` in ``nb03.py`` checks it.)"""
    if not callable(fn) or hasattr(fn, "__getitem__"):
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            with absent(forbidden) as called:
                try:
                    result = fn(*args, **kwargs)
                except Exception:
                    if not called:
                        raise
        finally:
            replaced = pristine.restore(hot=True)
        if replaced:
            raise AssertionError(f"the answer replaced {replaced[0]} while it ran (put back): the check "
                                 "compares with the library's own")
        if called:
            raise AssertionError(f"the answer calls {', '.join(sorted(set(called)))}, which this exercise "
                                 "asks you to write yourself")
        return result
    return call


def judge_exercise(ex: core.Exercise, namespace: dict, note: str = "", pristine: Pristine | None = None
                   ) -> core.Verdict:
    """The verdict of exercise ``ex`` for the functions in ``namespace`` (the notebook's globals);
    ``note`` follows the message of a function that is not defined. ``pristine``: the package and
    libraries as the checks need them (default: as they are now); what the answer replaced is put
    back after each of its calls and after the check, and fails the exercise."""
    missing = [name for name in ex.names if name not in namespace]
    if missing:
        return core.Verdict(ex, core.FAIL, f"{', '.join(missing)} is not defined (did its cell run?){note}")
    pristine = pristine or Pristine()
    verdict = core.judge(ex, *(guarded(namespace[name], ex.forbidden, pristine) for name in ex.names))
    replaced = pristine.restore()
    if replaced:
        return core.Verdict(ex, core.FAIL, f"the answer replaced {replaced[0]} during the check (put back)")
    return verdict


def out_of_memory(err: BaseException) -> bool:
    """Whether an error says an allocation failed (``MemoryError``, numpy's too, or torch's)."""
    return isinstance(err, MemoryError) or "can't allocate memory" in str(err) or "bad_alloc" in str(err)


def run(orders: dict, say, seed) -> dict:
    """Run the notebook, then judge its exercises (``say(step=…)`` before each; ``seed()`` asks the
    grader for the seed): ``{"exercises": [[number, status, message], …]}`` or ``{"zero": reason}``."""
    from IPython.core.interactiveshell import InteractiveShell  # the checks alone run without IPython

    class Shell(InteractiveShell):  # no front end: %matplotlib needs no GUI, exit() ends the notebook
        def enable_gui(self, gui=None):
            pass

        def ask_exit(self):
            raise SystemExit("exit()")

    shell, errors = Shell.instance(), []
    registered = {n: dataclasses.replace(ex) for n, ex in core.REGISTRY[orders["notebook"]].items()}
    pristine = Pristine()
    sys.path.append("")  # the notebook's folder, as in Jupyter, after the package and its libraries
    for number, source in enumerate(orders["cells"], 1):
        say(step=f"code cell {number}")
        result = shell.run_cell(source, store_history=True)
        err = result.error_before_exec or result.error_in_exec
        if err is not None and not isinstance(err, Exception):
            return {"zero": f"code cell {number} raised {type(err).__name__} ({err})"}
        if err is not None and out_of_memory(err):
            return {"zero": f"code cell {number} ran out of memory ({orders['memory']}): {str(err)[:200]}"}
        if err is not None:
            errors.append(f"; cell {number}: {type(err).__name__}: {err}"[:300])
    for name in pristine.restore()[:5]:
        say(review=f"the cells replaced {name} (put back before the checks)")
    os.environ[core.SEED_VARIABLE] = seed()
    verdicts = []
    for number, ex in sorted(registered.items()):
        say(step=f"the check of exercise {number}")
        try:
            verdict = judge_exercise(ex, shell.user_ns, (errors or [""])[0], pristine)
        except BaseException as err:  # noqa: BLE001 - exit(), KeyboardInterrupt: the notebook gets 0
            return {"zero": f"exercise {number}: the answer raised {type(err).__name__} (a BaseException)"}
        verdicts.append([number, verdict.status, verdict.message])
    return {"exercises": verdicts}


def main() -> None:
    """Read the orders, judge the notebook, write the verdict; whatever the notebook left running
    is the grader's to kill."""
    orders = json.loads(sys.stdin.readline())
    report, grader = os.fdopen(os.dup(1), "w"), os.fdopen(os.dup(0), "r")
    nowhere = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the notebook reads nothing and writes nowhere
        os.dup2(nowhere, fd)
    secret = orders.pop("secret")

    def say(**message):
        report.write(secret + dumps(message)[:4000] + "\n")
        report.flush()

    def seed() -> str:
        say(step="seed")
        return grader.readline().strip()

    sys.addaudithook(Watch([os.getcwd(), os.environ.get("TMPDIR", os.getcwd())], say, orders["handout"]))
    say(**run(orders, say, seed))
    os._exit(0)  # nothing the notebook registered (atexit, threads) runs after the verdict


if __name__ == "__main__":
    main()
