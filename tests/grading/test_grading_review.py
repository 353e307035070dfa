"""The review scan flags every route the docs name, by cell and line, and leaves the course's own
answers (``notebooks/solutions``) alone but for the lines listed here with the reason."""

import json
from pathlib import Path

import pytest

from mamba_edu.grading import review
from mamba_edu.grading.review import Flag, review_flags, summary

SOLUTIONS = Path(__file__).resolve().parents[2] / "notebooks" / "solutions"

#: One plausible cheat per category: the cell, and the reason it must get.
CHEATS = {
    "a .pth file in site-packages": ("import site\nf = open(site.getsitepackages()[0] + '/x.pth', 'w')", review.FILES),
    "ctypes": ("import ctypes", review.RAW_MEMORY),
    "cffi": ("from cffi import FFI", review.RAW_MEMORY),
    "the caller's locals": ("import sys\nseen = sys._getframe(1).f_locals", review.FRAMES),
    "a frame from inspect": ("import inspect\nframe = inspect.currentframe().f_back", review.FRAMES),
    "gc referrers": ("import gc\ngc.get_referrers(check)", review.FRAMES),
    "a traceback's frame": ("try:\n    1 / 0\nexcept Exception as e:\n    g = e.__traceback__.tb_frame", review.FRAMES),
    "a module's __dict__": ("import mamba_edu.exercises.core as c\nd = c.__dict__", review.FRAMES),
    "a profile hook": ("import sys\nsys.setprofile(None)", review.FRAMES),
    "exec of a file": ("exec(open(p).read())", review.CODE),
    "a function from code": ("import types\ng = types.FunctionType(f.__code__, {})", review.CODE),
    "importlib": ("import importlib\nm = importlib.import_module('mamba_edu.gdn')", review.CODE),
    "__import__": ("m = __import__('os')", review.CODE),
    "modes off": ("from torch.utils._python_dispatch import _disable_current_modes", review.TORCH_MODES),
    "torch._C": ("import torch\nwith torch._C._DisableTorchDispatch():\n    pass", review.TORCH_MODES),
    "a dispatch mode": ("from torch.utils._python_dispatch import TorchDispatchMode\nclass M(TorchDispatchMode): pass",
                        review.TORCH_MODES),
    "sync debug mode": ("import torch\ntorch.cuda.set_sync_debug_mode(0)", review.TORCH_MODES),
    "the judge patched": ("import mamba_edu\nmamba_edu.exercises.core.judge = lambda *a: None", review.PATCH),
    "an alias patched": ("import mamba_edu.exercises.core as c\nc.judge = None", review.PATCH),
    "a module patched": ("from mamba_edu.gdn import gating\ngating.f = abs", review.PATCH),
    "setattr on the package": ("import mamba_edu.exercises.core as c\nsetattr(c, 'judge', None)", review.PATCH),
    "torch patched through a name": ("import torch\nL = torch.linalg\nL.vector_norm = lambda *a, **k: 0",
                                     review.PATCH),
    "torch patched through a chain": ("import torch\nA = torch\nB = A.testing\nB.assert_close = print",
                                      review.PATCH),
    "setattr on torch": ("import torch\nsetattr(torch.linalg, 'vector_norm', abs)", review.PATCH),
    "a Tensor method replaced": ("import torch\nT = torch.Tensor\nT.__sub__ = lambda a, b: a", review.PATCH),
    "frames by a literal getattr": ("import logging\nf = getattr(logging.currentframe(), 'f_back')",
                                    review.FRAMES),
    "logging's frame": ("import logging\nf = logging.currentframe()", review.FRAMES),
    "an attrgetter of locals": ("import operator\nseen = operator.attrgetter('f_locals')(f)", review.FRAMES),
    "torch's function modes off": ("import torch\nwith torch._C.DisableTorchFunction():\n    text = repr(m)",
                                    review.TORCH_MODES),
    "a thread through asyncio": ("import asyncio\ntext = asyncio.run(asyncio.to_thread(repr, m))", review.THREADS),
    "every thread's frame": ("import sys\nframes = sys._current_frames()", review.FRAMES),
    "a call through a Mock": ("from unittest import mock\nf = mock.Mock(side_effect=g)()", review.CODE),
    "a frame attribute spelled in parts": ("import operator\nup = operator.attrgetter('f_' + 'back')", review.DYNAMIC),
    "a thread": ("import threading\nthreading.Thread(target=f).start()", review.THREADS),
    "a pool": ("from concurrent.futures import ThreadPoolExecutor", review.THREADS),
    "a subprocess": ("import subprocess\nsubprocess.run(['ls'])", review.THREADS),
    "a fork": ("import os\nos.fork()", review.THREADS),
    "a classmate's notebook": ("text = open('../bob/05.ipynb').read()", review.FILES),
    "an absolute path": ("import pathlib\npathlib.Path('/tmp/x').write_text('1')", review.FILES),
    "the grader's output": ("open('/proc/1/fd/1', 'w').write('PASS')", review.FILES),
    "a file descriptor": ("import os\nos.write(1, b'PASS')", review.OUTPUT),
    "the real stdout": ("import sys\nsys.__stdout__.write('PASS')", review.OUTPUT),
    "a computed name": ("name = 'judge'\ngetattr(core, name)", review.DYNAMIC),
    "a dunder built": ("attr = '__' + 'code' + '__'", review.DYNAMIC),
    "a shell command": ("!rm -rf ../bob", review.MAGIC),
    "not Python": ("def f(:\n    pass", review.UNPARSED),
}

#: What the course's own answers are flagged for, and why that is right: (notebook, cell, line).
EXPECTED_IN_SOLUTIONS = {
    # exercise 00·1 hands the learner expressions as strings: the answer evaluates them
    ("00_start_here", 7, 7, review.CODE),
    # prints the fields of a plan by name
    ("08_zero_syncs_and_graphs", 4, 3, review.DYNAMIC),
    # clears and fills the trace folders, whose paths are computed: the scan cannot tell where
    ("09_profiling_the_bubbles", 3, 6, review.FILES),
    ("09_profiling_the_bubbles", 30, 17, review.FILES),
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_every_route_is_flagged(cheat):
    source, reason = CHEATS[cheat]
    flags = review_flags(["import torch\nx = torch.ones(3)", source])
    assert reason in {f.reason for f in flags if f.cell == 2}, flags


def test_a_flag_names_the_cell_the_line_and_the_text():
    flags = review_flags(["%matplotlib inline\nimport torch", "x = 1\n\n" + "import ctypes  # " + "x" * 200])
    assert flags == [Flag(2, 3, review.RAW_MEMORY, ("import ctypes  # " + "x" * 200)[:120])]


def test_imports_count_across_cells():
    assert [f.cell for f in review_flags(["import sys as s", "frame = s._getframe(0)"])] == [2]


@pytest.mark.parametrize("cell", [
    "import torch\nf = torch.compile(lambda x: x + 1)\ntorch.cuda.synchronize()",
    "import re\npattern = re.compile('a+')",
    "with open('out.json', 'w') as f:\n    f.write('{}')",
    "from pathlib import Path\nPath('results/run.txt').write_text('ok')",
    "signal = x.sum()\ngc = 3\nthreading = []",  # names of learners' own variables
    "%timeit f(x)\ny = getattr(batch, 'rows')",
    "import inspect\nprint(inspect.getsource(f))",
    "import torch\nimport torch.nn.functional as F\ndtype = torch.bfloat16\nact = F.silu\nlinalg = torch.linalg",
])
def test_ordinary_cells_are_not_flagged(cell):
    assert review_flags([cell]) == []


def _solution_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.mark.solutions
def test_the_solutions_are_flagged_only_where_listed():
    found = {(path.stem, f.cell, f.line, f.reason)
             for path in sorted(SOLUTIONS.glob("*.ipynb")) for f in review_flags(_solution_cells(path))}
    assert found == EXPECTED_IN_SOLUTIONS


def test_the_summary_is_one_bounded_line():
    assert summary([]) == ""
    one = summary(review_flags(["import threading\nthreading.Thread(target=f).start()"]))
    assert one.startswith("needs review: cell 1 line 1 uses threads or processes (import threading)")
    many = summary(review_flags(["import ctypes\n" * 100]), limit=200)
    assert len(many) < 220 and many.endswith("more") and "\n" not in many
