"""A learner's first minutes in a real browser: JupyterLab on loopback, notebook 00 opened, every
cell run through the UI (Run menu → Run All Cells), and the last output checked.

Skipped unless Playwright (``pip install playwright`` or ``.[browser]``) and a Chromium are
present: Debian's ``chromium`` package (``apt install chromium``; found on the PATH, or named by
``MAMBA_EDU_CHROMIUM``) or Playwright's own (``playwright install chromium``). The notebook is
copied to a temporary folder, so the UI's autosave never touches the repository, and JupyterLab
gets fresh settings and workspace folders, as on a first start. As root (containers) it is
started with ``--allow-root``.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

playwright_api = pytest.importorskip(
    "playwright.sync_api",
    reason="Playwright is optional: pip install -r requirements-ci.txt (.ci/run does), plus a Chromium")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOK = "00_start_here.ipynb"
TOKEN = "mamba-edu-browser-test"
RUN_TIMEOUT_S = 600  # every cell of notebook 00 on a shared CPU, Triton in the interpreter

pytestmark = [pytest.mark.slow, pytest.mark.extra,
              pytest.mark.skipif(not (NOTEBOOKS / NOTEBOOK).exists(), reason="no notebooks/")]


def chromium_executable() -> str | None:
    """A Chromium for Playwright: MAMBA_EDU_CHROMIUM, else one on the PATH; ``None`` means
    Playwright's own download (if it was installed)."""
    if path := os.environ.get("MAMBA_EDU_CHROMIUM"):
        return path
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_code_output(path: Path) -> str:
    """The committed text output of the notebook's last code cell."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    return "".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(o["text"])
                   for o in cells[-1]["outputs"] if o.get("output_type") == "stream").strip()


@pytest.fixture
def lab(tmp_path):
    """JupyterLab serving a copy of notebook 00 on 127.0.0.1; yields its base URL."""
    root = tmp_path / "notebooks"
    root.mkdir()
    shutil.copy(NOTEBOOKS / NOTEBOOK, root)
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1",
           "--port", str(port), f"--IdentityProvider.token={TOKEN}", "--LabApp.news_url=None",
           "--LabApp.expose_app_in_browser=True", f"--ServerApp.root_dir={root}"]
    if os.getuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited: {(tmp_path / 'lab.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("JupyterLab did not answer within 120 s")
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


# Read through the app object that --LabApp.expose_app_in_browser puts on window: the notebook
# model holds every cell, also those that the windowed notebook does not render right now.
CELLS_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.content.model) return null;
  const cells = [];
  for (const cell of panel.content.model.cells) {
    if (cell.type !== 'code') continue;
    const outputs = [];
    for (let i = 0; i < cell.outputs.length; i++) outputs.push(cell.outputs.get(i).toJSON());
    cells.push({count: cell.executionCount, outputs});
  }
  return {cells, kernel: panel.sessionContext.session?.kernel?.status ?? 'none'};
}"""


def test_notebook_00_runs_in_jupyterlab_in_a_real_browser(lab):
    expected = last_code_output(NOTEBOOKS / NOTEBOOK)
    assert expected, "notebook 00's last code cell has no committed output to compare with"
    with playwright_api.sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=chromium_executable(), headless=True,
                                         args=["--no-sandbox"])
        except Exception as err:  # no browser binary: the setup is missing, not the code wrong
            pytest.skip(f"no headless Chromium for Playwright: {str(err).splitlines()[0]}")
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{lab}/lab/tree/{NOTEBOOK}?token={TOKEN}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
            page.wait_for_function("() => { const s = window.jupyterapp?.shell.currentWidget"
                                   "?.sessionContext?.session?.kernel?.status;"
                                   " return s === 'idle'; }", timeout=120_000)

            # Through the UI, as a learner does it: the Run menu, then Run All Cells.
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

            deadline = time.monotonic() + RUN_TIMEOUT_S
            while True:
                state = page.evaluate(CELLS_JS)
                done = state and all(c["count"] for c in state["cells"])
                if done and state["kernel"] == "idle":
                    break
                assert time.monotonic() < deadline, f"cells still running after {RUN_TIMEOUT_S} s"
                page.wait_for_timeout(1000)

            n_code = sum(c["cell_type"] == "code"
                         for c in json.loads((NOTEBOOKS / NOTEBOOK).read_text())["cells"])
            assert len(state["cells"]) == n_code  # every code cell ran, in one kernel session
            assert [c["count"] for c in state["cells"]] == list(range(1, n_code + 1))
            errors = [o for c in state["cells"] for o in c["outputs"]
                      if o.get("output_type") == "error"]
            assert not errors, f"a cell raised: {errors[0].get('ename')}: {errors[0].get('evalue')}"
            last = state["cells"][-1]["outputs"]
            text = "".join(o["text"] if isinstance(o.get("text"), str) else "".join(o.get("text", []))
                           for o in last if o.get("output_type") == "stream")
            assert text.strip() == expected

            # And the learner sees it: the last cell's output rendered on the page.
            page.keyboard.press("Control+End")
            page.locator(".jp-Notebook .jp-Cell").last.scroll_into_view_if_needed()
            shown = page.locator(".jp-OutputArea-output", has_text=expected)
            shown.last.wait_for(state="visible", timeout=30_000)
            assert page.locator(".jp-OutputArea-output[data-mime-type="
                                "'application/vnd.jupyter.stderr']", has_text="Traceback").count() == 0
        finally:
            browser.close()
