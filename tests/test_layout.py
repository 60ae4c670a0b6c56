"""Rules of the code base's shape that reading alone would let slip (the import direction itself is
checked by `lint-imports`, which `make test` runs first)."""

from __future__ import annotations

import ast
import re
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


@pytest.mark.parametrize(
    "module",
    [
        "headprobe.model.config",
        "headprobe.model.presets",
        "trainer.config",
        "headprobe.analysis.settings",  # the command line builds analyze's options from it
        "headprobe.evals.ruler.settings",  # and ruler eval's (and ruler generate's)
        "headprobe.ablation.settings",  # and ablate's
        "headprobe.evals.shortctx.settings",  # and shortctx eval's
        "headprobe.cli",  # every command's options built, none of its work loaded
        "headprobe.evals.ruler.resolve",  # ruler eval's settings made concrete, before any model loads
        "headprobe.jobs.parts",  # a job's finished parts (the results format and the foundation only)
    ],
)
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
    from headprobe.metrics import METRICS  # and every metric's tables, those made by a function too

    schemas |= {s.table: s for m in METRICS.values() for s in m.tables}
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
    """The library reports progress through headprobe.core.progress.Progress (or a callback) and errors in library
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


def _modules(*packages: str) -> set[str]:
    """Every module file of ``packages`` (``__init__`` and ``__main__`` aside), as a path from the root."""
    return {
        str(p.relative_to(ROOT))
        for p in _sources(*packages)
        if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts
    }


def test_docs_index_has_one_row_for_every_module_and_none_for_a_module_that_is_gone():
    text = (ROOT / "docs" / "index.md").read_text()
    rows = [line.split("`")[1] for line in text.splitlines() if line.startswith("| `") and ".py`" in line]
    assert len(rows) == len(set(rows)), sorted(r for r in rows if rows.count(r) > 1)
    listed = {r for r in rows if r.startswith(PACKAGES)}
    modules = _modules(*PACKAGES)
    assert not modules - listed, f"modules without a row in docs/index.md: {sorted(modules - listed)}"
    assert not listed - modules, f"rows of docs/index.md naming no module: {sorted(listed - modules)}"


def test_the_readme_layout_names_every_module_of_each_package_it_describes():
    """The README's layout table: a row per headprobe package (and top-level module), each naming every
    module of its package (``kernels/attention.py`` for a subpackage's) and none that is gone."""
    rows = {
        line.split("`")[1]: line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("| `headprobe/")
    }
    packages = sorted(p.name for p in (ROOT / "headprobe").iterdir() if (p / "__init__.py").is_file())
    assert {f"headprobe/{p}/" for p in packages} <= set(rows), sorted(set(rows))
    problems = []
    for package in packages:
        row = rows[f"headprobe/{package}/"]
        named = set(re.findall(r"`([\w/]+\.py)`", row))
        folder = ROOT / "headprobe" / package
        have = {str(p.relative_to(folder)) for p in folder.rglob("*.py") if p.name != "__init__.py"}
        problems += [f"headprobe/{package}/{m}: not in its README row" for m in sorted(have - named)]
        problems += [f"headprobe/{package}/{m}: named in the README, not there" for m in sorted(named - have)]
    top = {p.name for p in (ROOT / "headprobe").glob("*.py")} - {"__init__.py", "__main__.py"}
    in_rows = " ".join(line for name, line in rows.items() if not name.endswith("/"))
    problems += [
        f"headprobe/{m}: no README row" for m in sorted(top) if f"`{m[:-3]}" not in in_rows and m not in in_rows
    ]
    assert not problems, "\n".join(problems)


def test_the_layers_in_docs_index_are_the_import_contracts_layers():
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    expected = [{n.strip().removeprefix("headprobe.") for n in layer.split("|")} for layer in layers]
    text = (ROOT / "docs" / "index.md").read_text()
    block = text.split("## Layout", 1)[1].split("```")[1]
    documented = [
        {n.strip() for n in line.split("  ")[0].split("|")}
        for line in block.strip().splitlines()
        if line.strip() and not line.startswith("trainer")
    ]
    assert documented == expected


def _indexed(doc: str) -> list[str]:
    """The names in the first column of a docstring's module table (an rST simple table between two rules)."""
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+( +=+)+", line.strip())]
    if len(rules) < 2:
        return []
    return [line.split()[0] for line in lines[rules[0] + 1 : rules[1]] if line.strip() and not line[0].isspace()]


def test_every_package_docstring_lists_exactly_its_modules():
    """docs/index.md calls each package's docstring its index: every module and subpackage is in its table, and
    nothing is that is not (a folder of assets says so with its trailing ``/``). The top package's index is
    the README's layout table."""
    wrong = []
    for init in sorted((ROOT / "headprobe").rglob("__init__.py")):
        folder = init.parent
        if folder == ROOT / "headprobe":
            continue
        modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        modules |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
        assets = {f"{p.name}/" for p in folder.iterdir() if p.is_dir() and not (p / "__init__.py").is_file()}
        listed = set(_indexed(ast.get_docstring(ast.parse(init.read_text())) or ""))
        missing, extra = sorted(modules - listed), sorted(listed - modules - assets)
        if missing or extra:
            wrong.append(f"{folder.relative_to(ROOT)}: not listed {missing}, listed but absent {extra}")
    assert not wrong, "package docstrings out of date:\n" + "\n".join(wrong)


def test_the_index_reader_reads_a_hand_written_table():
    doc = "Intro.\n\n====  ====\nab    one\n      more of one\ncd    two\n====  ====\n\nAfter."
    assert _indexed(doc) == ["ab", "cd"]
    assert _indexed("No table here.") == []
