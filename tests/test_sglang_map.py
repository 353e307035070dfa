"""docs/sglang.md, the concept -> SGLang map, is checkable: every row says whether it was verified
and on what source, every notebook says which SGLang it mirrors, and each section of notebooks
01, 02 and 04 points at an SGLang file that the map lists."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "docs" / "sglang.md"
SOLUTIONS = ROOT / "notebooks" / "solutions"
# Markdown is the same in both versions: a learner copy (no solutions/) checks its own notebooks.
MARKDOWN_SOURCE = SOLUTIONS if SOLUTIONS.is_dir() else SOLUTIONS.parent
STATUS = {"verified", "unverified"}


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    nxt = text.find("\n## ", start + 3)
    return text[start:] if nxt < 0 else text[start:nxt]


def _table(section: str) -> tuple[list[str], list[list[str]]]:
    """The first markdown table of a section: header cells and body rows (cells stripped)."""
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    split = [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in lines]
    return split[0], [r for r in split[2:]]


@pytest.fixture(scope="module")
def doc() -> str:
    return MAP.read_text()


@pytest.mark.parametrize("title, first, n", [("Kernels and model", "k1", 9), ("Serving concepts", "1", 17)])
def test_every_row_has_a_status_and_a_source(doc, title, first, n):
    header, rows = _table(_section(doc, title))
    assert "status" in header and "source" in header, header
    assert len(rows) == n and rows[0][0] == first
    status, source = header.index("status"), header.index("source")
    for row in rows:
        assert len(row) == len(header), row[:2]
        assert row[status] in STATUS, f"row {row[0]}: status {row[status]!r}"
        assert re.search(r"[A-Z]+\d|#\d+|config", row[source]), f"row {row[0]}: no source"


def test_serving_rows_put_the_pr_and_today_side_by_side(doc):
    header, rows = _table(_section(doc, "Serving concepts"))
    pr, today = header.index("SGLang at PR #20522"), header.index("SGLang today (since the PR)")
    for row in rows:
        assert row[pr] and row[today], row[0]
    by_number = {r[0]: r for r in rows}
    assert "max(" in by_number["5"][pr] and by_number["5"][header.index("status")] == "verified"
    assert ".item()" in by_number["6"][pr]
    assert "in place" in by_number["9"][pr]
    assert "#33515" in by_number["10"][pr]
    assert "init_forward_metadata" in by_number["13"][pr]
    assert all(k in by_number["16"][today] for k in ("--mamba-radix-cache-strategy", "extra_buffer_lazy", "auto"))


def test_each_notebook_says_which_sglang_it_mirrors(doc):
    header, rows = _table(_section(doc, "Which SGLang each notebook mirrors"))
    assert [r[0][:2] for r in rows] == [f"{i:02d}" for i in range(10)]
    assert all(r[1] for r in rows)


def test_sync_counts_are_tracking_syncs_and_the_others_are_apart(doc):
    syncs = _section(doc, "How many syncs")
    assert "tracking syncs" in syncs
    assert "prepare_chunk_indices" in syncs and ".tolist()" in syncs
    assert "per request" in syncs and ".item()" in syncs
    for count in ("144", "146", "11", "13", "10"):
        assert f"**{count}**" in syncs, count


def test_since_the_pr_names_the_changes(doc):
    since = _section(doc, "Since the PR")
    for ref in ("#13081", "#16331", "#19102", "#35851", "#29734", "#29735", "#27418", "#27118",
                "#39430", "#32589", "#24221", "#29792", "#37836", "#33515"):
        assert ref in since, ref


def _markdown(nb: Path) -> str:
    cells = json.loads(nb.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _numbered_sections(text: str) -> dict[str, str]:
    """'## N. title' sections, and notebook 03's part B '## BN. title' (its part A teaches Triton
    itself, with no SGLang counterpart); exercises excluded; each up to the next '## ' heading."""
    parts = re.split(r"(?m)^(## .*)$", text)
    out = {}
    for head, body in zip(parts[1::2], parts[2::2]):
        if re.match(r"## B?\d+\.", head) and "Exercises" not in head:
            out[head] = body
    return out


@pytest.mark.parametrize("number", ["01", "02", "03", "04"])
def test_each_section_points_at_a_file_in_the_map(doc, number):
    nb = next(MARKDOWN_SOURCE.glob(f"{number}_*.ipynb"))
    sections = _numbered_sections(_markdown(nb))
    assert sections
    for head, body in sections.items():
        pointer = next((ln for ln in body.splitlines() if ln.startswith("**In SGLang")), None)
        assert pointer, f"{nb.name}: {head}: no '**In SGLang:**' line"
        files = re.findall(r"`([\w/]+\.py)`", pointer)
        assert files, f"{nb.name}: {head}: the pointer names no file"
        for f in files:
            assert f"`{f}`" in doc or f.split("/")[-1] in doc, f"{nb.name}: {head}: {f} is not in docs/sglang.md"


@pytest.mark.parametrize("number", ["06", "07", "08"])
def test_serving_notebooks_name_their_sglang_version_and_say_tracking_syncs(number):
    for folder in dict.fromkeys((MARKDOWN_SOURCE, SOLUTIONS.parent)):
        nb = next(folder.glob(f"{number}_*.ipynb"))
        text = _markdown(nb)
        assert "**SGLang version.**" in text, nb
        assert "tracking syncs" in text, nb
