"""Hardening, third round (issue 37): what a newcomer trips on. Every command reads ``--prompt-format`` by one
rule and suggests only a format the model accepts; a wrapper file is named, not quoted; a checkpoint has one
name in results, logs and errors; ``ablate --from`` another model's results, or a folder of another command,
says so and what to give instead; ``figures --only`` names the table its figure needs. Each refusal is one
``error:`` line, exit code 2, before any work, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from cli_checks import invoke, refused, snapshot

from headprobe.ablation import AblateSettings
from headprobe.ablation.settings import AblateError, ranked_heads
from headprobe.analysis import AnalyzeSettings
from headprobe.evals.ruler.settings import RulerSettings
from headprobe.hooked import load_model
from headprobe.jobs.checkpoints import checkpoint_name
from headprobe.results import TableMeta, write_table
from headprobe.testing import tiny_checkpoint

WRAPPER = "<user>{task_template}</user>"


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """A tiny byte-level model (no chat template) in a grid's layout: its results name is toy-x-s0-pt-final."""
    root = tmp_path_factory.mktemp("grid")
    return tiny_checkpoint(root / "toy-x" / "s0" / "pt" / "final", vocab_size=264, max_seq_len=1024)


@pytest.mark.parametrize("settings", [AnalyzeSettings, AblateSettings, RulerSettings])
@pytest.mark.parametrize("value", ["auto", "chat", "plain", WRAPPER, "file"])
def test_every_command_takes_the_same_prompt_formats(settings, value, tmp_path):
    if value == "file":
        value = str(tmp_path / "wrapper.txt")
        Path(value).write_text(WRAPPER)
    kwargs = {"heads": ["0.0"]} if settings is AblateSettings else {}
    settings(prompt_format=value, **kwargs).validate()  # no error


COMMANDS = {
    "analyze": ["analyze", "{model}", "--metrics", "retrieval", "--lengths", "256"],
    "ablate": ["ablate", "{model}", "--heads", "0.0", "--lengths", "256"],
    "graft": ["graft", "{model}", "{model}", "--parts", "mlp", "--lengths", "256"],
    "ruler eval": ["ruler", "eval", "{model}", "--lengths", "512"],
    "explore": ["explore", "{model}", "--needle", "--length", "256", "--export", "{out}"],
}


def _command(name: str, model: Path, tmp: Path) -> tuple[list[str], Path]:
    """``name``'s command line on ``model``, and what it writes in ``tmp`` (a results folder; explore: a page)."""
    out = tmp / ("page.html" if name == "explore" else "out")
    args = [a.replace("{model}", str(model)).replace("{out}", str(out)) for a in COMMANDS[name]]
    return (args if name == "explore" else [*args, "--out", str(out), "--no-progress"]), out


@pytest.mark.parametrize("command", COMMANDS)
def test_a_wrapper_file_without_its_slot_is_named_not_quoted(command, toy, tmp_path):
    wrapper = tmp_path / "wrapper.txt"
    wrapper.write_text("You are helpful.\nAnswer:")
    args, out = _command(command, toy, tmp_path)
    res = invoke(*args, "--prompt-format", wrapper)
    line = refused(res, f"--prompt-format file {wrapper} holds no {{task_template}}", "exactly once")
    assert "You are helpful" not in line and not out.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_prompt_format_lists_every_accepted_value(command, toy, tmp_path):
    args, out = _command(command, toy, tmp_path)
    refused(invoke(*args, "--prompt-format", "chatml"), "--prompt-format 'chatml'", "choose auto, chat or plain",
            "a wrapper holding {task_template}")  # fmt: skip
    assert not out.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_chat_on_a_model_without_a_template_suggests_what_it_accepts(command, toy, tmp_path):
    """The toys have no chat template: the fix offered is plain or auto, never chat; the model is named by
    its results name (toy-x-s0-pt-final), not its folder's (final)."""
    args, _ = _command(command, toy, tmp_path)
    line = refused(invoke(*args, "--prompt-format", "chat"), "toy-x-s0-pt-final", "has no chat template",
                   "--prompt-format plain")  # fmt: skip
    assert "final:" not in line.replace("pt-final:", "") and "use --prompt-format chat" not in line


def test_analyze_puts_prompts_in_a_wrapper_string(toy, tmp_path):
    args, out = _command("analyze", toy, tmp_path)
    res = invoke(*args, "--samples", "1", "--prompt-format", WRAPPER)
    assert res.exit_code == 0, res.output
    samples = pd.read_parquet(out / "toy-x-s0-pt-final" / "retrieval_samples.parquet")
    assert set(samples["prompt_format"]) == {"custom"}


def test_a_checkpoint_has_one_name(toy):
    """The name a loaded model gives itself (in logs and errors) is its results name."""
    assert load_model(toy).name == checkpoint_name(toy) == "toy-x-s0-pt-final"


def _retrieval_folder(folder: Path, model: str, scores: dict[tuple[int, int], float]) -> Path:
    """An analyze output of ``model`` holding a retrieval table with these head scores, as analyze writes it."""
    rows = [{"model": model, "layer": layer, "head": head, "layer_type": "full", "value": v, "n_kept": 1,
             "n_samples": 1, "length": 256} for (layer, head), v in scores.items()]  # fmt: skip
    write_table(folder / model / "retrieval.parquet", pd.DataFrame(rows), TableMeta("retrieval", model))
    return folder


def test_figures_only_names_the_table_its_figure_needs(tmp_path):
    results = _retrieval_folder(tmp_path / "analyze", "toy", {(0, 0): 0.5, (0, 1): 0.0})
    out = tmp_path / "figs"
    res = invoke("figures", results, "--only", "ablation", "--out", out)
    refused(res, "--only ablation: nothing drawn", "ablation reads ablation.parquet (written by `headprobe ablate`)",
            f"{results} holds none it can use", "give the folder that `headprobe ablate` wrote")  # fmt: skip
    assert not out.exists()
    drawn = invoke("figures", results, "--only", "ablation,model_retrieval_heads", "--out", out)
    assert drawn.exit_code == 0 and (out / "model_retrieval_heads.png").is_file(), drawn.output  # one of two: drawn


@pytest.fixture(scope="module")
def two_layers(tmp_path_factory) -> Path:
    """A tiny model of 2 layers of 4 heads (the toy has 4 layers: 4, 4, 4, 2 heads)."""
    root = tmp_path_factory.mktemp("other")
    return tiny_checkpoint(root / "two" / "s0" / "pt" / "final", vocab_size=264, max_seq_len=1024, n_layers=2)


TOY_SCORES = {(layer, head): 0.5 if (layer, head) in {(3, 1), (1, 2)} else 0.0
              for layer in range(4) for head in range(2 if layer == 3 else 4)}  # fmt: skip


def test_ablate_from_results_of_another_shape_says_so_and_what_to_give(two_layers, tmp_path):
    """Results under this model's own name (as a table that records no checkpoint has it) but of a model of
    another shape: named with both shapes, not as a head the user never named ("has no head 3.1")."""
    results = _retrieval_folder(tmp_path / "analyze", "two-s0-pt-final", TOY_SCORES)
    out = tmp_path / "out"
    res = invoke("ablate", two_layers, "--from", results, "--heads", "top:2", "--lengths", "256", "--out", out)
    line = refused(res, f"--from {results} holds retrieval scores of another model than two-s0-pt-final",
                   "there has 4 layers (4, 4, 4, 2 heads), two-s0-pt-final has 2 layers of 4 heads",
                   f"run `headprobe analyze {two_layers} --metrics retrieval --out NEW_FOLDER`",
                   "give --from NEW_FOLDER")  # fmt: skip
    assert "no head" not in line and not out.exists()


def test_ablate_from_another_checkpoints_results_names_both(toy, two_layers, tmp_path):
    results = tmp_path / "analyze"
    done = invoke("analyze", toy, "--metrics", "retrieval", "--lengths", "256", "--samples", "1", "--out", results,
                  "--no-progress")  # fmt: skip
    assert done.exit_code == 0, done.output
    out = tmp_path / "out"
    res = invoke("ablate", two_layers, "--from", results, "--heads", "top:2", "--lengths", "256", "--out", out)
    refused(res, f"--from {results} holds retrieval scores of toy-x-s0-pt-final", "not of two-s0-pt-final",
            f"run `headprobe analyze {two_layers} --metrics retrieval --out NEW_FOLDER`")  # fmt: skip
    assert not out.exists()


def test_ablate_from_a_folder_of_another_command_suggests_an_analysis_that_works(toy, tmp_path):
    """The fix offered is an analysis into a new folder: analyze refuses a folder of another command."""
    ruler = tmp_path / "ruler"
    done = invoke("ruler", "eval", toy, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1",
                  "--out", ruler, "--no-progress")  # fmt: skip
    assert done.exit_code == 0, done.output
    held = snapshot(ruler)
    res = invoke("ablate", toy, "--from", ruler, "--heads", "top:2", "--lengths", "256", "--out", tmp_path / "out")
    line = refused(res, f"--from {ruler} holds no retrieval table", "--out NEW_FOLDER", "give --from NEW_FOLDER")
    assert f"--out {ruler}" not in line
    command = line.split("run `headprobe ")[1].split("`")[0].replace("NEW_FOLDER", str(tmp_path / "new")).split()
    assert invoke(*command, "--lengths", "256", "--samples", "1", "--no-progress").exit_code == 0  # as offered: works
    assert snapshot(ruler) == held


@pytest.mark.parametrize(("chat_template", "offers_chat"), [(False, False), (True, True)])
def test_a_ranking_without_scores_offers_chat_only_to_a_model_with_a_template(tmp_path, chat_template, offers_chat):
    rows = [{"model": "m", "layer": 0, "head": h, "layer_type": "full", "value": float("nan"), "n_kept": 0,
             "n_samples": 2, "length": 256} for h in range(2)]  # fmt: skip
    meta = TableMeta("retrieval", "m", settings={"prompt_format": "plain", "needles": "builtin"},
                     model_facts={"chat_template": chat_template})  # fmt: skip
    write_table(tmp_path / "m" / "retrieval.parquet", pd.DataFrame(rows), meta)
    with pytest.raises(AblateError, match="scores no head") as err:
        ranked_heads(tmp_path, None, "m")
    assert ("--prompt-format chat" in str(err.value)) == offers_chat
    assert ("--needles codes" in str(err.value)) == (not chat_template)
