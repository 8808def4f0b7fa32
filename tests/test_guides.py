"""The guides' code runs as printed: every fenced ```python block of a docs/guides/*.md page, in order, in one
namespace per page (as a reader pastes them), in a temporary working directory.  Blocks fenced otherwise
(```bash, ```text) are not run.  A failure names the page, the block's first line and the error, and the
traceback points at the page's own line numbers."""

import re
import traceback
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ROOT / "docs" / "guides"
PAGES = sorted(p for p in GUIDES.glob("*.md") if p.name != "index.md")

_FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the block's first code line, code)`` for each ```python block of a markdown text."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start, i = m.group(1).lower(), i + 1, i + 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if i == len(lines):
            raise ValueError(f"a code block opened at line {start} is never closed")
        if lang in ("python", "py"):
            blocks.append((start + 1, "\n".join(lines[start:i]) + "\n"))
        i += 1
    return blocks


def test_blocks_are_found_as_a_reader_sees_them():
    text = "intro\n```python\nx = 1\n```\n\n```bash\nrm -rf /\n```\n```text\nout\n```\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (13, "y = x + 1\n")]
    with pytest.raises(ValueError, match="never closed"):
        python_blocks("```python\nx = 1\n")


def test_index_lists_every_guide():
    index = (GUIDES / "index.md").read_text(encoding="utf-8")
    missing = [p.name for p in PAGES if f"({p.name})" not in index]
    assert not missing, f"docs/guides/index.md does not link {missing}"
    for target in re.findall(r"\]\(([^)#\s]+\.md)\)", index):
        assert (GUIDES / target).resolve().is_file(), f"docs/guides/index.md links {target}, which does not exist"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_guide_code_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    name = page.relative_to(ROOT).as_posix()
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    assert blocks, f"{name} has no ```python block"
    namespace = {"__name__": "__guide__"}
    threads = torch.get_num_threads()  # a page's commands may set them (--threads; a study's default of 1)
    try:
        for line, code in blocks:
            # padded so that the traceback's line numbers are the page's
            compiled = compile("\n" * (line - 1) + code, name, "exec")
            try:
                exec(compiled, namespace)
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # SystemExit too: a block that calls sys.exit fails here, not the session
                tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
                pytest.fail(f"{name}: the block at line {line} raised {type(e).__name__}: {e}\n{tb}", pytrace=False)
    finally:
        torch.set_num_threads(threads)
