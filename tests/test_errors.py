"""Errors on purpose vs bugs (issue 30): every error headprobe raises on purpose derives from one base,
``HeadprobeError``, which the command shows as one line with its fix; any other exception is a bug and keeps
its traceback, and ``--debug`` shows the traceback of a refusal too."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from cli_checks import invoke, refused, run_command

import figures
import headprobe
import trainer
from headprobe.core.errors import HeadprobeError, SettingError


def _modules():
    for package in (headprobe, trainer, figures):
        yield package
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith("headprobe.model.kernels"):  # Triton, where it is installed; no errors there
                continue
            yield importlib.import_module(info.name)


def test_every_exception_class_of_the_packages_derives_from_the_one_base():
    own = {
        f"{cls.__module__}.{cls.__name__}": cls
        for module in _modules()
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseException)
        and not issubclass(cls, Warning)  # a warning is no error (ResultsWarning)
        and cls.__module__.split(".")[0] in ("headprobe", "trainer", "figures")
    }
    assert len(own) >= 25, sorted(own)  # the 24 classes of before this base, and its own
    strays = sorted(name for name, cls in own.items() if not issubclass(cls, HeadprobeError))
    assert not strays, strays


def test_the_subclasses_keep_the_builtin_class_they_had():
    from headprobe.core.atomic import FolderBusy, NotWritable
    from headprobe.jobs.memory import DoesNotFit
    from headprobe.model.config import ConfigError

    assert issubclass(ConfigError, ValueError) and issubclass(SettingError, ValueError)
    assert issubclass(FolderBusy, RuntimeError) and issubclass(DoesNotFit, RuntimeError)
    assert issubclass(NotWritable, PermissionError)


def test_a_bug_inside_a_command_keeps_its_traceback_where_it_was_shown_as_one_line(monkeypatch, tmp_path):
    """``headprobe show`` caught every ValueError and printed it as a user error: a bug (here a plain
    ValueError from the library) now reaches the top as itself."""
    import headprobe.show

    def broken(*_args, **_kwargs):
        raise ValueError("not a user error: a bug")

    monkeypatch.setattr(headprobe.show, "show_tables", broken)
    res = invoke("show", tmp_path)
    assert isinstance(res.exception, ValueError) and "error: not a user error" not in res.output, res.output


def test_a_refusal_is_one_line_and_under_debug_its_traceback():
    refused(run_command("show", "/no/such/results"), "/no/such/results")
    res = run_command("--debug", "show", "/no/such/results")
    assert res.exit_code == 1 and "Traceback" in res.output and "ResultsError" in res.output, res.output
    assert "error: " not in res.output


@pytest.mark.parametrize("value", ["last:0", "every:3"])
def test_a_bad_setting_is_a_setting_error_naming_the_setting(value):
    from headprobe.metrics import Rows

    with pytest.raises(SettingError, match="`rows`"):
        Rows.parse(value)


# A bug deep inside a job (a plain ValueError or RuntimeError from a programming mistake) keeps its traceback:
# no `except ValueError` on the way up turns it into a one-line user error (issue 39). Each is raised where a
# broad rewrap stood, or deep in the job's work, after the model has loaded.
JOB_ARGS = ["--out", "{out}", "--no-progress"]
BUGS = {
    "analyze": ("headprobe.analysis.job.needle_prompt", ValueError,
                ["analyze", "{ckpt}", "--metrics", "retrieval", "--lengths", "256", "--samples", "1"]),
    "analyze settings": ("headprobe.analysis.settings.parse_prompt_format", ValueError,
                         ["analyze", "{ckpt}", "--metrics", "entropy", "--lengths", "256"]),
    "ruler eval": ("headprobe.evals.ruler.job.load_samples", RuntimeError,
                   ["ruler", "eval", "{ckpt}", "--tasks", "niah_single_1", "--lengths", "256", "--samples", "1"]),
    "ruler eval settings": ("headprobe.evals.ruler.settings.Fit", ValueError,
                            ["ruler", "eval", "{ckpt}", "--tasks", "niah_single_1", "--lengths", "256"]),
    "shortctx eval": ("headprobe.evals.shortctx.job.evaluate_items", RuntimeError,
                      ["shortctx", "eval", "{ckpt}", "--task", "builtin", "--limit", "2"]),
    "ablate": ("headprobe.ablation.job.needle_prompts", RuntimeError,
               ["ablate", "{ckpt}", "--heads", "3.0", "--lengths", "256", "--samples", "1", "--depths", "50"]),
    "ablate settings": ("headprobe.hooked.ablation.AblationMode", ValueError,
                        ["ablate", "{ckpt}", "--heads", "3.0", "--lengths", "256"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from headprobe.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", vocab_size=264, max_seq_len=1024)


def _bug(monkeypatch, target: str, kind: type[Exception]) -> None:
    module, _, name = target.rpartition(".")

    def broken(*_args, **_kwargs):
        raise kind("not a user error: a bug")

    monkeypatch.setattr(importlib.import_module(module), name, broken)


@pytest.mark.parametrize("job", list(BUGS))
def test_a_bug_deep_in_a_job_keeps_its_traceback(monkeypatch, tmp_path, ckpt, job):
    target, kind, args = BUGS[job]
    _bug(monkeypatch, target, kind)
    res = invoke(*(a.format(ckpt=ckpt, out=tmp_path / "out") for a in [*args, *JOB_ARGS]))
    assert res.exit_code == 1 and type(res.exception) is kind, (res.output, res.exception)
    assert "not a user error" not in res.output and "error:" not in res.output, res.output


def test_a_bug_in_a_study_setting_s_parser_keeps_its_traceback(monkeypatch):
    from headprobe.study import StudyError, StudySettings
    from headprobe.text.probes import Probe

    with pytest.raises(StudyError, match="`probes`: probe 'nothing@10': unknown task"):  # a bad probe: a refusal
        StudySettings.from_dict({"probes": ["nothing@10"]})

    def broken(spec):
        raise ValueError("not a user error: a bug")

    monkeypatch.setattr(Probe, "parse", broken)
    with pytest.raises(ValueError, match="not a user error") as err:
        StudySettings.from_dict({"probes": ["needle@10"]})
    assert not isinstance(err.value, StudyError)


def test_through_the_command_itself_a_bug_is_its_traceback_and_a_refusal_one_line(
    monkeypatch, tmp_path, ckpt, capsys, own_signals
):
    """As a user runs it (``_App``, which the in-process runner bypasses): the bug leaves the command as itself,
    for Python to print its traceback; the same place in the job refusing on purpose is one line, exit code 2."""
    from headprobe.cli import app
    from headprobe.model.config import ConfigError

    args = ["ruler", "eval", str(ckpt), "--tasks", "niah_single_1", "--lengths", "256", "--out", str(tmp_path / "o")]
    _bug(monkeypatch, "headprobe.evals.ruler.job.load_samples", RuntimeError)
    with pytest.raises(RuntimeError, match="not a user error"):
        app([*args, "--no-progress"], prog_name="headprobe")
    assert "error:" not in capsys.readouterr().err

    def refusal(*_args, **_kwargs):
        raise ConfigError("`samples` and `batch_size` do not go together here")

    monkeypatch.setattr("headprobe.evals.ruler.job.load_samples", refusal)
    with pytest.raises(SystemExit) as stop:
        app([*args, "--no-progress"], prog_name="headprobe")
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: --samples and --batch-size do not go together here\n")


def test_an_error_raised_anywhere_in_a_command_names_the_flags_of_the_command_that_failed(monkeypatch, tmp_path):
    """No command catches it: the one place that shows errors (``headprobe.cli._Context``) names the settings as
    the flags of the (sub)command that failed: ``ruler generate`` has --tokenizer and --overwrite, ``ruler eval``
    --batch-size and --device; a setting the command does not take stays a name. ``--debug``: the traceback."""
    import headprobe.evals.ruler
    import headprobe.evals.ruler.settings
    from headprobe.core.errors import SettingError

    def refusal(*_args, **_kwargs):
        raise SettingError("`tokenizer`, `overwrite`, `batch_size` and `device` are wrong together")

    monkeypatch.setattr(headprobe.evals.ruler.settings, "resolve_tasks", refusal)  # both commands' settings check
    generate = ["ruler", "generate", "--lengths", "256", "--out", tmp_path / "s.jsonl"]
    refused(invoke(*generate), "error: --tokenizer, --overwrite, batch_size and device are wrong together")
    evaluate = ["ruler", "eval", tmp_path / "model", "--out", tmp_path / "r"]
    refused(invoke(*evaluate), "error: tokenizer, overwrite, --batch-size and --device are wrong together")
    for args in (generate, evaluate):
        res = invoke("--debug", *args)
        assert isinstance(res.exception, SettingError) and "error:" not in res.output, res.output
    assert not (tmp_path / "s.jsonl").exists() and not (tmp_path / "r").exists()


def test_the_trainer_plugin_s_errors_are_shown_as_one_line_too():
    from headprobe.cli import app
    from headprobe.cli.train import trainer_plugin

    assert set(trainer_plugin().errors) <= set(app.session.user_errors)


@pytest.mark.parametrize(
    "args, says",
    [
        (["analyze", "m", "--lengths", "4096,lots"], "--lengths"),
        (["ablate", "m", "--seeds", "0,x"], "--seeds '0,x'"),
        (["ruler", "eval", "m", "--lengths", "2k,x"], "--lengths"),
        (["study", "--seeds", "0,x"], "'0,x'"),  # click's usage panel before: errors become flags in one place
        (["train", "grid", "--recipe", "toy", "--seeds", "0,x"], "'0,x'"),
    ],
)
def test_a_malformed_option_text_is_one_line_from_every_command(args, says, tmp_path):
    """A command's own check of an option's text (``typer.BadParameter``) is shown where every refusal is,
    ``headprobe.cli._Context``: one line and exit code 2, with no command catching it, and nothing written."""
    res = invoke(*args, "--out", tmp_path / "out")
    text = refused(res, says)
    assert "Usage:" not in text and "Traceback" not in text
    assert not (tmp_path / "out").exists()
