"""The grader against hostile notebooks (issue 28): every cheat gets 0, every failure mode costs
that notebook alone. The notebooks are in tests/hostile_notebooks/<cheat>/<stem>.ipynb.

The cheats that cannot touch one another are graded in one class-mode run (issue 37: one student
per cheat, two at a time) and each test reads its student's part of the report; what needs a
folder, a package or a process of its own is graded in a run of its own. A notebook written to
fake its results inside its own judge process (patching the checks, reading their frames) is not
stopped, and docs/teaching.md says so (:func:`test_the_docs_say_what_is_not_guaranteed`)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # the notebook tests need it; a bare GPU machine lacks it

from mamba_edu.exercises.core import REGISTRY
from mamba_edu.grading.containment import landlock_abi

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "hostile_notebooks"
SOLUTIONS = ROOT / "notebooks" / "solutions"
N01 = len(REGISTRY["01_gated_deltanet_recurrence"])  # the exercises of the notebook most tests grade

pytestmark = [pytest.mark.extra, pytest.mark.solutions]


def _grade(path, *extra, env=None, json_report=True, timeout=900, cwd=None):
    cmd = [sys.executable, "-m", "mamba_edu", "grade", str(path), *extra] + (["--json"] if json_report else [])
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                            env={**os.environ, **(env or {})})
    report = json.loads(result.stdout) if json_report and result.stdout.strip().startswith("{") else None
    return result, report


def _messages(notebooks) -> list[str]:
    return [e["message"] for nb in notebooks for e in nb["exercises"]]


def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    return subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "true"],
                          capture_output=True).returncode == 0


# --- answers that are not the learner's own, and printed verdicts ----------------------------

CHEATS = {
    # cheat folder: a phrase one of its verdicts must carry (None: the stubs stay "not done")
    "pre_run_cell_fake_marker": None,
    "package_answers": "the answer calls mamba_edu.gdn.gating",
    "triton_stand_in_and_oracles": "not a Triton kernel",
    "private_oracle_nb00": "the answer calls mamba_edu.exercises.nb00",
    "sync_sniffer_off": "np.asarray",
    "torch_patched": "relative error",
}
#: Cheats the judge cannot stop (docs/teaching.md, "Not guaranteed"): every verdict must arrive flagged.
FLAGGED_ONLY = {"forged_report": "frame or memory inspection (sys._current_frames)"}


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    """Every cheat of CHEATS a student of one class folder (named after the cheat), graded once.
    Two at a time is safe: none of them writes outside its throwaway copy, edits a file of the
    package, signals a process or ends its judge (the cheats that do — write_outside,
    delete_solutions, edit_package, kill_grader, os_exit, exit_call, endless_loop — are graded in
    runs of their own below), and each notebook has its own judge and package copy."""
    cls = tmp_path_factory.mktemp("hostile") / "class"
    for cheat in [*CHEATS, *FLAGGED_ONLY]:
        shutil.copytree(HOSTILE / cheat, cls / cheat)
    result, report = _grade(cls, "--timeout", "120", "--jobs", "2")
    assert report is not None, result.stderr[-3000:]
    assert sorted(s["student"] for s in report["students"]) == sorted([*CHEATS, *FLAGGED_ONLY]), report["students"]
    return result, {s["student"]: s for s in report["students"]}


def _submitted(students: dict, cheat: str) -> tuple[dict, list[dict]]:
    """The cheat's student and its notebooks that were submitted (the cheat folder's, in order);
    every other notebook of the course is reported "missing", as not submitted."""
    student = students[cheat]
    files = sorted(p.name for p in (HOSTILE / cheat).glob("*.ipynb"))
    mine = [nb for nb in student["notebooks"] if nb["file"] in files]
    assert [nb["file"] for nb in mine] == files, student
    assert all(nb["status"] == "missing" and nb["reason"] == "not submitted"
               for nb in student["notebooks"] if nb["file"] not in files), student
    return student, mine


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_each_cheat_scores_zero(cheat, shared_run):
    result, students = shared_run
    assert result.returncode == 1, result.stderr[-2000:]
    student, mine = _submitted(students, cheat)
    assert student["points"] == 0 and sum(nb["passed"] for nb in mine) == 0, student
    assert sum(nb["total"] for nb in mine) >= 2, mine
    assert all(nb["status"] == "graded" for nb in mine), mine
    if CHEATS[cheat]:
        assert any(CHEATS[cheat] in m for m in _messages(mine)), _messages(mine)
    else:
        assert {e["status"] for nb in mine for e in nb["exercises"]} == {"not done"}


def test_more_cheat_verdicts(shared_run):
    """The other half of two cheat notebooks: a wrapper that calls the package's function, and
    the private oracle of notebook 03 (absent while the answer runs, so the call is named)."""
    _, students = shared_run
    _, mine = _submitted(students, "package_answers")
    assert "the answer calls mamba_edu.gdn.gating" in _messages(mine)[1]
    _, mine = _submitted(students, "triton_stand_in_and_oracles")
    assert "the answer calls mamba_edu.exercises.nb03" in _messages(mine)[1]
    _, mine = _submitted(students, "torch_patched")  # put back before the checks, and named
    reviews = " ".join(e["review"] for nb in mine for e in nb["exercises"])
    assert "the cells replaced torch.linalg.vector_norm" in reviews and "torch.Tensor.__sub__" in reviews, reviews


@pytest.mark.parametrize("cheat", sorted(FLAGGED_ONLY))
def test_a_cheat_that_is_not_stopped_arrives_flagged_on_every_exercise(cheat, shared_run):
    """A forged report writes every verdict at once: what the judge saw during one check flags
    that exercise and every later one."""
    _, students = shared_run
    _, mine = _submitted(students, cheat)
    exercises = [e for nb in mine for e in nb["exercises"]]
    assert len(exercises) >= 2 and all(FLAGGED_ONLY[cheat] in e["review"] for e in exercises), exercises


def test_the_docs_say_what_is_not_guaranteed():
    """A notebook that fakes its own results inside its judge (reading the check's frames or the
    report's secret) is not stopped, only flagged: the judge runs the notebook in its own process.
    docs/teaching.md says so, and where to grade instead."""
    text = " ".join((ROOT / "docs" / "teaching.md").read_text().split())
    assert "**Not guaranteed:** a notebook written to fake *its own* results inside its judge process" in text
    assert "the container recipe below" in text


# --- a notebook can do damage (it cannot any more, or it costs it its grade) -----------------

def test_writes_land_in_the_throwaway_copy(tmp_path):
    folder = tmp_path / "submitted"
    shutil.copytree(HOSTILE / "write_outside", folder)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result, report = _grade(folder)
    assert report["passed"] == 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing beside or in the folder


def test_a_notebook_that_edits_the_package_gets_zero_and_the_next_one_is_safe(tmp_path):
    """The notebook appends an always-pass judge to exercises/core.py; it edits its judge's
    private copy, gets 0, and the next learner's untouched notebook still scores 0 (run on a copy
    of the package, so that even a failure here leaves the repository alone)."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "mamba_edu", site / "mamba_edu", ignore=shutil.ignore_patterns("__pycache__"))
    core = site / "mamba_edu" / "exercises" / "core.py"
    original = core.read_bytes()
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(HOSTILE / "edit_package" / "00_start_here.ipynb", folder)
    handout = nbformat.read(ROOT / "notebooks" / "01_gated_deltanet_recurrence.ipynb", as_version=4)
    handout.cells.append(nbformat.v4.new_code_cell("# touched, so that it is judged"))
    nbformat.write(handout, folder / "01_gated_deltanet_recurrence.ipynb")
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result, report = _grade(folder, env=env, cwd=tmp_path)
    first, second = report["notebooks"]
    assert first["status"] == "zero" and "tried to write" in first["reason"] and "exercises/core.py" in first["reason"], first
    assert second["status"] == "graded" and second["passed"] == 0, second
    assert {e["status"] for e in second["exercises"]} == {"not done"}
    assert core.read_bytes() == original  # the installed package was never written to


def test_a_fake_score_never_reaches_the_graders_output():
    result, _ = _grade(HOSTILE / "fake_score_print", json_report=False)
    assert result.returncode == 1
    assert result.stdout.count("score:") == 1 and result.stdout.rstrip().endswith(f"score: 0/{N01} (0 %)")
    assert f"{N01}/{N01}" not in result.stdout + result.stderr


def test_killing_its_parent_costs_the_notebook_alone(tmp_path):
    shutil.copy(HOSTILE / "kill_grader" / "00_start_here.ipynb", tmp_path)
    shutil.copy(SOLUTIONS / "01_gated_deltanet_recurrence.ipynb", tmp_path)
    result, report = _grade(tmp_path)
    killed, good = report["notebooks"]
    if landlock_abi() >= 6:  # Landlock scopes signals: the kill is refused, the notebook graded
        assert killed["status"] == "graded" and killed["passed"] == 0, killed
    else:
        assert killed["status"] == "zero" and "died" in killed["reason"], killed
    assert good["status"] == "graded" and good["passed"] == good["total"] == N01, good
    assert result.returncode == 1 and report["passed"] == N01
    assert report["total"] == N01 + len(REGISTRY["00_start_here"])


# --- one notebook no longer stops the whole folder -------------------------------------------

def _good_minimal(stem: str, target: Path) -> None:
    """A notebook of the solution's cells that define the answers (quick to run)."""
    solution = nbformat.read(SOLUTIONS / f"{stem}.ipynb", as_version=4)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch")] + [
        nbformat.v4.new_code_cell(c.source) for c in solution.cells
        if c.cell_type == "code" and "def my_" in c.source]
    nbformat.write(nb, target / f"{stem}.ipynb")


def test_failure_modes_cost_their_notebook_alone(tmp_path):
    """os._exit, exit(), a symbolic link, a file that is not JSON, a folder named like a notebook,
    a learner function raising KeyboardInterrupt and an endless loop past --timeout, each
    followed by a good notebook that is still graded."""
    shutil.copy(HOSTILE / "os_exit" / "00_start_here.ipynb", tmp_path)
    shutil.copy(SOLUTIONS / "01_gated_deltanet_recurrence.ipynb", tmp_path)
    shutil.copy(HOSTILE / "exit_call" / "02_chunked_prefill.ipynb", tmp_path)
    (tmp_path / "03_triton_kernels.ipynb").symlink_to(SOLUTIONS / "03_triton_kernels.ipynb")
    (tmp_path / "04_varlen_batches_and_conv.ipynb").write_text("this is not JSON {")
    _good_minimal("05_state_pool_and_prefix_cache", tmp_path)
    (tmp_path / "06_naive_tracking.ipynb").mkdir()
    shutil.copy(HOSTILE / "keyboard_interrupt" / "07_precomputed_indices.ipynb", tmp_path)
    shutil.copy(HOSTILE / "endless_loop" / "08_zero_syncs_and_graphs.ipynb", tmp_path)
    _good_minimal("09_profiling_the_bubbles", tmp_path)
    result, report = _grade(tmp_path, "--timeout", "20")
    assert result.returncode == 1, result.stderr[-3000:]
    by_file = {nb["file"]: nb for nb in report["notebooks"]}
    assert list(by_file) == sorted(by_file) and len(by_file) == 10

    def expect(stem, status, phrase=None, passed=0):
        nb = by_file[f"{stem}.ipynb"]
        passed = len(REGISTRY[stem]) if passed == "all" else passed
        assert nb["status"] == status and nb["passed"] == passed, nb
        if phrase:
            assert phrase in nb["reason"], nb["reason"]
        assert all(e["status"] == "pass" for e in nb["exercises"]) == (passed == nb["total"] > 0)

    expect("00_start_here", "zero", "died")
    expect("01_gated_deltanet_recurrence", "graded", passed="all")
    expect("02_chunked_prefill", "zero", "code cell 1 raised SystemExit")
    expect("03_triton_kernels", "refused", "03_triton_kernels.ipynb is a symbolic link")
    expect("04_varlen_batches_and_conv", "refused", "04_varlen_batches_and_conv.ipynb is not a JSON notebook")
    expect("05_state_pool_and_prefix_cache", "graded", passed="all")
    expect("06_naive_tracking", "refused", "06_naive_tracking.ipynb is not a regular file")
    expect("07_precomputed_indices", "zero", "KeyboardInterrupt")
    expect("08_zero_syncs_and_graphs", "zero", "longer than the timeout")
    expect("09_profiling_the_bubbles", "graded", passed="all")
    graded = ("01_gated_deltanet_recurrence", "05_state_pool_and_prefix_cache", "09_profiling_the_bubbles")
    assert report["passed"] == sum(len(REGISTRY[stem]) for stem in graded)
    assert report["total"] == sum(len(REGISTRY[Path(name).stem]) for name in by_file)  # the ten in the folder


def test_text_report_names_the_refused_file(tmp_path):
    (tmp_path / "01_gated_deltanet_recurrence.ipynb").write_text("not json")
    result, _ = _grade(tmp_path, json_report=False)
    assert result.returncode == 1
    assert "refused: 01_gated_deltanet_recurrence.ipynb is not a JSON notebook" in result.stdout
    assert f"score: 0/{N01} (0 %)" in result.stdout


# --- the sandbox ------------------------------------------------------------------------------

def test_sandbox_without_bubblewrap_is_refused_clearly(tmp_path):
    shutil.copy(SOLUTIONS / "01_gated_deltanet_recurrence.ipynb", tmp_path)
    bare = tmp_path / "bin"
    bare.mkdir()
    result, _ = _grade(tmp_path, "--sandbox", json_report=False, env={"PATH": str(bare)})
    assert result.returncode == 2 and "--sandbox needs bubblewrap (bwrap)" in result.stderr


@pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap (bwrap) is not installed or cannot make namespaces here")
def test_sandbox_keeps_the_file_system_and_hides_the_solutions(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    env = {"HOSTILE_TARGET": str(target)}
    for cheat in ("write_outside", "delete_solutions"):
        result, report = _grade(HOSTILE / cheat, "--sandbox", env=env)
        assert report["passed"] == 0 and report["sandbox"], report
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    _, report = _grade(HOSTILE / "exec_solutions", "--sandbox")
    assert report["passed"] == 0
    shutil.copy(SOLUTIONS / "01_gated_deltanet_recurrence.ipynb", tmp_path)
    _, report = _grade(tmp_path / "01_gated_deltanet_recurrence.ipynb", "--sandbox")
    assert report["passed"] == report["total"] == N01, report
