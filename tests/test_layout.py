"""Rules of the code base's shape that reading alone would let slip (the import direction itself is
checked by `lint-imports`, which `make test` runs first)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("headprobe", "trainer", "figures")
MAX_FUNCTION_LINES = 80


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_no_function_in_the_packages_is_longer_than_80_lines():
    long = []
    for path in _sources(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these functions:\n" + "\n".join(long)


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def test_tests_share_helpers_through_modules_not_other_tests():
    """Dense references live in tests/reference.py, small models in headprobe.testing, fixtures in
    conftest.py: no test imports another test module (or conftest)."""
    crossing = [
        f"{path.name} imports {name}"
        for path in _sources("tests")
        for name in _imports(path)
        if name.split(".")[0].startswith("test_") or name.split(".")[0] == "conftest"
    ]
    assert not crossing, crossing


def test_benchmarks_import_the_installed_package():
    edits = [p.name for p in _sources("benchmarks") if "sys.path" in p.read_text()]
    assert not edits, f"benchmarks edit sys.path: {edits}"


@pytest.mark.parametrize("module", ["headprobe.model.config", "headprobe.model.presets", "trainer.config"])
def test_light_modules_do_not_pull_in_torch(module):
    """`headprobe plan` and the CLI's option building import these; they must stay quick to import."""
    import subprocess
    import sys

    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_every_result_table_is_documented_with_its_columns():
    """docs/results.md lists every Schema defined in headprobe (found by importing every module), with
    every column."""
    import importlib
    import pkgutil

    import headprobe
    from headprobe.results import Schema

    schemas = {}
    for info in pkgutil.walk_packages(headprobe.__path__, "headprobe."):
        module = importlib.import_module(info.name)
        schemas |= {s.table: s for s in vars(module).values() if isinstance(s, Schema)}
    assert {"entropy", "retrieval", "analysis_summary", "ruler_scores", "shortctx_items"} <= set(schemas)
    docs = (ROOT / "docs" / "results.md").read_text()
    for table, schema in schemas.items():
        line = next((ln for ln in docs.splitlines() if ln.startswith(f"- **`{table}`**")), None)
        assert line is not None, f"docs/results.md does not list the table {table}"
        missing = [c.name for c in schema.columns if f"`{c.name}`" not in line]
        assert not missing, f"docs/results.md: {table} lacks the columns {missing}"


def test_docs_index_lists_every_module():
    """docs/index.md's layout has a line for every module of the two packages."""
    index = (ROOT / "docs" / "index.md").read_text()
    modules = [
        p.relative_to(ROOT).as_posix() for p in _sources(*PACKAGES) if p.name not in ("__init__.py", "__main__.py")
    ]
    missing = [m for m in modules if f"| `{m}` |" not in index]
    assert not missing, f"docs/index.md does not list {missing}"


def test_only_the_command_line_draws():
    """The library reports progress through headprobe.runs.Progress (or a callback) and errors in library
    terms; only headprobe/cli imports the UI libraries."""
    ui = {"rich", "typer", "tqdm", "click"}
    drawing = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _sources(*PACKAGES)
        if "cli" not in path.relative_to(ROOT).parts
        for name in _imports(path)
        if name.split(".")[0] in ui
    ]
    assert not drawing, drawing
