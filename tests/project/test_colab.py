"""One click to Colab (issue 37, item 5): scripts/colab_links.py and the install cell it puts at
the top of every notebook. Fast: no kernel, no notebook is executed. A fake address is only ever
written into a temporary copy of pyproject.toml, never into the real one."""
from __future__ import annotations

import builtins
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # the notebook tests need it; a bare GPU machine lacks it

from mamba_edu.exercises.stubs import learner_notebook

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "colab_links.py"
NOTEBOOKS = ROOT / "notebooks"
FAKE = "https://github.com/example-owner/example-repo"


def _script():
    spec = importlib.util.spec_from_file_location("colab_links", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cl = _script()


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _install_cell(nb):
    cells = [c for c in nb.cells if c.get("id") == cl.INSTALL_ID]
    assert len(cells) == 1 and nb.cells[1] is cells[0], "the install cell is the second cell"
    assert cells[0].cell_type == "code"
    return cells[0]


def _run_cell(source: str, *, importable: bool, colab: bool):
    """Run the install cell's source as a kernel would, with ``import mamba_edu`` working or not
    and in Colab or not. Returns what it called on ``get_ipython()`` and what it printed."""
    calls, printed = [], []

    class Shell:
        def system(self, command):
            calls.append(("system", command))

        def run_line_magic(self, magic, line):
            calls.append((magic, line))

    def get_ipython():
        if importable:
            raise AssertionError("the install cell used IPython where mamba_edu imports")
        return Shell()

    def fake_import(name, *args, **kwargs):
        if name == "mamba_edu" and not importable:
            raise ModuleNotFoundError("No module named 'mamba_edu'")
        return builtins.__import__(name, *args, **kwargs)

    modules = dict(sys.modules)
    if colab:
        modules["google.colab"] = object()
    else:
        modules.pop("google.colab", None)
    fake_sys = type("FakeSys", (), {"modules": modules, "path": []})()

    def imports(name, *args, **kwargs):
        return fake_sys if name == "sys" else fake_import(name, *args, **kwargs)

    namespace = {"__builtins__": {**vars(builtins), "__import__": imports,
                                  "print": lambda *a, **k: printed.append(" ".join(map(str, a)))},
                 "get_ipython": get_ipython}
    exec(compile(source, "<install cell>", "exec"), namespace)
    return calls, "\n".join(printed), fake_sys.path


# --- the committed notebooks and README -------------------------------------------------------

def test_check_mode_passes():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_install_cell_is_the_same_everywhere_and_is_what_the_script_writes():
    paths = cl.notebook_paths()
    assert len(paths) >= 12
    want = cl.install_source(cl.repository())
    for path in paths:
        assert _install_cell(_read(path)).source == want, path


@pytest.mark.solutions
def test_stubs_carry_the_top_cells_unchanged():
    """The learner's copy made from a solution keeps the title (with its badge, if any) and the
    install cell as they are."""
    for solution in sorted((NOTEBOOKS / "solutions").glob("*.ipynb")):
        made = learner_notebook(_read(solution))
        committed = _read(NOTEBOOKS / solution.name)
        for i in (0, 1):
            assert (made.cells[i].id, made.cells[i].source) == \
                   (committed.cells[i].id, committed.cells[i].source), (solution.name, i)


def test_install_cell_does_nothing_where_mamba_edu_imports():
    for source in (cl.install_source(cl.repository()), cl.install_source(None),
                   cl.install_source(FAKE)):
        for colab in (False, True):
            calls, printed, path = _run_cell(source, importable=True, colab=colab)
            assert calls == [] and printed == "" and path == []


@pytest.mark.parametrize("repo", [None, FAKE])
def test_install_cell_outside_colab_says_what_to_run_and_installs_nothing(repo):
    calls, printed, path = _run_cell(cl.install_source(repo), importable=False, colab=False)
    assert calls == [] and path == []
    assert "mamba_edu is not installed" in printed and "pip install -e ." in printed
    if repo is None:  # learners read it: what to run, and nothing for maintainers
        assert "pyproject" not in printed and "colab_links" not in printed
    else:
        assert repo in printed


def test_install_cell_in_colab_clones_and_installs():
    calls, printed, path = _run_cell(cl.install_source(FAKE), importable=False, colab=True)
    assert calls == [("system", f"git clone -q --depth 1 {FAKE} /content/example-repo"),
                     ("pip", 'install -q -e "/content/example-repo[grade]"')]
    assert path == ["/content/example-repo"] and printed == ""


def test_install_cell_in_colab_without_an_address_says_what_to_run():
    calls, printed, _ = _run_cell(cl.install_source(None), importable=False, colab=True)
    assert calls == [] and "pip install -e ." in printed and "pyproject" not in printed


def test_readme_links_match_the_notebooks():
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(cl.BEGIN):readme.index(cl.END)]
    links = re.findall(r"\(https://colab\.research\.google\.com/github/([^)]*)\)", block)
    repo = cl.repository()
    if repo is None:
        assert links == [] and "set `[project.urls] Repository` in `pyproject.toml`" in block
        assert "python scripts/colab_links.py" in block
        for path in cl.notebook_paths():
            assert "colab.research.google.com" not in _read(path).cells[0].source, path
    else:
        owner_repo = repo.removeprefix("https://github.com/")
        assert links == [f"{owner_repo}/blob/main/notebooks/{p.name}" for p in cl.learner_notebooks()]


# --- with a fake address, in a temporary copy -------------------------------------------------

@pytest.fixture
def copy_with_address(tmp_path):
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(NOTEBOOKS, tmp_path / "notebooks",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "out"))
    text = (ROOT / "pyproject.toml").read_text()
    assert "\n[project.urls]\n" in text
    (tmp_path / "pyproject.toml").write_text(
        text.replace("\n[project.urls]\n", f'\n[project.urls]\nRepository = "{FAKE}.git"\n', 1))
    return tmp_path


def test_a_fake_address_gives_one_link_per_notebook(copy_with_address):
    root = copy_with_address
    assert cl.repository(root) == FAKE
    assert cl.main(["--check"], root=root) == 1  # the committed files have no links
    assert cl.main([], root=root) == 0
    assert cl.main(["--check"], root=root) == 0

    readme = (root / "README.md").read_text()
    block = readme[readme.index(cl.BEGIN):readme.index(cl.END)]
    links = re.findall(r"\]\((https://colab\.research\.google\.com/github/[^)]*)\)", block)
    names = sorted(p.name for p in (root / "notebooks").glob("*.ipynb"))
    assert links == [f"https://colab.research.google.com/github/example-owner/example-repo/blob/"
                     f"main/notebooks/{name}" for name in names]
    assert cl.splice(readme, "") == cl.splice((ROOT / "README.md").read_text(), "")  # only the block

    for path in cl.notebook_paths(root):
        nb = _read(path)
        title = nb.cells[0].source
        url = f"https://colab.research.google.com/github/example-owner/example-repo/blob/main/notebooks/{path.name}"
        assert title.split("\n")[2] == f"[![Open In Colab]({cl.BADGE_SVG})]({url})", path.name
        assert title.startswith("# ") and FAKE in _install_cell(nb).source
    for solution in sorted((root / "notebooks" / "solutions").glob("*.ipynb")):
        made = learner_notebook(_read(solution))
        learner = _read(root / "notebooks" / solution.name)
        assert [c.source for c in made.cells[:2]] == [c.source for c in learner.cells[:2]]


def test_removing_the_address_restores_the_committed_files(copy_with_address):
    root = copy_with_address
    assert cl.main([], root=root) == 0
    (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    assert cl.main([], root=root) == 0
    assert (root / "README.md").read_text() == (ROOT / "README.md").read_text()
    for path in cl.notebook_paths():
        cells = lambda nb: [(c.id, c.cell_type, c.source) for c in nb.cells]  # noqa: E731
        assert cells(_read(root / path.relative_to(ROOT))) == cells(_read(path)), path.name


def test_an_address_colab_cannot_open_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.urls]\nRepository = "https://gitlab.com/a/b"\n')
    with pytest.raises(ValueError, match="GitHub"):
        cl.repository(tmp_path)
