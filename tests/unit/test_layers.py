"""Imports go one way: cni, kube < deviceplugin < delegates < meta, and no module imports
itself back through others.

Read from the source with `ast`: every import counts, at module level, inside a function
or under TYPE_CHECKING, since each one ties two modules together. Tests are not
checked: they may import anything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The product's packages, bottom first; packages on one rank may import each other, one way.
RANKS = (("cni", "kube"), ("deviceplugin",), ("delegates",), ("meta",))

Graph = dict[str, set[str]]


def modules(root: Path) -> dict[str, Path]:
    """Every module of the ranked packages under `root`, by dotted name."""
    found = {}
    for package in (p for rank in RANKS for p in rank):
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(name: str, path: Path, tree: ast.AST) -> Iterator[tuple[str, list[str]]]:
    """(module, names taken from it) for each import in `tree`, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base, [alias.name for alias in node.names]


def _known(name: str, known: dict[str, Path]) -> str | None:
    """`name`, or the longest of its parents that is one of our modules."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> Graph:
    """module -> the modules of ours it imports (a submodule named in `from x import y`
    counts as y, not x)."""
    known = modules(root)
    graph: Graph = {}
    for name, path in known.items():
        targets = set()
        for base, names in _imported(name, path, ast.parse(path.read_bytes(), str(path))):
            submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
            targets |= set(submodules)
            if len(submodules) < len(names) or not names:
                targets.add(_known(base, known) or "")
        graph[name] = targets - {"", name}
    return graph


def _rank(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, rank in enumerate(RANKS) if top in rank)


def upward(graph: Graph) -> list[str]:
    """Each import from a lower package to a higher one, as 'importer -> imported'."""
    return sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs if _rank(b) > _rank(a))


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def packages(graph: Graph) -> Graph:
    """The graph between top-level packages."""
    tops: Graph = {}
    for a, bs in graph.items():
        tops.setdefault(a.split(".")[0], set()).update(
            b.split(".")[0] for b in bs if b.split(".")[0] != a.split(".")[0]
        )
    return tops


def test_no_import_runs_up_the_layers() -> None:
    assert upward(import_graph(REPO)) == []


def test_no_two_modules_import_each_other_even_through_others() -> None:
    assert cycles(import_graph(REPO)) == []


def test_the_bottom_packages_import_each_other_one_way_only() -> None:
    assert cycles(packages(import_graph(REPO))) == []


def test_the_checks_find_an_upward_import_and_a_cycle_wherever_they_stand(
    tmp_path: Path,
) -> None:
    """A tree with one of each, hidden in a function, under TYPE_CHECKING and relative."""
    files = {
        "cni/__init__.py": "",
        "cni/low.py": "def f():\n    from meta import top\n",
        "kube/__init__.py": "from cni import low\n",
        "deviceplugin/__init__.py": "",
        "delegates/__init__.py": "",
        "meta/__init__.py": "",
        "meta/top.py": "from .sub import a\n",
        "meta/sub/__init__.py": "",
        "meta/sub/a.py": "import meta.sub.b\n",
        "meta/sub/b.py": "if TYPE_CHECKING:\n    from ..top import X\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)

    assert upward(graph) == ["cni.low -> meta.top"]
    assert cycles(graph) == [["meta.sub.a", "meta.sub.b", "meta.top"]]
    assert cycles(packages(graph)) == []
    graph["cni.low"].add("kube")
    assert cycles(packages(graph)) == [["cni", "kube"]]
