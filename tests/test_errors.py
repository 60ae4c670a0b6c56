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
