"""What a learner installs: the wheel (the package, typed, its metadata with platform markers and
extras), the sdist (everything its own tests read), the pinned set against pyproject.toml and
environment.yml, and `make setup`'s early error on an old Python. Offline: builds run with the
setuptools of this environment, in a temporary copy of the source."""

import email
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import mamba_edu

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(mamba_edu.__file__).resolve().parent
in_checkout = pytest.mark.skipif(not (REPO / "pyproject.toml").exists(),
                                 reason="no pyproject.toml: not a source checkout")
SKIP = shutil.ignore_patterns(".git", ".venv", "out", "build", "dist", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".hypothesis", ".ipynb_checkpoints")


def pinned() -> dict[str, Requirement]:
    reqs = {}
    for line in (REPO / "requirements-pinned.txt").read_text().splitlines():
        if line and not line.startswith(("#", "-")):
            req = Requirement(line)
            reqs.setdefault(req.name.lower(), req)  # first of a marker split is enough here
    return reqs


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """(wheel, sdist) built from a copy of the source tree."""
    tmp = tmp_path_factory.mktemp("pkg")
    src, out = tmp / "src", tmp / "dist"
    out.mkdir()
    shutil.copytree(REPO, src, ignore=SKIP)
    code = ("from setuptools import build_meta as b; import sys; "
            "out = sys.argv[1]; b.build_sdist(out); b.build_wheel(out)")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


@in_checkout
def test_wheel_carries_the_package_typed_and_nothing_else(dists):
    wheel, _ = dists
    names = zipfile.ZipFile(wheel).namelist()
    modules = {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules <= set(names), sorted(modules - set(names))
    assert "mamba_edu/py.typed" in names
    assert all(n.startswith(("mamba_edu/", "mamba_edu-")) for n in names), names
    assert wheel.stat().st_size < 1_000_000


@in_checkout
def test_wheel_metadata_has_markers_extras_and_classifiers(dists):
    wheel, _ = dists
    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(z.read(meta_name))
    assert meta["Requires-Python"] == ">=3.11"
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    triton = next(r for r in requires if r.name == "triton")
    assert triton.marker is not None and not triton.marker.evaluate({"sys_platform": "darwin"})
    assert not triton.marker.evaluate({"sys_platform": "win32"})
    assert triton.marker.evaluate({"sys_platform": "linux"})
    extras = set(meta.get_all("Provides-Extra"))
    assert {"lab", "grade", "test", "gpu-bench", "fla", "hta", "browser", "dev"} <= extras
    fla = {r.name for r in requires if r.marker and r.marker.evaluate({"extra": "fla", "sys_platform": "linux"})}
    assert {"fla-core", "einops"} <= fla
    grade = {r.name for r in requires if r.marker and r.marker.evaluate({"extra": "grade"})}
    assert {"nbformat", "nbclient"} <= grade
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers


@in_checkout
def test_sdist_carries_what_its_tests_read(dists):
    """The sdist's tests find their notebooks, data and scripts: every file of the source tree
    that the tests, the Makefile or CI read is in it."""
    _, sdist = dists
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for folder in ("tests", "notebooks", "data", "scripts", "docs", ".ci", "mamba_edu"):
        files = {str(p.relative_to(REPO)) for p in (REPO / folder).rglob("*")
                 if p.is_file() and not SKIP(str(p.parent), [p.name])
                 and not any(part in ("__pycache__", ".ipynb_checkpoints", "out")
                             for part in p.relative_to(REPO).parts)}
        assert files <= names, (folder, sorted(files - names)[:10])
    for name in ("Makefile", "requirements-pinned.txt", "constraints-cuda.txt", "environment.yml",
                 "requirements-ci.txt", "pyproject.toml", "README.md", "LICENSE"):
        assert name in names


@in_checkout
def test_lock_satisfies_pyproject_and_holds_every_extra_but_the_optional_ones():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lock = pinned()
    extras = project["optional-dependencies"]
    needed = [*project["dependencies"], *extras["lab"], *extras["grade"], *extras["test"]]
    for line in needed:
        req = Requirement(line)
        assert req.name.lower() in lock, f"{req.name} is in pyproject.toml but not in the lock"
        version = str(next(iter(lock[req.name.lower()].specifier)).version)
        assert req.specifier.contains(version, prereleases=True), (line, version)
    assert "holistictraceanalysis" not in lock and "playwright" not in lock  # CI extras only
    assert not any(name.startswith("nvidia-") for name in lock)  # constraints-cuda.txt
    assert str(lock["triton"].marker) == 'sys_platform == "linux"'
    assert project["requires-python"] == ">=3.11"


@in_checkout
def test_environment_yml_installs_the_lock():
    """conda brings Python (one the package accepts) and pip; pip installs the same lock."""
    import re

    text = (REPO / "environment.yml").read_text()
    python = re.search(r"^\s*-\s*python=(\d+)\.(\d+)\s*$", text, re.M)
    assert python and (int(python[1]), int(python[2])) >= (3, 11)
    pip_lines = re.findall(r"^\s{6}-\s*(.+?)\s*$", text, re.M)
    assert pip_lines == ["-r requirements-pinned.txt"]
    conda_pins = [m for m in re.findall(r"^\s{2}-\s*([A-Za-z0-9_.-]+)", text, re.M)
                  if m not in ("python", "pip", "conda-forge")]
    assert conda_pins == [], "a second list of pins would drift from the lock"
    assert "-c constraints-cuda.txt" in (REPO / "requirements-pinned.txt").read_text()


@in_checkout
@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_setup_stops_early_on_an_old_python(tmp_path):
    fake = tmp_path / "python3.10"
    fake.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = --version ]; then echo 'Python 3.10.12'; exit 0; fi\n"
                    "exit 1\n")
    fake.chmod(0o755)
    done = subprocess.run(["make", "-s", "check-python", f"PYTHON={fake}", f"VENV={tmp_path / 'v'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "needs Python >= 3.11" in done.stderr and "Python 3.10.12" in done.stderr
    assert "make setup PYTHON=python3.11" in done.stderr
    ok = subprocess.run(["make", "-s", "check-python", f"PYTHON={sys.executable}",
                         f"VENV={tmp_path / 'v'}"], cwd=REPO, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stderr


def test_the_package_refuses_an_old_python_in_one_line():
    src = (PACKAGE / "__main__.py").read_text()
    assert "sys.version_info < (3, 11)" in src.split("import argparse")[0]


@in_checkout
def test_triton_is_bounded_to_the_tested_range_in_pyproject_and_environment_yml():
    """pyproject allows the tested range only: 3.6.0 (the H200), 3.7.1 (the lock) and the newest,
    TRITON_NEWEST of the Makefile (`make test-triton-newest`, part of test-extra: the kernel tests
    in the interpreter), nothing newer; environment.yml names the same range."""
    import re

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    triton = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "triton")
    newest = re.search(r"^TRITON_NEWEST\s*\?=\s*(\S+)$", (REPO / "Makefile").read_text(), re.M)[1]
    major, minor, _ = (int(x) for x in newest.split("."))
    for tested in ("3.6.0", "3.7.1", newest):
        assert triton.specifier.contains(tested), tested
    assert not triton.specifier.contains(f"{major}.{minor + 1}.0"), "untested: raise TRITON_NEWEST first"
    assert f"triton{triton.specifier}" in (REPO / "environment.yml").read_text()
