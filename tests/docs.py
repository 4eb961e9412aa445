"""The README and docs/*.md as the docs tests read them: fenced blocks, commands, tables.

A block's language says what it holds: `sh` commands (every one is validated, see
tests/unit/test_docs.py), `json` and `yaml` documents (parsed and checked against the
models), `text` output (quoted, not checked). An HTML comment on the line before a block
names it: `<!-- file: NAME -->` (a file the doc's commands use) or
`<!-- run: tests/netns/test_docs.py -->` (commands that test runs as they are).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*(file|run):\s*(\S+)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    heading: str  # the nearest heading above, without its #s
    mark: tuple[str, str] | None  # ("file", NAME) or ("run", TEST)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(paths: list[Path] | None = None) -> list[Block]:
    """Every fenced block of the given docs (default: all of them), in order."""
    found = []
    for path in DOCS if paths is None else paths:
        lines = path.read_text().splitlines()
        heading, index = "", 0
        while index < len(lines):
            line = lines[index]
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            opening = _FENCE.match(line)
            if opening is None:
                index += 1
                continue
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            mark = _MARK.match(lines[index - 1].strip()) if index else None
            found.append(
                Block(
                    path=path,
                    line=index + 1,
                    lang=opening.group(1),
                    text="\n".join(lines[index + 1 : end]) + "\n",
                    heading=heading,
                    mark=(mark.group(1), mark.group(2)) if mark else None,
                )
            )
            index = end + 1
    return found


def commands(block: Block) -> list[list[str]]:
    """The commands of a `sh` block, split into words: continuation lines joined,
    comments and blank lines dropped."""
    joined = block.text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def table(path: Path, heading: str) -> dict[str, list[str]]:
    """The first table under `## heading`: its first cell (backticks stripped) -> the row."""
    rows: dict[str, list[str]] = {}
    inside = False
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            if inside and rows:
                break
            inside = line.lstrip("#").strip() == heading
            continue
        if inside and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
        elif inside and rows and not line.startswith("|"):
            break
    rows.pop("key", None)  # the header row
    return rows


def named_files(path: Path) -> dict[str, Block]:
    """The blocks of one doc that carry a `file:` mark, by file name."""
    return {b.mark[1]: b for b in blocks([path]) if b.mark and b.mark[0] == "file"}
