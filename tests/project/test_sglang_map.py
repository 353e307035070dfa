"""docs/sglang.md, the concept -> SGLang map, is checkable: every row says whether it was verified
and on what source and puts the PR era beside SGLang now, every notebook says which SGLang it
mirrors, each section of notebooks 01-04 points at an SGLang file that the map lists, and every
SGLang path a notebook's "In SGLang" text names is in the names table (old -> new), today's in its
"now" column and a bracketed PR-era name in its "PR era" column."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


PR_ERA, NOW = "PR era (#20522)", "SGLang now"


@pytest.mark.parametrize("title", ["Kernels and model", "Serving concepts"])
def test_rows_put_the_pr_era_and_now_side_by_side(doc, title):
    header, rows = _table(_section(doc, title))
    pr, now = header.index(PR_ERA), header.index(NOW)
    for row in rows:
        assert row[pr] and row[now], row[0]


def test_serving_rows_put_the_pr_and_today_side_by_side(doc):
    header, rows = _table(_section(doc, "Serving concepts"))
    pr, today = header.index(PR_ERA), header.index(NOW)
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
    # FLA's chunk table: 2 syncs per forward in the PR era, 1 now on fla's Triton path, none on
    # FlashInfer's default prefill, whose checkpoint plan copies 4 tensors instead.
    header, rows = _table(syncs)
    fla = next(r for r in rows if "prepare_chunk_indices" in r[0])
    assert [fla[header.index(h)] for h in header if h.startswith("PR era")] == ["2", "2"], fla
    assert fla[header.index(NOW_TRITON)].startswith("**1**"), fla
    assert fla[header.index(NOW_FLASHINFER)].startswith("0"), fla
    plan = next(r for r in rows if "FlashInfer checkpoint plan" in r[0])
    assert plan[header.index(NOW_FLASHINFER)].startswith("**4**") and plan[header.index(NOW_TRITON)] == "0", plan


NOW_TRITON = "SGLang now: fla's Triton path (fallback)"
NOW_FLASHINFER = "SGLang now: FlashInfer (default on H100/H200)"


def test_every_sync_names_its_file_and_function(doc):
    """Each sync site of the table says where it is in SGLang now: a file and a function."""
    header, rows = _table(_section(doc, "How many syncs"))
    where = header.index("where in SGLang now (file, function)")
    for row in rows:
        if row[where] == "as above" or row[where] == "the rows above":
            continue
        assert re.search(r"`[\w/]+\.py`", row[where]) and re.search(r"`[\w.]+`", row[where]), row[0]


def test_the_default_gdn_prefill_is_flashinfer(doc):
    """§14.1 (1): on H100/H200 with an fp32 pool SGLang's default GDN prefill is FlashInfer's, and the
    default tracked prefill pays its checkpoint plan's four copies."""
    kernels = _section(doc, "Kernels and model")
    assert "flashinfer_gdn_prefill_default" in kernels and "#36357" in kernels
    syncs = _section(doc, "How many syncs")
    assert "default" in syncs and "four copies" in syncs
    for nb in ("09",):
        text = _cells_markdown(_learner_notebook(nb))
        assert "flashinfer_gdn_prefill_default" in text and "maybe_build_flashinfer_checkpoint_plan" in text


def test_stale_statements_are_gone(doc):
    """§14.1 (2)-(5): no "only at the tracked boundaries", no bf16 checkpoints "today", no "`fused`
    goes past SGLang", no #37836 as a page-size fix, in the doc or any notebook."""
    stale = ("only at the tracked boundaries", "only at tracked boundaries", "fused` goes past SGLang",
             "The `fused` strategy goes past SGLang", "Checkpoints in bf16\n", "the Mamba2 counterpart fixed in #37836")
    texts = {"docs/sglang.md": doc}
    for folder in dict.fromkeys((MARKDOWN_SOURCE, SOLUTIONS.parent)):
        for nb in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
            texts[str(nb.relative_to(ROOT))] = _cells_markdown(nb)
    for name, text in texts.items():
        for phrase in stale:
            assert phrase not in text, f"{name}: {phrase!r}"
    assert "#34820" in _section(doc, "Checkpoints: bf16 at the PR, fp32 since #34820")
    assert "kda_prefill_graph.py" in _section(doc, "Since the PR") and "#1155" in _section(doc, "Since the PR")


def test_the_now_column_names_its_versions(doc):
    """SGLang now is dated, and each file read for it is named with its commit or as a code-search
    excerpt."""
    read = _section(doc, "What was read")
    assert "2026-09-19" in read and "#40313" in read
    header, rows = [], []
    for table in read.split("\n\n"):
        if table.startswith("| tag") and "N1" in table:
            header, rows = _table(table)
    tags = [r[0] for r in rows]
    assert tags[:16] == [f"N{i}" for i in range(1, 17)], tags
    version = header.index("version read")
    for row in rows[:16]:
        assert re.search(r"commit `[0-9a-f]{12}`|CS", row[version]), row[0]


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


# --- the names table and the notebooks' "In SGLang" pointers -------------------------------------

NAMED_IN = ["01", "02", "03", "04", "05", "06", "07", "10", "11"]
SGLANG_PATH = re.compile(r"`((?:python/sglang/)?[\w./]+\.py)`")
PR_ERA_BRACKET = re.compile(r"\[PR era:([^\]]*)\]")
NOT_SGLANG = ("mamba_edu/", "fla/ops/", "scripts/", "tests/", "docs/")


def _paths(text: str) -> set[str]:
    """SGLang paths in backticks, relative to python/sglang/ (course and FLA-repo paths left out)."""
    found = {p.removeprefix("python/sglang/") for p in SGLANG_PATH.findall(text)}
    return {p for p in found if not p.startswith(NOT_SGLANG)}


def _names_table(doc: str) -> tuple[set[str], set[str]]:
    header, rows = _table(_section(doc, "Names: PR era"))
    pr, now = header.index(PR_ERA), header.index(NOW)
    return (set().union(*(_paths(r[pr]) for r in rows)), set().union(*(_paths(r[now]) for r in rows)))


def _in_sglang_paragraphs(text: str) -> list[str]:
    """The paragraphs that point into SGLang: those starting with "In SGLang" (bold or not) and
    every paragraph of a "## In SGLang" section."""
    out, in_section = [], False
    for para in re.split(r"\n\s*\n", text):
        head = para.lstrip()
        if head.startswith("#"):
            in_section = head.startswith("## In SGLang")
        if in_section or head.startswith(("**In SGLang", "In SGLang")):
            out.append(para)
    return out


def _learner_notebook(number: str) -> Path:
    return next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))


def _cells_markdown(nb: Path) -> str:
    """The markdown cells with a blank line between them, so that a cell's heading starts a paragraph."""
    cells = json.loads(nb.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_the_names_table_maps_every_moved_kernel_file(doc):
    pr_era, now = _names_table(doc)
    assert "kernels/ops/attention/fla/chunk.py" in now and "srt/layers/attention/fla/chunk.py" in pr_era
    assert "kernels/ops/mamba/causal_conv1d_triton.py" in now
    assert "srt/mem_cache/mamba_radix_cache.py" in pr_era and "srt/mem_cache/mamba_radix_cache.py" not in now
    assert "srt/mem_cache/unified_cache/components/mamba.py" in now
    assert not {p for p in now if p.startswith("srt/layers/attention/fla/")}, "a dead kernel path in the now column"


def test_every_sglang_path_a_notebook_names_is_in_the_names_table(doc):
    """Every SGLang path on a notebook's "In SGLang" text is today's (the table's "now" column, which
    lists files that did not move under both columns); a PR-era name is allowed only in a
    "[PR era: ...]" bracket, and must be in the "PR era" column."""
    pr_era, now = _names_table(doc)
    seen = 0
    for number in NAMED_IN:
        nb = _learner_notebook(number)
        for para in _in_sglang_paragraphs(_cells_markdown(nb)):
            for bracket in PR_ERA_BRACKET.findall(para):
                for path in _paths(bracket):
                    assert path in pr_era, f"{nb.name}: PR-era {path} is not in the names table"
                    seen += 1
            for path in _paths(PR_ERA_BRACKET.sub("", para)):
                assert path in now, f"{nb.name}: {path} is not a path of SGLang now in the names table"
                seen += 1
    assert seen >= 40, seen


@pytest.mark.parametrize("number", ["03", "04"])
def test_fla_syncs_agree_between_notebooks_03_and_04(number):
    """1 host sync per forward for FLA's chunk table today, 2 in the PR era, in both notebooks."""
    text = _cells_markdown(_learner_notebook(number))
    pointer = next(p for p in _in_sglang_paragraphs(text) if "prepare_chunk_indices" in p)
    assert "1 host sync" in pointer and ("2 in the PR era" in pointer or "In the PR era it was 2" in pointer), pointer


# --- the rows re-checked for issue 40 -------------------------------------------------------------

RECHECKED = ("4", "6", "7", "8", "10", "11", "12")


def test_rechecked_rows_are_dated_and_name_their_versions(doc):
    """Rows re-checked against SGLang now carry the date and an N tag; every N tag of "What was read"
    names a commit or says it is a code-search excerpt."""
    header, rows = _table(_section(doc, "Serving concepts"))
    by_number = {r[0]: r for r in rows}
    source = header.index("source")
    for n in RECHECKED:
        assert re.search(r"re-checked \d{4}-\d{2}-\d{2}", by_number[n][source]), n
        assert re.search(r"\bN\d+\b", by_number[n][source]), n
    read = _section(doc, "What was read")
    tags = re.findall(r"(?m)^\| (N\d+) \| [^|]+\| ([^|]+)\|", read)
    assert [t for t, _ in tags] == [f"N{i}" for i in range(1, len(tags) + 1)] and len(tags) >= 23
    for tag, version in tags:
        assert re.search(r"commit `[0-9a-f]{12}`|CS", version), tag


def test_row_10_pr_era_indexes_h_by_the_kernel_chunk(doc):
    """At #20522, `h` was indexed in 64-token units (FLA_CHUNK_SIZE); the cache-chunk unit came with
    #15829. The now column says what could not be verified."""
    header, rows = _table(_section(doc, "Serving concepts"))
    row = {r[0]: r for r in rows}["10"]
    pr, now = row[header.index(PR_ERA)], row[header.index(NOW)]
    assert "L // 64" in pr and "FLA_CHUNK_SIZE" in pr and "#15829" in pr
    assert "L // Cc" not in pr
    assert "Not verified" in now or row[header.index("status")] == "verified"


def test_the_now_column_claims_no_fork_only_names(doc):
    """`MambaTrackPlan` / `build_mamba_track_plan` were found only in a fork: no "SGLang now" cell may
    present them as SGLang's."""
    for title in ("Serving concepts", "Names: PR era"):
        header, rows = _table(_section(doc, title))
        now = header.index(NOW)
        for r in rows:
            assert "MambaTrackPlan" not in r[now] and "build_mamba_track_plan" not in r[now], r[0]


def test_the_sync_table_names_the_two_newer_syncs(doc):
    syncs = _section(doc, "How many syncs")
    header, rows = _table(syncs)
    sites = [r[0] for r in rows]
    assert any("logical token count" in s for s in sites), sites
    assert any("FlashInfer checkpoint plan" in s for s in sites), sites
    assert "maybe_build_flashinfer_checkpoint_plan" in syncs and "query_start_loc[-1]" in syncs


# --- names marked gone, and what SGLang has that the course does not build ------------------------

def _gone(doc: str) -> list[str]:
    """The names of the names table's "Gone" list (the first backticked name of each row)."""
    names_section = _section(doc, "Names: PR era")
    block = names_section[names_section.index("**Gone.**"):]
    _, rows = _table(block)
    return [re.findall(r"`([^`]+)`", r[0])[0] for r in rows]


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w/]){re.escape(name)}(?![\w])", text) is not None


def test_no_notebook_or_doc_names_a_gone_name(doc):
    """A name the names table marks as gone may appear only in "What was read" (a record of what a
    version held) and in the names table; never in a notebook (any cell, learner or solution)."""
    gone = _gone(doc)
    assert "srt/mem_cache/unified_cache_components/mamba_component.py" in gone and "finalize_match_result" in gone
    allowed = {"What was read", "Names: PR era"}
    parts = re.split(r"(?m)^(## .*)$", doc)
    for head, body in zip(parts[1::2], parts[2::2]):
        if any(head.startswith(f"## {a}") for a in allowed):
            continue
        for name in gone:
            assert not _mentions(body, name), f"docs/sglang.md {head}: {name} is marked gone"
    # the "now" column of the names table itself
    header, rows = _table(_section(doc, "Names: PR era"))
    now = header.index(NOW)
    for r in rows:
        for name in gone:
            assert not _mentions(r[now], name), f"names table, row {r[0]}: {name} is marked gone"
    for folder in dict.fromkeys((SOLUTIONS, SOLUTIONS.parent)):
        for nb in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
            cells = json.loads(nb.read_text())["cells"]
            text = "\n".join("".join(c["source"]) for c in cells)
            for name in gone:
                assert not _mentions(text, name), f"{nb.relative_to(ROOT)}: {name} is marked gone"


FLAGS = ("--linear-attn-prefill-backend", "--enable-int8-mamba-checkpoint", "--mamba-max-states-per-path",
         "extra_buffer_lazy", "--enable-linear-replayssm", "--chunked-prefill-size", "--mamba-radix-cache-strategy")


def test_the_doc_says_what_sglang_has_beyond_the_course(doc):
    beyond = _section(doc, "What SGLang has since #20522")
    for ref in FLAGS + ("#31487", "#27220", "HiCache", "flashinfer_gdn_prefill_default", "extra_buffer"):
        assert ref in beyond, ref
    assert "(not verified)" in beyond   # a flag named only in a thread is marked so


# --- the numbers notebooks 08 and 12 print come from the README's data file --------------------

BUCKETS = ROOT / "data" / "bench" / "buckets" / "results.json"


def _outputs(nb: Path, cell_id: str) -> str:
    cell = next(c for c in json.loads(nb.read_text())["cells"] if c.get("id") == cell_id)
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


def test_the_readme_table_and_the_notebooks_read_the_same_run():
    """scripts/make_results.py builds the README's table from data/bench/buckets/; notebooks 08 and 12
    load that same file."""
    make = (ROOT / "scripts" / "make_results.py").read_text()
    assert 'BUCKETS = "bench/buckets/results.json"' in make
    assert re.search(r"^    main = BUCKETS$", make, re.M)
    for number, cell_id in (("08", "ae8273f8"), ("12", "d6e35851")):
        nb = next(SOLUTIONS.parent.glob(f"{number}_*.ipynb"))  # the learner's: in every copy
        source = "".join(next(c for c in json.loads(nb.read_text())["cells"] if c.get("id") == cell_id)["source"])
        assert '"buckets" / "results.json"' in source, nb.name


@pytest.mark.parametrize("folder", [pytest.param(SOLUTIONS, marks=pytest.mark.solutions), SOLUTIONS.parent],
                         ids=["solution", "learner"])
def test_notebook_08_prints_the_readme_runs_numbers(folder):
    rows = json.loads(BUCKETS.read_text())["rows"]
    printed = _outputs(next(folder.glob("08_*.ipynb")), "ae8273f8")
    case, seen = None, 0
    for line in printed.splitlines():
        head = re.match(r"(\w+) \(", line)
        if head:
            case = head.group(1)
            continue
        m = re.match(r"\s+(\w+)(?: \+ (\w+))?\s+TTFT\s+([\d.]+) ±\s+([\d.]+) ms(?:\s+host\s+([\d.]+) ms)?", line)
        if not m:
            continue
        strategy, mode = m.group(1), m.group(2) or "eager"
        row = next(r for r in rows if (r["case"], r["strategy"], r["mode"]) == (case, strategy, mode))
        assert m.group(3) == f"{row['ttft_ms']:.2f}" and m.group(4) == f"{row['spread_ms']:.2f}", line
        if m.group(5):
            assert m.group(5) == f"{row['host_ms']:.2f}", line
        seen += 1
    assert seen >= 20, printed


def test_notebook_12_prints_the_readme_runs_numbers():
    rows = json.loads(BUCKETS.read_text())["rows"]
    printed = _outputs(next(SOLUTIONS.parent.glob("12_*.ipynb")), "e7f35851")
    seen = 0
    for line in printed.splitlines():
        m = re.match(r"(\w+)\s+(\w+)\s+(eager|breakable|gdn_inside|graph)\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            row = next(r for r in rows if (r["case"], r["strategy"], r["mode"]) == m.group(1, 2, 3))
            assert m.group(4) == f"{row['ttft_ms']:.2f}" and m.group(5) == f"{row['spread_ms']:.2f}", line
            seen += 1
    assert seen >= 30, printed
