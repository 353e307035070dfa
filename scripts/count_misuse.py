"""pytest plugin: classify every bad input that tests/engine/test_misuse.py tries (the table of issue 11).

Usage (repository root): ``python -m pytest tests/engine/test_misuse.py -q -p scripts.count_misuse``;
``MISUSE_BY_TEST=1`` also prints the count per test.

A bad input is one pytest.raises (also inside raises_unchanged) executed by a test; in a
hypothesis test, one per (call line, expected message) whatever the number of examples; and
each B5/B7 test, whose bad input must give the right (finite) answer instead of an error.
  clear : the expected exception, its message matches (and the test passed: nothing changed)
  vague : ValueError/TypeError whose message does not match, or the right type with another message
  silent: nothing raised, or state changed after the error (the test failed its unchanged check),
          or a wrong result (B5/B7)
  crash : any other exception
The random-operation-sequence property test is left out (its misuses are drawn at random).
"""
import re
import sys
from collections import Counter

import pytest

_real_raises = pytest.raises
RECORDS = {}      # key -> verdict
CURRENT = {}      # nodeid, hypothesis flag, per-line ordinals, keys recorded by this test
SKIP = "random_operation_sequences"
OUTCOME_TESTS = ("test_b5_", "test_b7_")


def _call_line():
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.endswith("test_misuse.py") and f.f_code.co_name.startswith("test_"):
            return f.f_lineno
        f = f.f_back
    return -1


class _Probe:
    def __init__(self, expected, match):
        self.expected, self.match, self.line = expected, match, _call_line()

    def __enter__(self):
        return self

    def __exit__(self, typ, val, tb):
        if typ is None:
            verdict = "silent"
        elif issubclass(typ, self.expected):
            verdict = "clear" if self.match is None or re.search(self.match, str(val)) else "vague"
        elif issubclass(typ, (ValueError, TypeError)):
            verdict = "vague"
        else:
            verdict = "crash"
        if CURRENT.get("nodeid") and SKIP not in CURRENT["nodeid"]:
            if CURRENT["hypothesis"]:
                key = (CURRENT["nodeid"], self.line, self.match)
            else:
                n = CURRENT["ordinals"][self.line] = CURRENT["ordinals"].get(self.line, 0) + 1
                key = (CURRENT["nodeid"], self.line, n)
            worst = ("clear", "vague", "silent", "crash")
            old = RECORDS.get(key, "clear")
            RECORDS[key] = max(old, verdict, key=worst.index) if key in RECORDS else verdict
            CURRENT["keys"].append(key)
        return True  # go on: the test's own checks (state unchanged) still run


def _raises(expected, *args, match=None, **kwargs):
    if args:  # the callable form: not used in test_misuse.py
        return _real_raises(expected, *args, match=match, **kwargs)
    return _Probe(expected, match)


def pytest_configure(config):
    pytest.raises = _raises


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    CURRENT.update(nodeid=item.nodeid, hypothesis=getattr(item.obj, "is_hypothesis_test", False),
                   ordinals={}, keys=[])
    yield


def pytest_runtest_logreport(report):
    if report.when != "call" or SKIP in report.nodeid or report.nodeid != CURRENT.get("nodeid"):
        return
    name = report.nodeid.split("::")[-1]
    if name.startswith(OUTCOME_TESTS) and not CURRENT["keys"]:
        RECORDS[(report.nodeid, "outcome")] = "clear" if report.passed else "silent"
    elif report.failed:  # an error was raised but the state changed (or a later check failed)
        for key in CURRENT["keys"][-1:]:
            if RECORDS[key] == "clear":
                RECORDS[key] = "silent"


def pytest_terminal_summary(terminalreporter):
    counts = Counter(RECORDS.values())
    total = sum(counts.values())
    terminalreporter.write_line("")
    terminalreporter.write_line("| | clear | vague | silent | crash | total |")
    terminalreporter.write_line("|---|---|---|---|---|---|")
    terminalreporter.write_line("| bad inputs | " + " | ".join(str(counts[k]) for k in
                                ("clear", "vague", "silent", "crash")) + f" | {total} |")
    for key, verdict in sorted(RECORDS.items(), key=str):
        if verdict != "clear":
            terminalreporter.write_line(f"  {verdict}: {key}")


def pytest_unconfigure(config):
    import os
    if os.environ.get("MISUSE_BY_TEST"):
        by = Counter(key[0].split("::")[-1].split("[")[0] for key in RECORDS)
        for name, n in sorted(by.items()):
            print(f"{n:4d}  {name}")
