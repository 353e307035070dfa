#!/usr/bin/env python3
""""Open in Colab" links for the notebooks, from the repository's address in ``pyproject.toml``.

    .venv/bin/python scripts/colab_links.py           # write README.md's Colab block and the notebooks' tops
    .venv/bin/python scripts/colab_links.py --check   # exit 1 when either is not what this would write

It runs in the course's environment (``make setup``'s ``.venv``: Python >= 3.11 and nbformat);
another Python is told so in one line.

The address is set in one place, ``pyproject.toml``::

    [project.urls]
    Repository = "https://github.com/<owner>/<repo>"

From it this script writes

- into ``README.md``, between ``<!-- BEGIN colab -->`` and ``<!-- END colab -->``, one "Open in
  Colab" badge per notebook in ``notebooks/`` (branch ``main``);
- into every notebook, ``notebooks/*.ipynb`` and ``notebooks/solutions/*.ipynb``: the badge under
  the title of its first cell, and right after that cell the install cell (id ``colab-install``).
  Both are the same in a solution notebook and its learner copy (the badge opens the learner's
  version), so ``mamba_edu/exercises/stubs.py`` carries them over unchanged.

The install cell does nothing where ``import mamba_edu`` works (CI, ``make lab``). Where it fails,
in Colab it clones the repository (the notebooks read its ``data/``) and installs it; elsewhere it
prints what to run. Without an address there are no links: README.md says how to set one (the
install cell, which learners read, only says what to run). Cells whose source is already right keep their outputs.
``tests/project/test_colab.py`` runs ``--check``.
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BRANCH = "main"
BEGIN, END = "<!-- BEGIN colab -->", "<!-- END colab -->"
INSTALL_ID = "colab-install"
BADGE_SVG = "https://colab.research.google.com/assets/colab-badge.svg"
# The badge as with_badge puts it: after the heading line and a blank line.
BADGE_AFTER_HEAD = re.compile(r"\A([^\n]*)\n\n\[!\[Open In Colab\]\("
                              + re.escape(BADGE_SVG) + r"\)\]\([^)\n]*\)")
GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9][A-Za-z0-9-]*)/([A-Za-z0-9._-]+?)"
                    r"(?:\.git)?/?$")
RUN_IT = ".venv/bin/python scripts/colab_links.py"
SET_IT = f"set `[project.urls] Repository` in `pyproject.toml`, then run `{RUN_IT}`"


def repository(root: Path = ROOT) -> str | None:
    """``https://github.com/<owner>/<repo>`` from ``[project.urls] Repository``, or ``None`` when it
    is not set. Raises ``ValueError`` for an address Colab cannot open (not a GitHub repository)."""
    import tomllib

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    url = (project.get("urls") or {}).get("Repository")
    if not url:
        return None
    match = GITHUB.match(url.strip())
    if not match:
        raise ValueError(f"[project.urls] Repository = {url!r}: Colab opens notebooks from GitHub "
                         "only; expected https://github.com/<owner>/<repo>")
    return f"https://github.com/{match[1]}/{match[2]}"


def colab_url(repo: str, notebook: str) -> str:
    """Colab's address of ``notebook`` (a path inside the repository) on the branch ``main``."""
    owner_repo = repo.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{owner_repo}/blob/{BRANCH}/{notebook}"


def badge(repo: str, notebook: str) -> str:
    return f"[![Open In Colab]({BADGE_SVG})]({colab_url(repo, notebook)})"


def learner_notebooks(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob("*.ipynb"))


# --- README.md --------------------------------------------------------------------------------

def readme_block(repo: str | None, root: Path = ROOT) -> str:
    """What goes between the markers (markers included)."""
    if repo is None:
        body = (f"*Open in Colab*: no links yet, as the repository's address is not set: {SET_IT} "
                "([docs/install.md](docs/install.md#open-in-colab)).")
    else:
        rows = [f"| `{p.stem}` | {badge(repo, f'notebooks/{p.name}')} |"
                for p in learner_notebooks(root)]
        body = "\n".join(["Open a notebook in Google Colab (choose a GPU runtime: "
                          "[docs/install.md](docs/install.md#open-in-colab)):", "",
                          "| notebook | |", "|---|---|", *rows])
    return f"{BEGIN}\n{body}\n{END}"


def splice(text: str, block: str) -> str:
    """``text`` with its one Colab block replaced by ``block``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"README.md needs exactly one {BEGIN} and one {END}")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + block + text[end:]


# --- the notebooks ----------------------------------------------------------------------------

# The install cell, one source for every notebook. Learners read every line: keep it short.
INSTALL_NO_ADDRESS = """\
# Does nothing where mamba_edu is installed; otherwise says how to install it.
try:
    import mamba_edu
except ImportError:
    print("mamba_edu is not installed for this kernel: in a clone of the course run "
          "`pip install -e .` (or `make lab`), then restart the kernel.")"""

INSTALL = """\
# In Colab this installs the course; where mamba_edu is installed it does nothing.
import sys
try:
    import mamba_edu
except ImportError:
    if "google.colab" not in sys.modules:
        print("mamba_edu is not installed for this kernel: in a clone of {repo} "
              "run `pip install -e .` (docs/install.md), then restart the kernel.")
    else:  # a clone, not just the package: the notebooks read its data/
        get_ipython().system("git clone -q --depth 1 {repo} {folder}")
        get_ipython().run_line_magic("pip", 'install -q -e "{folder}[grade]"')
        sys.path.insert(0, "{folder}")  # this kernel started before the install"""


def install_source(repo: str | None) -> str:
    """The install cell's source (the same in every notebook)."""
    if repo is None:
        return INSTALL_NO_ADDRESS
    return INSTALL.format(repo=repo, folder="/content/" + repo.rsplit("/", 1)[1])


def with_badge(title: str, line: str | None) -> str:
    """The title cell's source with its badge (under the heading line) replaced, or removed when
    ``line`` is None."""
    title = BADGE_AFTER_HEAD.sub(r"\1", title, count=1)
    if line is None:
        return title
    head, sep, rest = title.partition("\n")
    return f"{head}\n\n{line}{sep}{rest}"


def update_notebook(nb, repo: str | None, name: str):
    """``nb`` (an ``nbformat`` node, changed in place and returned) with the badge in its first
    cell and the install cell after it. ``name``: the notebook's file name."""
    import nbformat

    title = nb.cells[0]
    if title.cell_type != "markdown":
        raise ValueError(f"{name}: the first cell is not the markdown title")
    title.source = with_badge(title.source, badge(repo, f"notebooks/{name}") if repo else None)
    source = install_source(repo)
    found = [i for i, c in enumerate(nb.cells) if c.get("id") == INSTALL_ID]
    cell = nb.cells.pop(found[0]) if found else nbformat.v4.new_code_cell(source)
    if cell.cell_type != "code" or cell.source != source:
        cell = nbformat.v4.new_code_cell(source)
    cell.id = INSTALL_ID
    nb.cells.insert(1, cell)
    return nb


def notebook_paths(root: Path = ROOT) -> list[Path]:
    return learner_notebooks(root) + sorted((root / "notebooks" / "solutions").glob("*.ipynb"))


def expected(root: Path = ROOT) -> dict[Path, str]:
    """Every file this script writes, with the text it would write."""
    import nbformat

    repo = repository(root)
    readme = root / "README.md"
    want = {readme: splice(readme.read_text(), readme_block(repo, root))}
    for path in notebook_paths(root):
        nb = update_notebook(nbformat.reads(path.read_text(encoding="utf-8"), as_version=4),
                             repo, path.name)
        want[path] = nbformat.writes(nb) + "\n"
    return want


def main(argv=None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/colab_links.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file is not what this script would write")
    args = parser.parse_args(argv)
    if missing := [m for m in ("tomllib", "nbformat") if importlib.util.find_spec(m) is None]:
        print(f"colab_links: this Python ({sys.executable}) lacks {', '.join(missing)}: run "
              f"{RUN_IT} (make setup makes .venv)", file=sys.stderr)
        return 2
    try:
        want = expected(root)
    except ValueError as err:
        print(f"colab_links: {err}", file=sys.stderr)
        return 2
    stale = [p for p, text in want.items() if p.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(root)} is out of date: run {RUN_IT}",
                  file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(want[path], encoding="utf-8")
        print(f"wrote {path.relative_to(root)}")
    if repository(root) is None:
        print(f"no address: {SET_IT.replace('`', '')} to get the links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
