"""One notebook's judge: the process that runs the notebook, then checks its answers.

The grader (:mod:`~mamba_edu.grading.grader`) starts ``python -m mamba_edu.grading.judge`` in
a throwaway copy of the notebook's folder, under resource limits, and writes one line of orders to
its stdin: the report's secret, the notebook's name and code cells, the grading seed. The judge

1. runs the code cells in an IPython shell of its own (magics work, a failing cell does not stop
   it, whatever the notebook prints goes nowhere),
2. sets the grading seed (the cells never saw it), then judges each exercise with the functions
   the notebook defined (:func:`judge_exercise`): every call of an answer runs with the package
   functions and torch ops its exercise forbids absent (:func:`~mamba_edu.exercises.absent.absent`),
3. writes each step, then the verdicts, as JSON lines that start with the secret.

A cell or an answer that raises a ``BaseException`` that is not an ``Exception`` (``exit()``,
``KeyboardInterrupt``), or a cell that runs out of memory, gives the notebook 0 with the reason.
The notebook runs in this process, so a notebook written to fake its own results here (patching
the checks, reading their frames) is not stopped: ``docs/teaching.md`` says what is guaranteed.
"""

import functools
import json
import os
import sys
from json import dumps  # bound before the notebook runs

from IPython.core.interactiveshell import InteractiveShell

from mamba_edu.exercises import core
from mamba_edu.exercises.absent import absent


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


class _Shell(InteractiveShell):
    """IPython without a front end: ``%matplotlib inline`` needs no GUI, ``exit()`` ends the
    notebook as it ends a kernel."""

    def enable_gui(self, gui=None):
        pass

    def ask_exit(self):
        raise SystemExit("exit()")


def out_of_memory(err: BaseException) -> bool:
    """Whether an error says an allocation failed: ``MemoryError`` (numpy's too), torch's
    ``can't allocate memory``."""
    return isinstance(err, MemoryError) or "can't allocate memory" in str(err) or "bad_alloc" in str(err)


def run(orders: dict, say) -> dict:
    """Run the notebook, then judge its exercises (``say(step=…)`` before each):
    ``{"exercises": [[number, status, message], …]}`` or ``{"zero": reason}``."""
    shell, cells, errors = _Shell.instance(), orders["cells"], []
    sys.path.insert(0, "")  # the notebook's folder, as in Jupyter
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
    os.environ[core.SEED_VARIABLE] = orders["seed"]
    verdicts = []
    for number, ex in sorted(core.REGISTRY[orders["notebook"]].items()):
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
    report = os.fdopen(os.dup(1), "w")
    nowhere = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the notebook reads nothing and writes nowhere
        os.dup2(nowhere, fd)

    def say(**message):
        report.write(orders["secret"] + dumps(message) + "\n")
        report.flush()

    say(**run(orders, say))
    os._exit(0)  # nothing the notebook registered (atexit, threads) runs after the verdict


if __name__ == "__main__":
    main()
