"""Statements that cannot get lost (issue 28, item 5).

- Every exercise stub of every learner notebook comes after its statement: the last markdown cell
  before the stub's cell says "Exercise N", N being the exercise that the check cell after the
  stub checks, and no other check cell lies between that statement and the stub.
- Every "section N" a notebook cites exists in that notebook (or in the notebook the sentence
  names: "notebook 02 (section 5)").
- That the learner and solution notebooks differ only inside solution blocks is tested by
  tests/exercises/test_exercises_core.py (test_learner_notebook_is_the_stripped_solution).
"""

import json
import re
from pathlib import Path

import pytest

from mamba_edu.exercises import core

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LEARNER = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
ALL = LEARNER + sorted((NOTEBOOKS / "solutions").glob("[0-9][0-9]_*.ipynb"))
CHECK = re.compile(r"exercises\.check\(\s*(\d+)\s*,")
STUB = "raise NotImplementedError("


def _cells(path: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def _rel(path: Path) -> str:
    return str(path.relative_to(NOTEBOOKS))


@pytest.mark.parametrize("path", LEARNER, ids=[p.stem for p in LEARNER])
def test_every_stub_follows_its_statement(path):
    cells = _cells(path)
    registered = sorted(core.REGISTRY.get(path.stem, {}))
    stubbed = []
    for i, (kind, source) in enumerate(cells):
        if kind != "code" or STUB not in source:
            continue
        after = next((int(m.group(1)) for _, s in cells[i:] for m in [CHECK.search(s)] if m), None)
        assert after is not None, f"{_rel(path)} cell {i}: a stub with no check cell after it"
        stubbed.append(after)
        statement = None
        for j in range(i - 1, -1, -1):
            kind_j, source_j = cells[j]
            if kind_j == "markdown":
                statement = (j, source_j)
                break
            assert not CHECK.search(source_j), (
                f"{_rel(path)} cell {i}: the stub of exercise {after} follows the check cell {j} of "
                "another exercise with no statement between them")
        assert statement is not None and re.search(rf"\bExercise {after}\b", statement[1]), (
            f"{_rel(path)} cell {i}: the stub of exercise {after} is not preceded by its statement "
            f"(the markdown before it, cell {statement and statement[0]}, does not say 'Exercise {after}')")
    assert sorted(set(stubbed)) == registered, (
        f"{_rel(path)}: stubs for exercises {sorted(set(stubbed))}, registered {registered}")


def _sections(path: Path) -> set[str]:
    """The numbers of a notebook's section headings: '## 5. Grouped …' -> '5', '## B4. …' -> 'B4'."""
    heads = set()
    for kind, source in _cells(path):
        if kind == "markdown":
            heads |= {m.group(1) for m in re.finditer(r"^#+\s+(?:Part\s+)?([A-Z]?\d+)\b", source, re.M)}
    return heads


CITE = re.compile(r"\b[Ss]ections?\s+([A-Z]?\d+)(?:\s*(?:[–-]|and|or)\s*([A-Z]?\d+))?")


def _citations(path: Path):
    """``(cell, target notebook stem, section)`` for every "section N" a notebook's cells cite."""
    stems = {p.stem[:2]: p.stem for p in LEARNER}
    for i, (_, source) in enumerate(_cells(path)):
        for m in CITE.finditer(source):
            before = source[max(0, m.start() - 40):m.start()]
            if re.search(r"\.md\)?\)?,?\s*$", before):
                continue  # "[docs/conventions.md](…), section 7": a section of a document
            other = re.search(r"[Nn]otebook (\d\d)\s*\(\s*$", before)
            target = stems.get(other.group(1), path.stem) if other else path.stem
            for section in filter(None, m.groups()):
                yield i, target, section


@pytest.mark.parametrize("path", ALL, ids=[_rel(p) for p in ALL])
def test_every_cited_section_exists(path):
    missing = []
    for cell, target, section in _citations(path):
        where = path if target == path.stem else NOTEBOOKS / f"{target}.ipynb"
        if section not in _sections(where):
            missing.append(f"cell {cell} cites section {section} of {target}")
    assert not missing, f"{_rel(path)}: " + "; ".join(missing)


def test_teaching_guide_lists_every_exercise():
    """docs/teaching.md's table of exercises names every registered exercise, its functions and
    what it forbids beyond the checks' modules, and nothing else."""
    text = (ROOT / "docs" / "teaching.md").read_text()
    rows = re.findall(r"^\| (\d\d)·(\d+) \| `([^`]*)` \| [^|]+ \| ([^|]+) \|$", text, re.M)
    listed = {(nb, int(n)): (names, sorted(re.findall(r"`([^`]+)`", forbidden))) for nb, n, names, forbidden in rows}
    registered = {
        (notebook[:2], number): (", ".join(ex.names),
                                 sorted(f for f in ex.forbidden if f not in core.ALWAYS_FORBIDDEN))
        for notebook, exercises in core.REGISTRY.items() for number, ex in exercises.items()}
    assert listed == registered
    total = sum(len(exercises) for exercises in core.REGISTRY.values())
    assert f"{total} exercises in eleven notebooks" in text
