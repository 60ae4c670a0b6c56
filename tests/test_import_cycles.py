"""No import circle: no two modules of headprobe (or of the trainer, or of the figures) import each other,
directly or through others. Every import statement counts, at the top of a module, inside a function or under
``TYPE_CHECKING``, as grimp (the library behind ``lint-imports``) reads them; what a statement does not name
(a package's names loaded on first use, :mod:`headprobe.core.lazy`, and the package ``__init__`` Python runs
before a submodule) is not an edge. A circle is named with the lines that close it."""

from __future__ import annotations

from collections import deque
from itertools import pairwise

import grimp
import pytest

PACKAGES = ("headprobe", "trainer", "figures")


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The sets of modules that reach each other (Tarjan's algorithm, without recursion), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges[target]))))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                found.append(sorted(group))
    return found


def _circle(edges: dict[str, set[str]], group: list[str]) -> list[str]:
    """The shortest chain of imports from the first module of ``group`` back to it, within ``group``."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(edges[module] & members):
            if target == start:
                chain = [module]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return [*reversed(chain), start]
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    raise AssertionError(f"{group} is not a circle")


def import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """One circle (``[a, b, ..., a]``) per set of modules of ``graph`` that import each other, directly or
    through others; a module that imports itself is a circle of one."""
    edges = {m: graph.find_modules_directly_imported_by(m) & graph.modules for m in graph.modules}
    groups = _strongly_connected(edges)
    return [_circle(edges, g) for g in groups if len(g) > 1 or g[0] in edges[g[0]]]


def describe(graph: grimp.ImportGraph, circle: list[str]) -> str:
    """A circle as the import lines that close it, one per line."""
    steps = []
    for importer, imported in pairwise(circle):
        details = graph.get_import_details(importer=importer, imported=imported)
        where = f"line {details[0]['line_number']}: {details[0]['line_contents']}" if details else "?"
        steps.append(f"  {importer} -> {imported} ({where})")
    return "\n".join(steps)


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert {"headprobe.core.errors", "headprobe.jobs.checkpoints", "trainer.train"} <= graph.modules
    circles = import_circles(graph)
    assert not circles, "import circles:\n" + "\n\n".join(describe(graph, c) for c in circles)


def _package(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    "back",
    [
        "from circled.low import value\n",  # at the top
        "def f():\n    from circled.low import value\n\n    return value\n",  # inside a function
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from circled.low import value\n",
    ],
)
def test_a_circle_is_found_however_it_is_imported_and_named(tmp_path, monkeypatch, back):
    """The check itself: a circle closed by an import at the top, in a function or under TYPE_CHECKING is
    found, and named with its lines; modules that only lead into it are not part of it."""
    _package(
        tmp_path / "circled",
        {
            "__init__.py": "",
            "low.py": "from circled.mid import other\n\nvalue = 1\n",
            "mid.py": "import circled.high\n\nother = 2\n",
            "high.py": back,
            "top.py": "from circled.low import value\n",  # into the circle, not part of it
            "apart.py": "from circled import top\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circled", cache_dir=None)
    circles = import_circles(graph)
    assert circles == [["circled.high", "circled.low", "circled.mid", "circled.high"]]
    text = describe(graph, circles[0])
    assert "circled.high -> circled.low (line " in text and "from circled.low import value" in text
    assert "circled.mid -> circled.high (line 1: import circled.high)" in text


def test_a_module_that_imports_itself_is_a_circle(tmp_path, monkeypatch):
    _package(tmp_path / "selfish", {"__init__.py": "", "one.py": "def f():\n    from selfish import one\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles(grimp.build_graph("selfish", cache_dir=None)) == [["selfish.one", "selfish.one"]]
