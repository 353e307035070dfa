"""docs/results.md and README's headline block are generated from data/ and kept up to date;
every file in data/ is read by something (a notebook, a doc, the results generator or a test)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
SCRIPT = ROOT / "scripts" / "make_results.py"
pytestmark = pytest.mark.skipif(not (DATA / "bench" / "results.json").exists(),
                                reason="data/ is not in this checkout")


def _generator():
    spec = importlib.util.spec_from_file_location("make_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_up_to_date():
    gen = _generator()
    assert (ROOT / "docs" / "results.md").read_text() == gen.results_md(), (
        "docs/results.md is out of date with data/: run python scripts/make_results.py")


def test_readme_headline_block_is_up_to_date():
    gen = _generator()
    readme = (ROOT / "README.md").read_text()
    assert readme.count(gen.BEGIN) == 1 and readme.count(gen.END) == 1
    assert gen.splice(readme, gen.readme_block()) == readme, (
        "README.md's headline block is out of date with data/: run python scripts/make_results.py")


def test_check_mode_exits_zero_when_up_to_date():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch):
    gen = _generator()
    stale = tmp_path / "results.md"
    stale.write_text(gen.results_md().replace("| naive |", "| naive (edited) |", 1))
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    monkeypatch.setattr(gen, "RESULTS_MD", stale)
    monkeypatch.setattr(gen, "README", readme)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1


def test_every_results_json_has_its_provenance():
    """Each field is recorded by the file, or in data/provenance.json, or shown as not recorded;
    the manifest only fills fields the file lacks and says where each value comes from."""
    gen = _generator()
    manifest = gen.manifest()
    for path in sorted(DATA.rglob("*.json")):
        rel = path.relative_to(DATA).as_posix()
        if rel == "provenance.json":
            continue
        prov, filled = gen.provenance(rel)
        assert set(prov) == set(gen.FIELDS)
        assert prov["device"] != gen.NOT, f"{rel}: no device"
        if filled:
            assert manifest[rel].get("source"), f"data/provenance.json: {rel} gives no source"
    for rel in manifest:
        assert (DATA / rel).exists(), f"data/provenance.json names a missing file: {rel}"


def _readers() -> str:
    texts = [SCRIPT.read_text(), (ROOT / "docs" / "results.md").read_text()]
    for folder, pattern in (("notebooks", "**/*.ipynb"), ("docs", "*.md"), ("tests", "*.py")):
        texts += [p.read_text() for p in sorted((ROOT / folder).glob(pattern))]
    return "\n".join(texts)


def test_every_data_file_is_read_by_something():
    readers = _readers()
    unread = []
    for path in sorted(p for p in DATA.rglob("*") if p.is_file()):
        rel = path.relative_to(DATA).as_posix()
        if rel == "README.md":
            continue
        if f"data/{rel}" not in readers and rel not in readers:
            unread.append(rel)
    assert not unread, ("files in data/ that no notebook, doc, test or the results generator reads "
                        f"(use them or remove them): {unread}")
