"""Typed choices among named values (``str`` enums), with one message for an unknown value."""

from __future__ import annotations

from enum import Enum

from headprobe.core.errors import SettingError


class ChoiceError(SettingError):
    """A value that is none of a :class:`Choice`'s values (the message names them)."""


class Choice(str, Enum):
    """A typed choice among named values (a ``str`` enum): it prints and compares as its value
    (``LayerType.FULL == "full"``), and an unknown value raises a :class:`ChoiceError` naming the choices.
    ``class Backend(Choice, what="attention backend")`` says what the value chooses, for that message."""

    def __init_subclass__(cls, what: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._label = what or cls.__name__.lower()

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> Choice:
        raise ChoiceError(f"unknown {cls._label} {value!r}; choose one of {', '.join(m.value for m in cls)}")
