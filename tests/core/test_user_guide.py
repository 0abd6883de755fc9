"""The user guide (docs/*.md) stays true: its runnable shell blocks run as written, its links resolve, and
the commands README.md and the demo hand a user run from where they say."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

# A ```bash block directly after ``<!-- runs in: FOLDER -->`` runs as written. The blocks of one page run in
# order in a folder of the page's own (empty when the first block starts), each starting in FOLDER relative to
# it, so a block may use what an earlier one made.
RUNS = re.compile(r"<!--\s*runs in:\s*(\S+)\s*-->\s*\n```bash\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("TOMBSTONE_CONFIG", None)
    return env


def _bash(script: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_every_guide_page_has_runnable_blocks_and_the_index_lists_them():
    names = {p.name for p in PAGES}
    assert {"README.md", "operator.md", "auditor.md", "ci.md", "developer.md"} <= names
    index = (DOCS / "README.md").read_text()
    for page in PAGES:
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not link {page.name}"
            assert RUNS.search(page.read_text()), f"{page.name} has no runnable block"
    assert "(docs/README.md)" in (ROOT / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if RUNS.search(p.read_text())], ids=lambda p: p.name)
def test_guide_blocks_run_as_written(page, tmp_path):
    for n, (folder, block) in enumerate(RUNS.findall(page.read_text())):
        cwd = (tmp_path / folder).resolve()
        assert cwd.is_relative_to(tmp_path.resolve()) and cwd.is_dir(), f"{page.name} block {n + 1}: no folder {folder}"
        result = _bash(block, cwd)
        assert result.returncode == 0, (f"{page.name} block {n + 1} exited {result.returncode}:\n{block}\n"
                                        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (fenced code left out)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    slugs = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M):
        slugs.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return slugs


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    """Every relative link of a guide page names a file that exists, and a heading of it when it has a #."""
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.relative_to(ROOT)} links {target}: no such heading"


def _readme_block_after(heading: str) -> str:
    text = (ROOT / "README.md").read_text().split(heading, 1)[1]
    return text.split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_readme_demo_verify_and_report_run_as_written(tmp_path):
    """The quick start's verify line runs from where the demo ran; the report lines from the deployment's folder."""
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("## Concepts", 1)[0]
    assert "root of this repository" in quick
    verify = [line for line in quick.splitlines() if line.startswith("tombstone receipt verify ")]
    assert len(verify) == 1
    demo = _bash("tombstone demo --subjects 2", tmp_path)
    assert demo.returncode == 0, demo.stderr
    result = _bash(verify[0], tmp_path)
    assert result.returncode == 0, result.stderr
    report = [line.split("#", 1)[0].strip()
              for line in _readme_block_after("## For compliance teams").splitlines() if line.strip()]
    assert len(report) == 2
    for line in report:
        result = _bash(line, tmp_path / "tombstone-demo")
        assert result.returncode == 0, f"{line}: {result.stderr}"


@pytest.mark.slow
def test_demo_verify_hint_runs_where_the_demo_ran(tmp_path):
    """The demo's printed 'verify:' line, pasted into a shell where the demo ran, verifies the receipt, even
    when the demo folder's name has a space in it."""
    demo = _bash(f"tombstone demo --workdir {shlex.quote('my demo')} --backends docstore --subjects 2", tmp_path)
    assert demo.returncode == 0, demo.stderr
    hint = [line for line in demo.stdout.splitlines() if line.startswith("verify:")]
    assert len(hint) == 1
    command = hint[0].removeprefix("verify:").strip()
    assert not Path(shlex.split(command)[3]).is_absolute()   # where the user ran it, as the README shows it
    result = _bash(command, tmp_path)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    assert result.stdout.startswith("OK ")
