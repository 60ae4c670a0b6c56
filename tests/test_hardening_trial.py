"""Hardening, third round (issue 37), a new user's trial of the fixed tree: numbers that are not finite
(``--lr inf``, ``--memory-limit inf``) and a training run that diverged (it exited 0 with a final/ of NaN
weights), a top-k or length so large the run tried to allocate terabytes, short-context items of the wrong
types, a checkpoint of NaN weights, data folders larger than the disk and binary sources, a checkpoint's own
tokenizer, two checkpoints of one results name, small vague messages, and a signal arriving as a command's
work ends. Each refusal is one ``error:`` line naming the problem and the fix, and writes nothing."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_checks import WIDE, invoke, one_error, refused, snapshot

from headprobe.analysis.settings import AnalyzeError, AnalyzeSettings
from headprobe.core.settings import MAX_TOKENS, Range
from headprobe.metrics.attention import kendall_reordering
from headprobe.metrics.erank import ErankCollector, NonFiniteError
from headprobe.model.budget import KENDALL_PAIRS, kendall_chunk, statistics_bytes
from headprobe.model.checkpoint import load_checkpoint, save_checkpoint
from headprobe.testing import tiny_checkpoint

ANALYZE = ["--metrics", "entropy", "--lengths", "64", "--samples", "1", "--no-progress"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", vocab_size=264, max_seq_len=1024)


@pytest.fixture(scope="module")
def nan_ckpt(tmp_path_factory, ckpt) -> Path:
    """The tiny model with every weight NaN, as a run trained until it diverged left it."""
    model, _ = load_checkpoint(ckpt)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
    return save_checkpoint(model, tmp_path_factory.mktemp("nan") / "diverged")


# -- 1. numbers that are not finite ----------------------------------------------------------------------------
def test_the_range_rule_refuses_inf_and_nan_whatever_the_bounds():
    assert Range(above=0).refusal(math.inf) == "give a finite value above 0, got inf"
    assert Range(minimum=0, maximum=1).refusal(math.nan) == "give a finite value from 0 to 1, got nan"
    assert Range(minimum=0).refusal(-math.inf) == "give a finite value of at least 0, got -inf"
    assert Range(minimum=0, below=1).refusal([0.5, math.nan]) == (
        "give a finite value of at least 0 and below 1, got nan"
    )
    assert Range(minimum=1, maximum=MAX_TOKENS).refusal(MAX_TOKENS + 1) == (
        f"give a value from 1 to {MAX_TOKENS}, got {MAX_TOKENS + 1}"  # a bound in full, never 1.67772e+07
    )
    assert Range(above=0).refusal(1e308) is None  # finite is all this rule asks beyond the bounds


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["train", "--lr", "inf"], "--lr: give a finite value above 0, got inf"),
        (["train", "--lr", "nan"], "--lr: give a finite value above 0, got nan"),
        (["train", "--beta1", "nan"], "--beta1: give a finite value of at least 0 and below 1, got nan"),
        (["train", "--grad-clip", "inf"], "--grad-clip: give a finite value of at least 0, got inf"),
        (["analyze", "{ckpt}", "--memory-limit", "inf"], "--memory-limit: give a finite value above 0, got inf"),
        (["ablate", "{ckpt}", "--heads", "1.0", "--memory-limit", "inf"], "--memory-limit: give a finite value"),
        (["ruler", "eval", "{ckpt}", "--memory-limit", "inf"], "--memory-limit: give a finite value above 0, got inf"),
        (["ablate", "{ckpt}", "--heads", "1.0", "--depths", "50,nan"], "--depths: give a finite value from 0 to 100"),
    ],
)  # fmt: skip
def test_inf_and_nan_are_refused_for_every_float_before_any_work(tmp_path, ckpt, args, says):
    """--memory-limit inf ended in an OverflowError traceback; --lr inf trained a final/ of NaN weights."""
    out = tmp_path / "out"
    args = [a.format(ckpt=ckpt) for a in args]
    if args[0] == "train":
        args += ["--preset", "toy-d16", "--steps", "2", "--batch-size", "2", "--seq-len", "64", "--no-progress"]
    refused(invoke(*args, "--out", out), says)
    assert not out.exists()


def train_tiny(ckpt: Path, out: Path, steps: int, *extra: str):
    return invoke("train", "--config", ckpt / "config.json", "--steps", str(steps), "--batch-size", "2",
                  "--seq-len", "32", "--no-progress", "--out", out, *extra)  # fmt: skip


def test_a_training_loss_that_stops_being_finite_ends_the_run_without_a_final_checkpoint(tmp_path, ckpt):
    """--lr 1e308 is a finite value, so the range rule allows it; the loss is NaN from step 2 on, and the run
    exited 0 with 'last loss nan' and a final/ of NaN weights."""
    out = tmp_path / "run"
    refused(train_tiny(ckpt, out, 3, "--lr", "1e308"), "the training loss became nan at step 2 of 3",
            "the run diverged, so no final/ was written", "train again with a lower --lr than 1e+308")  # fmt: skip
    assert not out.exists()  # it failed before its first step checkpoint: nothing is left


def test_weights_that_stop_being_finite_in_the_last_step_are_not_written_either(tmp_path, ckpt):
    """One step: its loss was measured on the finite initial weights, and the update made them NaN."""
    out = tmp_path / "run"
    refused(train_tiny(ckpt, out, 1, "--lr", "1e308"), "the weights stopped being finite numbers at step 1 of 1",
            "no final/ was written", "a lower --lr")  # fmt: skip
    assert not out.exists()


def test_a_diverged_run_keeps_its_earlier_step_checkpoints_and_says_so(tmp_path, ckpt):
    out = tmp_path / "run"
    line = refused(train_tiny(ckpt, out, 3, "--lr", "1e308", "--save-every", "1"), "at step 2 of 3",
                   "its step checkpoints up to step_000001 are kept", "into a new --out")  # fmt: skip
    assert "final/ was written" not in line.replace("no final/ was written", "")
    assert not (out / "final").exists() and (out / "step_000001").is_dir()


# -- 2. a top-k beyond the length -------------------------------------------------------------------------------
def test_a_topk_beyond_the_longest_length_is_refused_before_work(tmp_path, ckpt):
    """It tried to allocate 5 TB for the pairwise comparison of 100,000 top keys."""
    out = tmp_path / "out"
    res = invoke("analyze", ckpt, "--metrics", "reordering", "--lengths", "128", "--samples", "1", "--topk", "100000",
                 "--out", out)  # fmt: skip
    refused(res, "--topk 100,000 is more than the longest of --lengths (128 tokens)", "give --topk from 2 to 128")
    assert not out.exists()
    AnalyzeSettings(metrics=["entropy"], lengths=[128], topk=100_000).validate()  # unused without reordering
    with pytest.raises(AnalyzeError, match="`topk` 129 is more than"):
        AnalyzeSettings(metrics=["reordering"], lengths=[64, 128], topk=129).validate()


def test_the_memory_estimate_counts_the_pairs_token_reordering_compares(ckpt):
    model, _ = load_checkpoint(ckpt)
    layers = model.cfg.layer_infos()
    assert kendall_chunk(16) == KENDALL_PAIRS // 256 and kendall_chunk(100_000) == 1
    small, large = statistics_bytes(layers, 4096, 16), statistics_bytes(layers, 4096, 4096)
    assert large - small >= 48 * 4096 * 4096  # at least one row of 4,096 x 4,096 pairs of 48 bytes
    # chunked by the memory it takes, the result is the same as row by row
    idx = torch.stack([torch.randperm(40)[:32] for _ in range(6)])
    prob = torch.rand(6, 32).softmax(-1)
    assert torch.equal(kendall_reordering(idx, prob), kendall_reordering(idx, prob, chunk=1))


def test_a_large_topk_that_does_not_fit_is_refused_by_the_estimate_naming_topk(tmp_path, ckpt):
    out = tmp_path / "out"
    res = invoke("analyze", ckpt, "--metrics", "reordering", "--lengths", "1024", "--samples", "1", "--topk", "1024",
                 "--memory-limit", "0.1", "--out", out)  # fmt: skip
    refused(res, "needs about", "but --memory-limit allows only 0.1 GiB", "or a smaller --topk (1,024 now)")
    assert not out.exists()


# -- 3. lengths have an upper bound -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["ruler", "generate", "--tasks", "niah_single_1", "--lengths", "9999999999999", "--samples", "1",
          "--out", "{out}"], "--lengths '9999999999999': 9,999,999,999,999 tokens is more than any command takes"),
        (["analyze", "{ckpt}", "--lengths", "4096,20000000", "--out", "{out}"], "20,000,000 tokens is more than"),
        (["ablate", "{ckpt}", "--heads", "1.0", "--lengths", "20000k", "--out", "{out}"],
         "20,480,000 tokens is more than any command takes (at most 16,777,216"),
        (["ruler", "eval", "{ckpt}", "--lengths", "20000000", "--out", "{out}"], "at most 16,777,216, 16384k"),
        (["explore", "{ckpt}", "--needle", "--length", "20000000", "--export", "{out}"],
         "--length: give a value from 1 to 16777216, got 20000000"),
    ],
)  # fmt: skip
def test_token_counts_have_an_upper_bound_everywhere(tmp_path, ckpt, args, says):
    """ruler generate --lengths 9999999999999 ended in a MemoryError traceback."""
    out = tmp_path / "out"
    refused(invoke(*[a.format(ckpt=ckpt, out=out) for a in args]), says)
    assert list(tmp_path.iterdir()) == []


def test_the_library_holds_lengths_to_the_same_bound():
    with pytest.raises(AnalyzeError, match=rf"`lengths`: give a value from 16 to {MAX_TOKENS}, got {MAX_TOKENS + 1}"):
        AnalyzeSettings(lengths=[MAX_TOKENS + 1]).validate()


# -- 4. short-context items of the wrong types ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("item", "says"),
    [
        ({"context": "q", "choices": [" a", " b"], "label": "zero"},
         ["line 2: 'label' is a string (\"zero\"), not a whole number", "0-based index", "from 0 to 1"]),
        ({"context": "q", "choices": [" a", " b"], "label": 1.9}, ["'label' is a number (1.9), not a whole number"]),
        ({"context": "q", "choices": [" a", " b"], "label": True}, ["'label' is a boolean (true)"]),
        ({"context": "q", "choices": [" a", " b"], "label": 2}, ["'label' is 2, not an index into the 2 choices"]),
        ({"context": "q", "choices": [" a", 5], "label": 0},
         ["line 2: 'choices' item 1 is a number (5), not text", "give every choice as a JSON string"]),
        ({"context": "q", "choices": "ab", "label": 0},
         ["line 2: 'choices' is a string (\"ab\"), not a list", "give a list of the choices as JSON strings"]),
        ({"context": "q", "choices": [], "label": 0}, ["'choices' is an empty list"]),
        ({"context": None, "choices": [" a", " b"], "label": 0}, ["line 2: 'context' is null, not text"]),
        ({"choices": [" a", " b"], "label": 0}, ["line 2: an item lacks the field 'context'"]),
        ([1, 2], ["line 2: an item is a JSON object, got a list ([1, 2])"]),
    ],
)  # fmt: skip
def test_each_field_of_a_shortctx_item_is_checked_naming_the_file_line_and_field(tmp_path, ckpt, item, says):
    """ "label": "zero", a number among the choices and "context": null ended in tracebacks; 1.9 was read as 1,
    and "choices": "ab" was reported as a label out of range."""
    data = tmp_path / "items.jsonl"
    good = {"context": "2+2=", "choices": [" 4", " 5"], "label": 0}
    data.write_text(json.dumps(good) + "\n" + json.dumps(item) + "\n")
    out = tmp_path / "out"
    refused(invoke("shortctx", "eval", ckpt, "--task", "jsonl", "--file", data, "--out", out), f"{data} line 2", *says)
    assert not out.exists()


def test_other_benchmark_files_are_checked_the_same_way(tmp_path):
    from headprobe.evals.shortctx.items import ShortCtxError, load_task

    wino = tmp_path / "wino.jsonl"
    wino.write_text(json.dumps({"sentence": "A _ b.", "option1": "x", "option2": "y", "answer": "3"}) + "\n")
    with pytest.raises(ShortCtxError, match=r"line 1: 'answer' is 3, not an index into the 2 choices; give the 1-"):
        load_task("winogrande", wino)
    wino.write_text(json.dumps({"sentence": "A _ b.", "option1": "x", "option2": "y", "answer": "2"}) + "\n")
    assert load_task("winogrande", wino)[0].label == 1
    hella = tmp_path / "hella.jsonl"
    hella.write_text(json.dumps({"activity_label": "a", "ctx_a": "b", "ctx_b": None, "endings": ["c"], "label": 0}))
    with pytest.raises(ShortCtxError, match=r"line 1: 'ctx_b' is null, not text"):
        load_task("hellaswag", hella)


# -- 5. a checkpoint of NaN weights -----------------------------------------------------------------------------
def test_a_checkpoint_of_nan_weights_is_refused_naming_the_likely_cause(tmp_path, nan_ckpt):
    """analyze --metrics entropy,erank ended in torch's 'linalg.eigh failed to converge' traceback; ruler eval
    and shortctx eval reported scores of it."""
    out = tmp_path / "out"
    res = invoke("analyze", nan_ckpt, "--metrics", "entropy,erank", "--lengths", "64", "--samples", "1", "--out", out)
    refused(res, f"{nan_ckpt}: its weights are not finite numbers (38 of its 38 weight tensors hold NaN or inf)",
            "trained until it diverged", "lower learning rate")  # fmt: skip
    assert not out.exists()
    refused(invoke("shortctx", "eval", nan_ckpt, "--task", "builtin", "--out", out), "its weights are not finite")
    assert not out.exists()


def test_beside_other_checkpoints_it_is_one_failure_and_the_others_run(tmp_path, ckpt, nan_ckpt):
    out = tmp_path / "out"
    res = invoke("analyze", ckpt, nan_ckpt, *ANALYZE, "--out", out)
    one_error(res, 1, "diverged: ", "its weights are not finite numbers")
    assert (out / "tiny" / "entropy.parquet").is_file() and not (out / "diverged").exists()


def test_activations_that_are_not_finite_are_named_not_left_to_the_eigensolver():
    c = ErankCollector([])
    c.residual_stream(2, torch.tensor([[1.0, math.inf], [0.5, 1.0]]))
    with pytest.raises(NonFiniteError, match=r"not finite numbers \(NaN or inf\) at the output of block 2.*`dtype`"):
        c.frame()


# -- 6. and 7. data folders larger than the disk, binary sources ------------------------------------------------
def test_data_synth_refuses_a_folder_the_disk_cannot_hold_before_work(tmp_path):
    """--tokens 100000000000000 ran for 9.5 minutes (ETA 2925h) before it was killed."""
    out = tmp_path / "data"
    res = invoke("data", "synth", "--tokens", "100000000000000", "--out", out)
    refused(res, f"--out {out}: the data folder needs about 186,264.5 GiB (100,000,000,000,000 tokens x 2 bytes)",
            "but the disk that would hold it has", "GiB free", "give fewer --tokens, or an --out on")  # fmt: skip
    assert not out.exists()
    res = invoke("data", "synth", "--tokens", "100000000000000", "--tasks", "recall=1", "--out", out)
    refused(res, "(100,000,000,000,000 tokens x 3 bytes)")  # ids and loss masks


def test_data_prepare_refuses_sources_the_disk_cannot_hold(tmp_path, monkeypatch):
    import trainer.data

    source = tmp_path / "a.txt"
    source.write_text("hello world " * 100)
    monkeypatch.setattr(trainer.data, "_free_bytes", lambda out: 1000)
    out = tmp_path / "data"
    refused(invoke("data", "prepare", source, "--out", out), "tokenising 1,200 bytes of sources needs about",
            "(1,200 tokens x 2 bytes), but the disk that would hold it has 0.0 GiB free",
            "give fewer or smaller sources")  # fmt: skip
    assert not out.exists()


def test_data_prepare_refuses_a_binary_source_naming_it(tmp_path):
    """A token shard given as a source was tokenised as text (its NUL bytes are valid UTF-8)."""
    shards = tmp_path / "d1"
    assert invoke("data", "synth", "--tokens", "2000", "--out", shards).exit_code == 0
    text = tmp_path / "t1.txt"
    text.write_text("some text\n")
    out = tmp_path / "d2"
    refused(invoke("data", "prepare", text, shards / "shard_00000.bin", "--out", out),
            f"source {shards / 'shard_00000.bin'} is not text: it holds NUL bytes",
            "give text, JSONL or Parquet files")  # fmt: skip
    assert not out.exists()


def test_data_prepare_names_the_columns_a_parquet_file_has_and_the_one_it_needs(tmp_path):
    import pandas as pd

    source = tmp_path / "x.parquet"
    pd.DataFrame({"body": ["hello world"]}).to_parquet(source)
    out = tmp_path / "d"
    line = refused(invoke("data", "prepare", source, "--out", out),
                   f"{source} has no 'text' column", "(its columns: body); rename the column")  # fmt: skip
    assert "__fragment_index" not in line
    assert not out.exists()


# -- 8. a checkpoint's own tokenizer ----------------------------------------------------------------------------
def test_ruler_generate_takes_a_byte_checkpoint_as_its_tokenizer(tmp_path, ckpt):
    """The docs say a model folder is accepted; a byte checkpoint (no tokenizer.json) was refused as
    'tokenizer file .../tokenizer.json does not exist'."""
    data = tmp_path / "s.jsonl"
    res = invoke("ruler", "generate", "--tokenizer", ckpt, "--tasks", "niah_single_1", "--lengths", "512",
                 "--samples", "1", "--out", data)  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert [r["tokenizer"] for r in rows] == ["byte"]


# -- 9. two checkpoints of one results name ---------------------------------------------------------------------
def test_two_checkpoints_of_one_results_name_are_named_with_a_fix_that_works(tmp_path, ckpt):
    import shutil

    paths = []
    for grid in ("x1", "x2"):
        paths.append(tmp_path / grid / "g" / "m" / "final")
        shutil.copytree(ckpt, paths[-1])
    out = tmp_path / "S" / "both"
    line = refused(invoke("analyze", *paths, *ANALYZE, "--out", out),
                   f"{paths[0]} and {paths[1]} would share a results folder, {out / 'g-m-final'}",
                   "(both are named g-m-final", "each into its own --out",
                   f"e.g. {tmp_path / 'S' / 'both-1'} and {tmp_path / 'S' / 'both-2'}")  # fmt: skip
    assert "['" not in line  # no Python list
    assert not (tmp_path / "S").exists()
    for i, path in enumerate(paths, 1):  # the fix works
        assert invoke("analyze", path, *ANALYZE, "--out", tmp_path / "S" / f"both-{i}").exit_code == 0


# -- 10. small messages -----------------------------------------------------------------------------------------
def test_a_config_with_max_seq_len_0_or_a_string_norm_eps_is_refused_naming_the_field(tmp_path, ckpt):
    import shutil

    for field, value, says in (
        ("max_seq_len", 0, "config.json: max_seq_len must be a positive integer, got 0"),  # was "--lengths up to 0"
        ("norm_eps", "x", "config.json: norm_eps must be a positive number, got 'x'"),  # was "'<=' not supported"
        ("tie_embeddings", "yes", "tie_embeddings must be true or false, got 'yes'"),
    ):
        bad = tmp_path / field
        shutil.copytree(ckpt, bad)
        config = json.loads((bad / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps({**config, field: value}))
        out = tmp_path / "out"
        refused(invoke("analyze", bad, *ANALYZE, "--out", out), says)
        assert not out.exists()
        refused(invoke("plan", "--config", bad / "config.json"), says)


def test_a_setting_left_out_is_named_by_what_it_means(tmp_path, ckpt):
    out = tmp_path / "out"
    assert invoke("analyze", ckpt, *ANALYZE, "--out", out).exit_code == 0
    before = snapshot(out)
    refused(invoke("analyze", ckpt, *ANALYZE, "--dtype", "float32", "--out", out),
            "(--dtype as saved there, 'float32' now)")  # fmt: skip  # was "--dtype None there"
    assert snapshot(out) == before


@pytest.mark.parametrize(
    ("recipe", "says"),
    [
        ("notes.txt", ["--recipe {tmp}/notes.txt is not a recipe: not valid JSON", "a built-in recipe: 0.6b, 3b, toy"]),
        ("list.json", ["--recipe {tmp}/list.json is not a recipe: a recipe is a JSON object"]),
        ("missing.json", ["--recipe {tmp}/missing.json does not exist, and no built-in recipe has that name"]),
        ("tiny", ["--recipe tiny does not exist, and no built-in recipe has that name", "0.6b, 3b, toy"]),
    ],
)  # fmt: skip
def test_a_recipe_that_is_not_one_says_so(tmp_path, monkeypatch, recipe, says):
    """study --recipe notes.txt said "no built-in recipe for scale 'notes.txt'"."""
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "list.json").write_text("[1, 2]\n")
    path = recipe if recipe == "tiny" else str(tmp_path / recipe)
    out = tmp_path / "out"
    refused(invoke("study", "--recipe", path, "--out", out), *(s.format(tmp=tmp_path) for s in says))
    assert not out.exists()


def test_demo_real_into_another_commands_folder_names_its_flag_and_its_command(tmp_path, ckpt):
    """It showed `out`, the command 'headprobe real-demo' (there is none) and a --debug hint."""
    out = tmp_path / "analyzed"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"job": "analyze"}))
    before = snapshot(out)
    res = invoke("demo", "--real", "--model", ckpt, "--out", out)
    refused(res, f"--out {out} holds the results of `headprobe analyze`, not the results of `headprobe demo --real`",
            "give `headprobe demo --real` another --out")  # fmt: skip
    assert "real-demo" not in res.output and "--debug" not in res.output
    assert snapshot(out) == before


def test_report_of_a_shortctx_folder_says_what_it_looked_for_and_where_those_tables_show(tmp_path, ckpt):
    results = tmp_path / "sc"
    res = invoke("shortctx", "eval", ckpt, "--task", "builtin", "--limit", "2", "--out", results, "--no-progress")
    assert res.exit_code == 0, res.output
    page = tmp_path / "r.html"
    refused(invoke("report", results, "--out", page), f"nothing to report from {results}: looked below it for",
            "tables (shortctx_scores) have no figure", f"`headprobe show {results}` prints them")  # fmt: skip
    assert not page.exists()


# -- 11. a signal as the work ends ------------------------------------------------------------------------------
LATE_SIGNAL = """
import os, signal, sys, time, types

class Late:  # freed as Python tears its modules down, after it has put the signals' default actions back
    def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.SIGINT, sleep=time.sleep):
        kill(pid, sig)
        sleep(0.2)

module = types.ModuleType("late_signal")
module.late = Late()
sys.modules["late_signal"] = module
from headprobe.cli import app
app(sys.argv[1:], prog_name="headprobe")
"""


@pytest.mark.parametrize(("args", "code"), [(["plan", "--scale", "toy"], 0), (["plan", "--scale", "nope"], 2)])
def test_a_signal_after_the_command_ended_leaves_its_exit_code(tmp_path, args, code):
    """A Ctrl-C arriving as a command's work ended (``timeout -s INT`` timed to its end) made the process exit
    as killed by SIGINT, 130 to a shell and no ``interrupted:`` line, after complete output: Python hands a
    signal back to its default action while it finalises, before torch is torn down. Deterministic here: the
    signal is sent from that teardown itself."""
    script = tmp_path / "late.py"
    script.write_text(LATE_SIGNAL)
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, **WIDE, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == code, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "interrupted:" not in done.stderr
