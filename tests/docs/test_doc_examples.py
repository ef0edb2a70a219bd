"""Every ```python block of README.md and docs/**/*.md runs, so no example in the docs can rot.

The blocks of one file run in order, in one namespace per file (a later block may use what an
earlier one defined), from a temporary working directory of their own (a block may write a file
that the next one reads). Each block is one test, named by its file and its index in that file;
a traceback points at the Markdown file and the line of the failing statement. ```bash blocks and
plain ``` blocks are not run.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# An opening fence ```python (possibly indented, inside a list), the code, and the closing fence at
# the same indentation.
_FENCE = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    code: str  # dedented
    line: int  # the Markdown line of the block's first line of code, 1-based


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, in order."""
    return [
        Block(textwrap.dedent(match.group(2)), text.count("\n", 0, match.start(2)) + 1)
        for match in _FENCE.finditer(text)
    ]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def run_block(block: Block, filename: str, namespace: dict[str, Any]) -> None:
    """Execute one block in ``namespace``; line numbers in a traceback are the Markdown file's."""
    source = "\n" * (block.line - 1) + block.code
    exec(compile(source, filename, "exec"), namespace)


@dataclass
class _FileRun:
    """The shared state of one file's blocks: its namespace and how far it has run."""

    workdir: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "doc_example"})
    done: int = 0
    failed_at: int | None = None


_RUNS: dict[str, _FileRun] = {}

CASES = [
    pytest.param(path, index, id=f"{path.relative_to(ROOT)}[{index}]")
    for path in doc_files()
    for index in range(len(python_blocks(path.read_text())))
]


@pytest.mark.parametrize(("path", "index"), CASES)
def test_block_runs(path: Path, index: int, tmp_path_factory, monkeypatch) -> None:
    name = str(path.relative_to(ROOT))
    run = _RUNS.get(name)
    if run is None:
        run = _RUNS[name] = _FileRun(tmp_path_factory.mktemp(re.sub(r"\W", "_", name)))
        _forget_compiled_code()
    blocks = python_blocks(path.read_text())
    monkeypatch.chdir(run.workdir)
    while run.done <= index:  # blocks before this one first (also when it is selected alone)
        if run.failed_at is not None:
            pytest.fail(f"{name}: block {run.failed_at} failed, and this block runs after it")
        current, run.done = run.done, run.done + 1
        try:
            run_block(blocks[current], str(path), run.namespace)
        except BaseException:
            run.failed_at = current
            raise


def _forget_compiled_code() -> None:
    """Start a file's examples with torch's compiler caches empty, as a reader's fresh interpreter
    has them: FlexAttention's eager call goes through torch.compile, and after other tests compiled
    it in this process (under pytest's log capture, which turns on torch's recompilation logging)
    torch 2.13 crashes while explaining the recompilation."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch._dynamo.reset()


def test_the_examples_are_collected() -> None:
    """The files that must hold examples do, so a broken fence pattern cannot pass silently."""
    counts = {
        str(path.relative_to(ROOT)): len(python_blocks(path.read_text())) for path in doc_files()
    }
    assert counts["README.md"] >= 1
    assert counts["docs/training.md"] >= 5
    assert counts["docs/cpu-fallback.md"] >= 2


def test_only_python_blocks_are_taken_with_their_lines() -> None:
    text = (
        "# Title\n"
        "```bash\n"
        "python -m something --flag\n"
        "```\n"
        "```python\n"
        "a = 1\n"
        "```\n"
        "```\n"
        "not python\n"
        "```\n"
        "- a list item:\n"
        "\n"
        "  ```python\n"
        "  b = a + 1\n"
        "  if b:\n"
        "      c = b\n"
        "  ```\n"
    )
    blocks = python_blocks(text)
    assert blocks == [Block("a = 1\n", 6), Block("b = a + 1\nif b:\n    c = b\n", 14)]


def test_a_failing_block_raises_at_its_markdown_line() -> None:
    namespace: dict[str, Any] = {}
    run_block(Block("x = 1\n", 3), "page.md", namespace)
    with pytest.raises(ZeroDivisionError) as failure:
        run_block(Block("y = x\nz = y / 0\n", 10), "page.md", namespace)
    assert failure.traceback[-1].lineno + 1 == 11  # pytest's line numbers are 0-based
    assert namespace["y"] == 1  # the second block saw the first one's namespace
