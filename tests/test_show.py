"""``headprobe show``: a results folder printed as tables; the numbers are the fixture's, computed by hand."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.results import TableMeta, write_table


def _write(folder, table: str, model: str, rows: list[dict]) -> None:
    frame = pd.DataFrame(rows).assign(model=model)
    write_table(folder / model / f"{table}.parquet", frame, TableMeta(table=table, model=model, checkpoint=model))


@pytest.fixture
def results(tmp_path):
    heads = [(1, 0, "full"), (1, 1, "full"), (0, 0, "sliding"), (0, 1, "sliding")]
    # model a: lengths 100 and 200; mean scores by head: 0.5, 0.05, 0.0, 0.3
    values_a = {100: [0.6, 0.1, 0.0, 0.2], 200: [0.4, 0.0, 0.0, 0.4]}
    _write(tmp_path, "retrieval", "a", [
        {"layer": l, "head": h, "layer_type": t, "value": values_a[n][i], "length": n}
        for n in values_a for i, (l, h, t) in enumerate(heads)
    ])  # fmt: skip
    _write(tmp_path, "retrieval", "b", [
        {"layer": l, "head": h, "layer_type": t, "value": v, "length": 100}
        for (l, h, t), v in zip(heads, [0.9, 0.8, float("nan"), 0.0], strict=True)
    ])  # fmt: skip
    _write(tmp_path, "entropy", "a", [
        {"layer": l, "head": h, "layer_type": t, "value": v, "length": 100}
        for (l, h, t), v in zip(heads, [1, 3, 0.5, 1.5], strict=True)
    ])  # fmt: skip
    _write(tmp_path, "ruler_scores", "a", [
        {"scope": "task", "task": "niah", "length": 1024, "score": 50.0},
        {"scope": "length", "length": 1024, "score": 12.5},
        {"scope": "length", "length": 2048, "score": 7.5},
        {"scope": "overall", "score": 10.0},
    ])  # fmt: skip
    return tmp_path


def show(*args: str):
    return CliRunner().invoke(app, ["show", *args], env={"COLUMNS": "200"})


def table_rows(text: str, title: str) -> list[list[str]]:
    """The body rows of the printed table titled ``title``, as stripped cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip().strip("│").split("│")])
    return rows


def test_top_heads_counts_means_and_scores_come_out_as_computed_by_hand(results):
    out = show(str(results), "--top", "2")
    assert out.exit_code == 0, out.output
    text = out.output
    # a: head (1,0) mean 0.5, then (0,1) 0.3; b: (1,0) 0.9, (1,1) 0.8 (heads that never copied are left out)
    assert table_rows(text, "retrieval: top 2 heads") == [
        ["a", "1", "0", "full", "0.500"], ["a", "0", "1", "sliding", "0.300"],
        ["b", "1", "0", "full", "0.900"], ["b", "1", "1", "full", "0.800"],
    ]  # fmt: skip
    # retrieval heads (> 0.1): a full 1 of 2 (0.05 is not), sliding 1 of 2; b full 2 of 2, sliding 0 of 2
    assert table_rows(text, "retrieval heads") == [["a", "1 of 2", "1 of 2"], ["b", "2 of 2", "0 of 2"]]
    # entropy means per layer type: full (1 + 3) / 2 = 2, sliding (0.5 + 1.5) / 2 = 1
    assert table_rows(text, "entropy: mean per layer type") == [["a", "2.000", "1.000"]]
    # RULER-style: the per-length rows and the overall one
    assert table_rows(text, "RULER-style score by length") == [["a", "12.500", "7.500", "10.000"]]


def test_a_folder_without_results_or_an_unknown_metric_is_a_clear_error(results, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = show(str(empty))
    assert out.exit_code == 2 and "holds none of the tables" in out.output and "headprobe analyze" in out.output
    out = show(str(results), "--metric", "loss")
    assert out.exit_code == 2 and "unknown --metric loss; choose from retrieval, entropy" in out.output
    out = show(str(tmp_path / "nowhere"))
    assert out.exit_code == 2 and "is not a folder" in out.output
