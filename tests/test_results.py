"""The results format and the job plumbing every job shares (headprobe.results, headprobe.core, headprobe.jobs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headprobe.core.progress import Silent
from headprobe.core.resume import resume_key
from headprobe.hooked import ModelLoadError
from headprobe.jobs.checkpoints import checkpoint_name, run_each, run_models
from headprobe.jobs.memory import DoesNotFit, MemoryBudget, require_fits
from headprobe.jobs.parts import Parts
from headprobe.jobs.provenance import table_meta
from headprobe.jobs.record import RunReport
from headprobe.model.budget import MemoryEstimate
from headprobe.results import Column, ResultsError, Schema, TableMeta, collect, read_meta, read_table, write_table

SCHEMA = Schema("toy_table", (Column("layer", "int"), Column("value", "float", "the number"), Column("kind", "str")))


def frame(model: str = "m", n: int = 3) -> pd.DataFrame:
    return pd.DataFrame({"value": [0.5] * n, "extra": list(range(n)), "layer": list(range(n)), "kind": ["a"] * n})


def test_a_table_round_trips_with_its_provenance(tmp_path):
    meta = table_meta("toy_table", "m", tmp_path / "ck", {"lengths": (1, 2), "rows": "last:4"}, key={"a": 1})
    write_table(tmp_path / "t.parquet", frame().assign(model="m"), meta, SCHEMA)
    table = read_table(tmp_path / "t.parquet")
    # the schema's columns in its order, the model first, extra columns after
    assert list(table.frame.columns) == ["model", "layer", "value", "kind", "extra"]
    assert table.meta.settings == {"lengths": [1, 2], "rows": "last:4"}  # as JSON holds it
    assert table.meta.key == {"a": 1} and table.meta.model == "m" and table.meta.checkpoint == str(tmp_path / "ck")
    assert table.meta.command and "torch" in table.meta.versions and table.meta.created.endswith("+00:00")
    assert read_meta(tmp_path / "t.parquet") == table.meta


def test_the_schema_refuses_missing_and_mistyped_columns(tmp_path):
    with pytest.raises(ResultsError, match=r"lacks the columns \['kind'\]"):
        write_table(tmp_path / "a.parquet", frame().drop(columns="kind"), TableMeta("toy_table"), SCHEMA)
    with pytest.raises(ResultsError, match=r"mistyped columns: layer"):
        write_table(tmp_path / "b.parquet", frame().assign(layer=["x", "y", "z"]), TableMeta("toy_table"), SCHEMA)
    assert not list(tmp_path.iterdir())  # nothing written, no temporary left behind


def test_a_failed_write_leaves_the_old_table(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    write_table(path, frame(n=2), TableMeta("toy_table"), SCHEMA)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(KeyboardInterrupt):
        write_table(path, frame(n=5), TableMeta("toy_table"), SCHEMA)
    assert len(read_table(path).frame) == 2 and os.listdir(tmp_path) == ["t.parquet"]


def test_foreign_and_missing_files_are_named(tmp_path):
    with pytest.raises(ResultsError, match="does not exist"):
        read_table(tmp_path / "none.parquet")
    pq.write_table(pa.Table.from_pandas(frame()), tmp_path / "plain.parquet")
    with pytest.raises(ResultsError, match="not a headprobe result table"):
        read_table(tmp_path / "plain.parquet")
    assert read_meta(tmp_path / "plain.parquet") is None and read_meta(tmp_path / "none.parquet") is None


def test_collect_reads_one_table_over_every_model(tmp_path):
    for model, n in (("a", 2), ("b", 3)):
        write_table(tmp_path / model / "toy_table.parquet", frame(n=n).assign(model=model), TableMeta("toy_table"))
    write_table(tmp_path / "c" / "other.parquet", frame().assign(model="c"), TableMeta("other"))
    both = collect(tmp_path, "toy_table")
    assert sorted(both.model.unique()) == ["a", "b"] and len(both) == 5
    assert collect(tmp_path, "missing").empty


def test_resume_keys_compare_equal_after_a_json_round_trip():
    key = resume_key(lengths=(1, 2), path=Path("/x"), rows=None)
    assert key == json.loads(json.dumps(key)) == {"lengths": [1, 2], "path": "/x", "rows": None}


def test_parts_are_done_only_with_the_same_key(tmp_path):
    parts = Parts(tmp_path)
    assert not parts.done("toy_table", "256", {"a": 1})
    parts.write(SCHEMA, "256", frame(n=2), TableMeta("toy_table", key={"a": 1}))
    parts.write(SCHEMA, "512", frame(n=3), TableMeta("toy_table", key={"a": 1}))
    assert parts.done("toy_table", "256", {"a": 1}) and not parts.done("toy_table", "256", {"a": 2})
    assert parts.path("toy_table", "256") == tmp_path / "parts" / "toy_table-256.parquet"
    assert len(parts.gather("toy_table", ["256", "512"])) == 5


def test_checkpoint_names():
    assert checkpoint_name("runs/grid/toy-d16/sft/final").endswith("toy-d16-sft-final")
    assert checkpoint_name("runs/grid/toy-d16/s2/cpt/final") == "toy-d16-s2-cpt-final"  # a grid seed folder
    assert checkpoint_name("runs/x/step_000100").endswith("x-step_000100")
    assert checkpoint_name("models/qwen2") == "qwen2"


def test_run_each_isolates_expected_failures_only(tmp_path):
    def job(path: Path, name: str) -> int:
        if name == "missing":
            raise ModelLoadError(f"model folder {path} does not exist")
        if name == "big":
            raise DoesNotFit("needs about 9 GiB")
        if name == "bug":
            raise KeyError("a bug, not bad input")
        return len(name)

    report = run_each([tmp_path / "a", tmp_path / "missing", tmp_path / "big", tmp_path / "ccc"], job, Silent())
    assert report.results == {"a": 1, "ccc": 3} and set(report.errors) == {"missing", "big"}
    assert "does not exist" in report.errors["missing"] and report.checkpoints["ccc"] == str(tmp_path / "ccc")
    with pytest.raises(KeyError):  # a bug propagates
        run_each([tmp_path / "bug"], job, Silent())
    with pytest.raises(ValueError, match="share a results folder"):
        run_each([tmp_path / "a", tmp_path / "x" / ".." / "a"], job, Silent())


def test_run_models_writes_each_model_into_its_folder_one_as_several(tmp_path):
    seen = []

    def job(path: Path, folder: Path, name: str) -> str:
        seen.append((name, folder))
        if name == "bad":
            raise ModelLoadError("cannot load")
        return name

    one = run_models([tmp_path / "a"], tmp_path / "out", job, Silent(), ("toy job", {"s": 1}))
    assert seen == [("a", tmp_path / "out" / "a")] and isinstance(one, RunReport)
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert (
        record["job"] == "toy job"
        and record["settings"] == {"s": 1}
        and record["checkpoints"] == {"a": str(tmp_path / "a")}
    )
    with pytest.raises(ModelLoadError):  # a single checkpoint's failure is the run's
        run_models([tmp_path / "bad"], tmp_path / "out2", job, Silent(), ("toy job", {}))
    seen.clear()
    many = run_models([tmp_path / "a", tmp_path / "bad"], tmp_path / "out3", job, Silent(), ("toy job", {}))
    assert seen == [("a", tmp_path / "out3" / "a"), ("bad", tmp_path / "out3" / "bad")]
    assert many.results == {"a": "a"} and json.loads((tmp_path / "out3" / "run.json").read_text())["errors"] == {
        "bad": "cannot load"
    }


def test_require_fits_refuses_over_ninety_percent_with_the_estimate():
    estimate = MemoryEstimate(weights=2**30, activations=2**30, statistics=0, kv_cache=2**29)  # 2.5 GiB
    require_fits("m at 4,096 tokens", estimate, MemoryBudget(3 * 2**30), fix="use shorter `lengths`")  # 83%: fits
    with pytest.raises(DoesNotFit, match=r"m at 4,096 tokens needs about 2\.50 GiB .*only 2\.6 GiB is available; use"):
        require_fits("m at 4,096 tokens", estimate, MemoryBudget(int(2.6 * 2**30)), fix="use shorter `lengths`")
    # a limit the user gave is named, and raising it is the first fix
    with pytest.raises(DoesNotFit, match=r"but `memory_limit` allows only 2\.6 GiB; raise `memory_limit`, or use"):
        require_fits("m", estimate, MemoryBudget(int(2.6 * 2**30), limited=True), fix="use shorter `lengths`")
