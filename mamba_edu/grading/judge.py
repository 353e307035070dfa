"""One notebook's judge: the process that runs the notebook, then checks its answers.

The grader (:mod:`~mamba_edu.grading.grader`) starts this module's :func:`main` with an isolated
Python (``-I``) in a throwaway copy of the notebook's folder, under resource limits (and where the
kernel allows, Landlock's confinement), and writes one line of orders to its stdin: the report's
secret, the notebook's name and code cells. The judge

1. adds its audit hook (:class:`~mamba_edu.grading.watch.Watch`: a write outside the notebook's
   folders is refused and gives 0; inspection, code built by hand, ``ctypes``… are flagged for
   review) and remembers the modules as they are (:class:`~mamba_edu.grading.watch.Pristine`),
2. runs the code cells in an IPython shell of its own (magics work, a failing cell does not stop
   it, whatever the notebook prints goes nowhere),
3. puts back what the cells replaced in the package, torch or numpy (flagged), asks the grader for
   the grading seed (the cells never saw it), then judges each exercise of the registry as it was
   before any cell ran, with the functions the notebook defined (:func:`judge_exercise`): every
   call of an answer runs with the package functions and torch ops its exercise forbids absent
   (:func:`~mamba_edu.exercises.absent.absent`),
4. writes each step, each flag, then the verdicts, as JSON lines that start with the secret.

A cell or an answer that raises a ``BaseException`` that is not an ``Exception`` (``exit()``,
``KeyboardInterrupt``), or a cell that runs out of memory, gives the notebook 0 with the reason.
The notebook runs in this process: ``docs/teaching.md`` says what is guaranteed, and what is only
flagged for an instructor's review.
"""

import dataclasses
import functools
import json
import os
import sys
from json import dumps  # bound before the notebook runs

from mamba_edu.exercises import core
from mamba_edu.exercises.absent import absent
from mamba_edu.grading.watch import Pristine, Watch


def guarded(fn, forbidden: tuple[str, ...]):
    """``fn`` as the check calls it: it runs with ``forbidden`` absent, and a call of one of them
    fails the answer, even if the answer caught what it raised. (A Triton kernel, launched by its
    check as ``kernel[grid](…)``, goes as it is: ``_require_kernel`` in ``nb03.py`` checks it.)"""
    if not callable(fn) or hasattr(fn, "__getitem__"):
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with absent(forbidden) as called:
            try:
                result = fn(*args, **kwargs)
            except Exception:
                if not called:
                    raise
        if called:
            raise AssertionError(f"the answer calls {', '.join(sorted(set(called)))}, which this exercise "
                                 "asks you to write yourself")
        return result
    return call


def judge_exercise(ex: core.Exercise, namespace: dict, note: str = "") -> core.Verdict:
    """The verdict of exercise ``ex`` for the functions in ``namespace`` (the notebook's globals);
    ``note`` follows the message of a function that is not defined."""
    missing = [name for name in ex.names if name not in namespace]
    if missing:
        return core.Verdict(ex, core.FAIL, f"{', '.join(missing)} is not defined (did its cell run?){note}")
    return core.judge(ex, *(guarded(namespace[name], ex.forbidden) for name in ex.names))


def _shell():
    """IPython without a front end: ``%matplotlib inline`` needs no GUI, ``exit()`` ends the
    notebook as it ends a kernel. (Imported here: the checks run without IPython.)"""
    from IPython.core.interactiveshell import InteractiveShell

    class Shell(InteractiveShell):
        def enable_gui(self, gui=None):
            pass

        def ask_exit(self):
            raise SystemExit("exit()")
    return Shell.instance()


def out_of_memory(err: BaseException) -> bool:
    """Whether an error says an allocation failed: ``MemoryError`` (numpy's too), torch's
    ``can't allocate memory``."""
    return isinstance(err, MemoryError) or "can't allocate memory" in str(err) or "bad_alloc" in str(err)


def run(orders: dict, say, seed) -> dict:
    """Run the notebook, then judge its exercises (``say(step=…)`` before each; ``seed()`` asks
    the grader for the grading seed): ``{"exercises": [[number, status, message], …]}`` or
    ``{"zero": reason}``."""
    shell, cells, errors = _shell(), orders["cells"], []
    registered = {n: dataclasses.replace(ex) for n, ex in core.REGISTRY[orders["notebook"]].items()}
    pristine = Pristine()
    sys.path.append("")  # the notebook's folder, as in Jupyter, after the package and its libraries
    for number, source in enumerate(cells, 1):
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
            verdict = judge_exercise(ex, shell.user_ns, (errors or [""])[0])
        except BaseException as err:  # noqa: BLE001 - exit(), KeyboardInterrupt: the notebook gets 0
            return {"zero": f"exercise {number}: the answer raised {type(err).__name__} (a BaseException)"}
        verdicts.append([number, verdict.status, verdict.message])
    return {"exercises": verdicts}


def main() -> None:
    """Read the orders, judge the notebook, write the verdict (the grader kills what the notebook
    started before it reports it)."""
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
