"""Hardening, third round (issue 37): what a newcomer trips on. Every command reads ``--prompt-format`` by one
rule and suggests only a format the model accepts; a wrapper file is named, not quoted; a checkpoint has one
name in results, logs and errors; ``ablate --from`` another model's results, or a folder of another command,
says so and what to give instead; ``figures --only`` names the table its figure needs. Each refusal is one
``error:`` line, exit code 2, before any work, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from cli_checks import invoke, refused

from headprobe.ablation import AblateSettings
from headprobe.analysis import AnalyzeSettings
from headprobe.evals.ruler.settings import RulerSettings
from headprobe.hooked import load_model
from headprobe.results import TableMeta, write_table
from headprobe.runs import checkpoint_name
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
