"""The book as a reader runs it locally: headless JupyterLab (configured as ``make lab``
configures it, with the project's ``lab/overrides.json``) in Debian's Chromium, driven by
Playwright with real clicks and key presses.

For each notebook a reader opens first (chapters 1, 4 and 5, and the why page) and each
whose text shows computed numbers (``{eval}``: chapters 7, 8, 9 and 11), the
test opens it, runs all cells from the Run menu, waits until every code cell has an
execution count and the kernel is idle, shows the folded cells' code (View > Expand All
Code, so that their counts show) and then reads the page as rendered by jupyterlab-myst.
It fails on:

- raw MyST in a rendered markdown cell: a directive fence (```` ```{ ````, ``:::{``), a
  role left as text (``{doc}`...` ``, ``{cite:p}`...` ``, ``{eval}`...` ``, ``{glue...}``,
  any ``{name}`...` ``), an option line (``:class: important``, ``:label: ...``), a
  directive jupyterlab-myst does not know (its red "Unknown Directive" box), a role it does
  not know (shown as its bare text: a ``{glue:text}`key` `` reads as ``key``), a
  cross-reference it cannot resolve (its "Cross Reference Not Found" mark), a
  solution-start/solution-end pair (an empty "Start of Solution" box, the answer outside);
- a missing number: an ``{eval}`` expression of the cell's source that did not render
  (jupyterlab-myst shows an unevaluated inline expression as ``<code>expression</code>``,
  and an expression that raised as its error);
- any output on stderr (warnings included) and any traceback;
- a code cell without an execution count after Run All, a dialog the reader must answer,
  a widget that failed to display,
  the website's static explorer shown in Lab (the live one is Lab's), a request leaving
  the machine, the "get notified about Jupyter news?" toast;
- chapter 5: the live explorer's α slider shorter than 200 px, or heat maps that do not
  redraw when the slider moves by a key press on the focused slider handle.

test_checks_catch_planted_defects runs two small notebooks with one defect of each kind
and requires every check to report its defect (and a good ``{eval}`` to show its value).

Each failure lists its problems as ``notebook, cell index: what (offending text)``, a
checklist for fixing the notebooks. Screenshots, 1280 px wide, go to test-artifacts/lab/
(or ``QKMLP_LAB_SHOTS``): each notebook after Run All (the top of the page, and its first
cell with {eval} numbers) and chapter 5's explorer before and after the slider moves.

The server runs on a copy of book/ in a temporary folder, so nothing a run or an autosave
writes reaches the repository; its Jupyter config, data, runtime and settings folders are
temporary too, so a developer's own Jupyter settings cannot change what is tested. It
passes ``--allow-root`` only when running as root (CI).

Skipped, with the reason, where Chromium or the playwright package is missing, like
tests/test_browser.py. Playwright only drives the system Chromium (``executable_path``).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest

from measure_pages import CHROMIUM_ARGS, chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ROOT / "lab" / "overrides.json"
SHOTS = Path(os.environ.get("QKMLP_LAB_SHOTS", ROOT / "test-artifacts" / "lab"))
# The notebooks a reader opens first, and those with {eval} numbers in their text.
NOTEBOOKS = ("01_key_value", "04_rank_one", "05_symmetry_breaking", "07_symmetry_group", "08_experiments",
             "09_pretrained", "11_retrain", "why")
EXPLORER_NOTEBOOK = "05_symmetry_breaking"
WINDOW = {"width": 1280, "height": 900}
SERVER_START_S = 120
RUN_ALL_S = 420          # one notebook's Run All (each runs in under a minute under nbval)
REDRAW_S = 30            # the explorer's redraw after one slider step (measured 0.4-1.5 s)
MIN_SLIDER_TRACK_PX = 200
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

CHROMIUM = chromium()
if CHROMIUM is None:
    pytest.skip("no Chromium found (install Debian's `chromium`, as .ci/run does, or set "
                "QKMLP_CHROMIUM)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements.txt)")

# A role in a markdown cell's source: {name}`body`.
ROLE = re.compile(r"\{([\w:+-]+)\}`([^`]+)`")

# Run in the page after Run All: every problem of the rendered notebook, by cell index.
# `evals` maps a markdown cell's index to the {eval} expressions of its source, `roles` to
# its roles other than {eval} as [name, body].
_PROBLEMS_JS = r"""
({evals, roles}) => {
  const problems = [];
  const add = (i, what, text) => problems.push({cell: i, what, text: (text || '').trim().slice(0, 160)});
  const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')];
  const raw = [
    [/```\s*\{/, 'directive fence'], [/:::\s*\{/, 'directive fence'],
    [/\{glue[:\w-]*\}/, 'glue role'],
    [/\{[a-z][\w:-]*\}`[^`]*`/, 'role left as text'],
  ];
  const option = /^\s*:[a-z][\w-]*:(\s|$)/;
  cells.forEach((cell, i) => {
    if (cell.classList.contains('jp-MarkdownCell')) {
      const out = cell.querySelector('.myst, .jp-RenderedMarkdown');
      if (!out) { add(i, 'markdown cell not rendered', ''); return; }
      const copy = out.cloneNode(true);
      copy.querySelectorAll('.katex-mathml, annotation, script, style').forEach(e => e.remove());
      const text = copy.textContent;
      for (const [re, what] of raw) {
        const m = text.match(re);
        if (m) { const k = m.index; add(i, 'raw MyST: ' + what, text.slice(Math.max(0, k - 30), k + 90)); }
      }
      const lines = [];
      copy.querySelectorAll('p, pre, li, td, div.admonition, summary').forEach(e => lines.push(...e.textContent.split('\n')));
      const opt = lines.find(l => option.test(l));
      if (opt) add(i, 'raw MyST: option line', opt);
      for (const e of copy.querySelectorAll('[title="Cross Reference Not Found"]'))
        add(i, 'unresolved cross-reference', e.textContent);
      for (const e of copy.querySelectorAll('.myst-admonition-header-text, summary, div'))
        if (/ - Unknown Directive$/.test(e.textContent.trim()) && e.children.length <= 2)
          add(i, 'raw MyST: unknown directive', e.textContent);
      const gated = text.match(/(Start|End) of Solution.{0,40}/);
      if (gated) add(i, 'solution-start/solution-end render as separate boxes', gated[0]);
      // A role jupyterlab-myst does not know renders as its bare body text.
      const bare = new Set([...copy.querySelectorAll('span:not([class]):not([title])')]
                             .filter(e => !e.children.length).map(e => e.textContent));
      for (const [role, body] of (roles[i] || []))
        if (bare.has(body)) add(i, role.startsWith('glue') ? 'missing number: glue placeholder shows its key'
                                                    : 'role shown as its bare text', `{${role}}\`${body}\``);
      const codes = [...copy.querySelectorAll('code')].map(c => c.textContent.trim());
      for (const expr of (evals[i] || [])) {
        if (codes.includes(expr.trim())) add(i, 'missing number: {eval} not evaluated', expr);
      }
      if (/Unexecuted inline expression/.test(text)) add(i, 'missing number: unexecuted inline expression', text.match(/Unexecuted inline expression.{0,80}/)[0]);
      for (const e of copy.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]'))
        add(i, 'missing number: {eval} raised', e.textContent);
    } else if (cell.classList.contains('jp-CodeCell')) {
      const prompt = (cell.querySelector('.jp-InputPrompt') || {}).textContent || '';
      if (!/\[\d+\]/.test(prompt) && !cell.classList.contains('qk-empty'))
        add(i, 'code cell without execution count', prompt);
      for (const o of cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')) {
        const t = o.textContent;
        add(i, /Traceback|\w+Error\b/.test(t) ? 'traceback' : 'stderr output', t);
      }
      for (const o of cell.querySelectorAll('.jp-OutputArea-output'))
        if (/Error displaying widget|Failed to load model class/.test(o.textContent)) add(i, 'widget not displayed', o.textContent);
      if (cell.querySelector('.qkmlp-static-explorer'))
        add(i, "the website's static explorer is shown in JupyterLab", '');
    }
  });
  for (const t of document.querySelectorAll('.Toastify__toast'))
    if (/news/i.test(t.textContent)) add(-1, 'news toast shown', t.textContent);
  return {count: cells.length, problems};
}
"""

PANEL_CSS = ".jp-NotebookPanel:not(.lm-mod-hidden)"   # the notebook on show
# Kernel idle and every code cell either numbered or not queued: [n] or [ ], never [*].
_STATE_JS = r"""
() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim());
  const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {numbered: prompts.filter(p => /\[\d+\]/.test(p)).length,
          busy: prompts.filter(p => p.includes('*')).length, total: prompts.length,
          kernel: status ? status.getAttribute('data-status') : null};
}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    base: str
    token: str
    book: Path
    log: Path

    def url(self, path: str) -> str:
        return f"{self.base}{path}?token={self.token}"

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a free localhost port with a token, serving a copy of book/."""
    if not OVERRIDES.exists():
        pytest.fail(f"{OVERRIDES} is missing: the Makefile installs it for `make lab`")
    tmp = tmp_path_factory.mktemp("lab")
    book = tmp / "book"
    shutil.copytree(ROOT / "book", book, ignore=shutil.ignore_patterns("_build", ".ipynb_checkpoints"))
    settings = tmp / "app-settings"
    settings.mkdir()
    shutil.copy(OVERRIDES, settings / "overrides.json")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ,
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_DATA_DIR=str(tmp / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_PLATFORM_DIRS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    exe = Path(sys.executable).with_name("jupyter-lab")
    cmd = [str(exe) if exe.exists() else "jupyter-lab", "--no-browser",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={book}",
           f"--LabApp.app_settings_dir={settings}", f"--LabApp.user_settings_dir={tmp / 'user-settings'}",
           f"--LabApp.workspaces_dir={tmp / 'workspaces'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=book)
    server = Lab(base=f"http://127.0.0.1:{port}", token=token, book=book, log=log)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                server.api("/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer in {SERVER_START_S} s:\n{log.read_text()[-4000:]}")
                time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@dataclass
class Run:
    """One notebook after Run All in JupyterLab."""

    name: str
    page: object
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _source_roles(notebook: Path) -> tuple[dict[int, list[str]], dict[int, list[list[str]]], set[int]]:
    """Per markdown cell of the notebook file: its {eval} expressions and its other roles
    ([name, body]); and the indices of empty code cells (Run All leaves them unnumbered)."""
    cells = json.loads(notebook.read_text())["cells"]
    evals, roles, empty = {}, {}, set()
    for i, c in enumerate(cells):
        src = "".join(c["source"])
        if c["cell_type"] == "markdown":
            found = ROLE.findall(src)
            if any(name == "eval" for name, _ in found):
                evals[i] = [body for name, body in found if name == "eval"]
            if any(name != "eval" for name, _ in found):
                roles[i] = [[name, body] for name, body in found if name != "eval"]
        elif c["cell_type"] == "code" and not src.strip():
            empty.add(i)
    return evals, roles, empty


def _answer_dialogs(page, run: Run) -> None:
    """Record any dialog Lab shows (a reader would have to answer it) and accept it."""
    for _ in range(5):
        dialog = page.locator(".jp-Dialog")
        if not dialog.count():
            return
        text = " ".join(dialog.first.inner_text().split())
        run.problems.append(f"{run.name}: JupyterLab showed a dialog: {text[:200]!r}")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{run.name}-dialog.png"))
        dialog.first.locator(".jp-Dialog-button.jp-mod-accept").first.click(timeout=10_000)
        time.sleep(1)


def _run_all(lab: Lab, context, name: str) -> Run:
    page = context.new_page()
    run = Run(name, page)
    t0 = time.monotonic()

    def route(r):
        if urlparse(r.request.url).hostname in LOCAL_HOSTS or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            run.problems.append(f"{name}: request leaving the machine: {r.request.url}")
            r.abort()

    page.route("**/*", route)
    # reset: an empty workspace, so that Lab does not reopen the notebooks opened before.
    page.goto(lab.url(f"/lab/tree/{name}.ipynb") + "&reset")
    # Loaded: as many cells on the page as in the file (a notebook opens with one empty cell).
    n_cells = len(json.loads((lab.book / f"{name}.ipynb").read_text())["cells"])
    page.wait_for_function("(n) => document.querySelectorAll('" + PANEL_CSS + " .jp-Cell').length === n",
                           arg=n_cells, timeout=120_000)
    # The kernel has started when the execution indicator says idle.
    page.wait_for_selector(f"{PANEL_CSS} .jp-Notebook-ExecutionIndicator[data-status='idle']",
                           state="attached", timeout=120_000)
    evals, roles, empty = _source_roles(lab.book / f"{name}.ipynb")
    page.evaluate("(empty) => { const c = document.querySelectorAll('" + PANEL_CSS + " .jp-Cell');"
                  " for (const i of empty) c[i] && c[i].classList.add('qk-empty'); }", sorted(empty))
    # Checking code opens folded (tools/lab_folds.py), and a folded cell shows no prompt:
    # View > Expand All Code first, so that the execution counts can be read.
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^View$")).click()
    page.locator(".lm-Menu-item[data-command='notebook:show-all-cell-code']").click()
    time.sleep(1)
    # Run > Run All Cells, with the mouse. Lab can show the kernel idle a moment before it
    # runs anything, and Run All then does nothing: click again while no cell has run.
    deadline, clicks, idle_since, state = time.monotonic() + RUN_ALL_S, 0, None, None
    while time.monotonic() < deadline:
        state = page.evaluate(_STATE_JS)
        expected = state["total"] - len(empty) if state else None
        idle = state and state["busy"] == 0 and state["kernel"] == "idle"
        idle_since = (idle_since or time.monotonic()) if idle else None
        if idle and state["numbered"] >= expected:
            break
        if clicks == 0 or (idle and state["numbered"] == 0 and time.monotonic() - idle_since > 10):
            if clicks == 5:
                run.problems.append(f"{name}: Run > Run All Cells ran no cell in 5 tries")
                break
            _answer_dialogs(page, run)
            page.keyboard.press("Escape")
            try:
                page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click(timeout=10_000)
                page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click(timeout=10_000)
            except sync_api.TimeoutError:  # a dialog came up in between: answered next round
                pass
            clicks, idle_since = clicks + 1, None
        elif idle and time.monotonic() - idle_since > 10:
            break  # Run All stopped (an error): the cells left without a count are reported
        time.sleep(0.5)
    else:
        run.problems.append(f"{name}: Run All did not finish in {RUN_ALL_S} s (state {state})")
    run.seconds = time.monotonic() - t0
    _answer_dialogs(page, run)
    # Let the markdown cells render their {eval} results.
    time.sleep(2)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("() => { const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');"
                  " if (s) s.scrollTop = 0; }")
    time.sleep(0.5)
    page.screenshot(path=str(SHOTS / f"{name}.png"))
    if evals:  # and the first sentence that reads stored numbers
        page.locator(f"{PANEL_CSS} .jp-Cell").nth(min(evals)).scroll_into_view_if_needed()
        time.sleep(0.5)
        page.screenshot(path=str(SHOTS / f"{name}-numbers.png"))
    found = page.evaluate(_PROBLEMS_JS, {"evals": {str(k): v for k, v in evals.items()},
                                         "roles": {str(k): v for k, v in roles.items()}})
    if found["count"] != n_cells:
        run.problems.append(f"{name}: JupyterLab shows {found['count']} cells, the notebook has {n_cells}")
    run.problems += [f"{name}, cell {p['cell']}: {p['what']}" + (f" ({p['text']!r})" if p["text"] else "")
                     for p in found["problems"]]
    return run


def _shut_down_kernels(lab: Lab, keep: tuple[str, ...] = ()) -> None:
    """Shut down every notebook's kernel but those of the notebooks named in keep."""
    for session in lab.api("/api/sessions"):
        if Path(session["path"]).stem not in keep:
            lab.api(f"/api/sessions/{session['id']}", method="DELETE")


@pytest.fixture(scope="module")
def runs(lab, browser):
    """Run All of each notebook, once, in order; each page stays open until the module ends
    (chapter 5's is read again by the explorer test), kernels except chapter 5's shut down."""
    context = browser.new_context(viewport=WINDOW)
    done: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in done:
            for other, r in done.items():
                if other != EXPLORER_NOTEBOOK and not r.page.is_closed():
                    r.page.close()
            _shut_down_kernels(lab, keep=(EXPLORER_NOTEBOOK,))
            done[name] = _run_all(lab, context, name)
        return done[name]

    yield get
    context.close()
    _shut_down_kernels(lab)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_reads_cleanly_in_jupyterlab_after_run_all(runs, name):
    run = runs(name)
    assert not run.problems, (f"{len(run.problems)} problems in {name}.ipynb after Run All in "
                              f"JupyterLab ({run.seconds:.0f} s):\n" + "\n".join(run.problems))


_IMAGES_JS = r"""
async (root) => {
  const out = [];
  for (const img of root.querySelectorAll('img')) {
    let digest = img.src;
    try {
      const buf = await (await fetch(img.src)).arrayBuffer();
      const h = await crypto.subtle.digest('SHA-256', buf);
      digest = [...new Uint8Array(h)].map(b => b.toString(16).padStart(2, '0')).join('');
    } catch (e) {}
    const r = img.getBoundingClientRect();
    out.push({src: img.src.slice(0, 60), digest, width: r.width, height: r.height});
  }
  return out;
}
"""


def test_live_explorer_slider_is_long_and_redraws_the_heat_maps(runs):
    run = runs(EXPLORER_NOTEBOOK)
    page = run.page
    sliders = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output .widget-slider")
    assert sliders.count() > 0, "chapter 5 shows no live explorer slider after Run All"
    # The α slider: the one whose label names α.
    alpha = None
    for k in range(sliders.count()):
        s = sliders.nth(k)
        label = s.locator(".widget-label").first.text_content() if s.locator(".widget-label").count() else ""
        if "α" in label or "alpha" in label.lower():
            alpha = s
            break
    assert alpha is not None, "no slider of the live explorer is labelled α"
    explorer = alpha.locator("xpath=ancestor::div[contains(@class,'jp-OutputArea-output')]").first
    explorer.scroll_into_view_if_needed()
    track = alpha.locator(".noUi-target, .slider").first
    box = track.bounding_box()
    assert box is not None, "the α slider has no track on the page"
    readout = alpha.locator(".widget-readout").first
    before_value = readout.text_content() if readout.count() else None
    handle = explorer.element_handle()
    before = page.evaluate(_IMAGES_JS, handle)
    explorer.screenshot(path=str(SHOTS / f"{EXPLORER_NOTEBOOK}-explorer-before.png"))
    # One step to the right by a real key press on the focused handle.
    alpha.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    deadline, after = time.monotonic() + REDRAW_S, before
    while time.monotonic() < deadline:
        time.sleep(0.5)
        after = page.evaluate(_IMAGES_JS, handle)
        if len(after) == len(before) and all(a["digest"] != b["digest"] for a, b in zip(after, before)):
            time.sleep(1)  # let a second redraw (if any) land before the screenshot
            break
    explorer.screenshot(path=str(SHOTS / f"{EXPLORER_NOTEBOOK}-explorer-after.png"))
    after_value = readout.text_content() if readout.count() else None
    problems = []
    if box["width"] < MIN_SLIDER_TRACK_PX:
        problems.append(f"α slider track {box['width']:.0f} px long, under {MIN_SLIDER_TRACK_PX} px")
    if before_value == after_value:
        problems.append(f"α did not change on ArrowRight (readout {before_value!r})")
    if not before:
        problems.append("the explorer shows no image")
    unchanged = [b["src"] for a, b in zip(after, before) if a["digest"] == b["digest"]]
    if len(after) != len(before) or unchanged:
        problems.append(f"{len(unchanged)} of {len(before)} explorer images did not redraw within "
                        f"{REDRAW_S} s of the slider's step (now {len(after)} images)")
    assert not problems, (f"chapter 5's live explorer (α {before_value} -> {after_value}, "
                          f"track {box['width']:.0f} px):\n" + "\n".join(problems))


# ---------------------------------------------------------------- the checks can fail

# Notebooks with one planted defect of each kind the checks look for, run like the book's:
# their cells, and (cell index, the problem the test must report there). An error stops
# Run All and makes the kernel abort the {eval} requests queued behind it, so the error
# has a notebook of its own.
_PLANTED = {
    "planted_markup": (
        [("markdown", "Numbers: {eval}`2 + 3` is fine; {glue:text}`planted_key` is a glue placeholder;\n"
                      "see {prf:ref}`no-such-label`."),
         ("markdown", "````md\n```{prf:theorem} Planted\n:label: planted-thm\n\nBody.\n```\n````"),
         ("markdown", "```{planted-directive}\nA directive jupyterlab-myst does not know.\n```"),
         ("markdown", "A failing expression: {eval}`undefined_name_planted`."),
         ("code", "import sys\nprint('planted warning', file=sys.stderr)"),
         ("markdown", "```{exercise}\n:label: planted-ex\n\nA question.\n```\n\n```{solution-start} planted-ex\n```"),
         ("code", "from IPython.display import HTML\n"
                  "HTML('<div class=\"qkmlp-static-explorer\">the website explorer</div>')"),
         ("markdown", "```{solution-end}\n```")],
        [(0, "missing number: glue placeholder shows its key"), (0, "unresolved cross-reference"),
         (1, "raw MyST: directive fence"), (1, "raw MyST: option line"),
         (2, "raw MyST: unknown directive"), (3, "missing number: {eval} raised"), (4, "stderr output"),
         (5, "solution-start/solution-end render as separate boxes"),
         (6, "the website's static explorer is shown in JupyterLab")]),
    "planted_error": (
        [("code", "raise ValueError('planted error')"),
         ("markdown", "After the error: {eval}`planted_after_error` never shows a value."),
         ("code", "planted_after_error = 1")],
        # jupyterlab-myst may evaluate the expression as the cell renders, before Run All
        # (it then raises NameError) or queue it behind the error (then it is never
        # evaluated): either way the number is missing and must be reported.
        [(0, "traceback"), (1, "missing number: "), (2, "code cell without execution count")]),
}


@pytest.mark.parametrize("name", sorted(_PLANTED))
def test_checks_catch_planted_defects(lab, browser, name):
    import nbformat
    cells, expected = _PLANTED[name]
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
                for kind, src in cells]
    nbformat.write(nb, lab.book / f"{name}.ipynb")
    context = browser.new_context(viewport=WINDOW)
    try:
        run = _run_all(lab, context, name)
        first = run.page.evaluate("() => document.querySelector('" + PANEL_CSS + " .jp-Cell .myst').textContent")
    finally:
        context.close()
        _shut_down_kernels(lab, keep=(EXPLORER_NOTEBOOK,))
    missed = [f"cell {i}: {what}" for i, what in expected
              if not any(p.startswith(f"{name}, cell {i}: {what}") for p in run.problems)]
    assert not missed, "planted defects not reported:\n" + "\n".join(missed) + \
        "\nreported:\n" + "\n".join(run.problems)
    if name == "planted_markup":
        # The good expression rendered its value and was not reported.
        assert "2 + 3" not in " ".join(run.problems) and re.search(r"\b5 is fine", first), (first, run.problems)
