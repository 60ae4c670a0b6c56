"""How a task's text is put to a model: the one prompt-format rule of every needle and RULER-style prompt.

A prompt is ``wrapper.before + task text + wrapper.after + answer prefix`` (RULER's ``model_template``
with its ``{task_template}`` slot, then the task's answer prefix). The format chooses the wrapper:

=======  =========================================================================================
auto     the model's chat template when its tokenizer has one, else ``plain`` (the default)
chat     the model's chat template: the task text as one user turn, then the assistant-turn header
plain    the task text as it is (RULER's ``base`` wrapper, Wu et al.'s plain prompt)
wrapper  a string holding ``{task_template}`` once (RULER's ``model_template``), or a file holding one
=======  =========================================================================================

Every command reads the value the same way (:func:`parse_prompt_format`), before any model loads.

A chat template is rendered once, for one user message, by transformers from the model folder's own
files (``chat_template.jinja`` or ``tokenizer_config.json``), offline. An instruct model asked in its
own template answers; asked in plain text it often does not (SmolLM2-135M-Instruct answered a bare
newline to half the plain needle prompts at 2K tokens; see docs/real-models.md).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from headprobe.core.choice import Choice
from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import read_utf8

SLOT = "{task_template}"


class PromptFormat(Choice, what="prompt format"):
    """``--prompt-format``: which wrapper a task prompt gets (see the module docstring)."""

    AUTO = "auto"
    CHAT = "chat"
    PLAIN = "plain"


class PromptFormatError(HeadprobeError, ValueError):
    """A prompt format that cannot be used with this model; the message names the fix."""


@dataclass(frozen=True)
class Wrapper:
    """The text around a task prompt.

    Attributes:
        format: ``chat`` or ``plain`` (what :class:`PromptFormat` resolved to), or ``custom``.
        before: text before the task (a chat template's system and user-turn headers).
        after: text after it (the end of the user turn and the assistant-turn header).
    """

    format: str
    before: str = ""
    after: str = ""

    @property
    def is_chat(self) -> bool:
        return self.format == PromptFormat.CHAT.value

    @property
    def template(self) -> str:
        """RULER's form: the wrapper with ``{task_template}`` where the task goes."""
        return self.before + SLOT + self.after

    def wrap(self, task: str, answer_prefix: str = "") -> str:
        """The whole prompt text: the wrapped task, then the answer prefix."""
        return self.before + task + self.after + answer_prefix

    @classmethod
    def parse(cls, template: str, format: str = "custom") -> Wrapper:
        """A wrapper from RULER's form; raises :class:`PromptFormatError` unless ``{task_template}`` occurs once."""
        if template.count(SLOT) != 1:
            raise PromptFormatError(
                f"a prompt wrapper must contain {SLOT} exactly once (found {template.count(SLOT)}): e.g. "
                "'<|user|>\\n{task_template}<|assistant|>\\n'"
            )
        before, after = template.split(SLOT)
        return cls(format, before, after)


PLAIN = Wrapper(PromptFormat.PLAIN.value)


def has_chat_template(folder: str | Path | None) -> bool:
    """Whether the model folder's tokenizer files carry a chat template (read from the files alone)."""
    if folder is None or not Path(folder).is_dir():
        return False
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def chat_wrapper(folder: str | Path) -> Wrapper:
    """The chat template of the model folder ``folder`` as a wrapper: one user turn holding the task, then
    the assistant-turn header (rendered by transformers, offline). Raises :class:`PromptFormatError` when
    the folder has no template or the template does not hold the user message exactly once."""
    if not has_chat_template(folder):
        raise PromptFormatError(
            f"{folder} has no chat template (chat_template.jinja or tokenizer_config.json's chat_template); use "
            "`prompt_format` plain (or auto, which uses plain where there is no template)"
        )
    marker = "\x00HEADPROBE_TASK\x00"
    text = _render(folder, [{"role": "user", "content": marker}], add_generation_prompt=True)
    if not isinstance(text, str) or text.count(marker) != 1:
        raise PromptFormatError(f"{folder}: the chat template does not place the user message exactly once")
    before, after = text.split(marker)
    return Wrapper(PromptFormat.CHAT.value, before, after)


def chat_turn_end(folder: str | Path) -> str | None:
    """The text a chat template writes right after an assistant message (e.g. ``<|im_end|>\\n``): where
    the model was trained to end its turn; ``None`` without a template or when it cannot be rendered."""
    if not has_chat_template(folder):
        return None
    marker = "\x00HEADPROBE_REPLY\x00"
    turns = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": marker}]
    try:
        text = _render(folder, turns, add_generation_prompt=False)
    except Exception:  # a template may refuse this conversation (jinja raises its own errors)
        return None
    if not isinstance(text, str) or text.count(marker) != 1:
        return None
    return text.split(marker)[1] or None


@functools.lru_cache(maxsize=8)
def _chat_tokenizer(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _render(folder: str | Path, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """The folder's chat template applied to ``messages``, as text (transformers renders it, offline)."""
    tok = _chat_tokenizer(str(Path(folder).resolve()))
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def parse_prompt_format(spec: str) -> PromptFormat | Wrapper:
    """The one reading of a ``prompt_format`` value, the same for every command and before any model loads:
    ``auto``, ``chat`` or ``plain`` (``base`` is RULER's name for plain) as a :class:`PromptFormat`; a wrapper
    string holding ``{task_template}`` once, or the UTF-8 file holding one, as a :class:`Wrapper`. Raises
    :class:`PromptFormatError` naming the value (a file by its name) and what to give instead."""
    if spec == "base":
        return PromptFormat.PLAIN
    if spec in {f.value for f in PromptFormat}:
        return PromptFormat(spec)
    if SLOT in spec:
        return Wrapper.parse(spec)
    path = Path(spec)
    if len(spec) < 4096 and path.is_file():
        return wrapper_file(path)
    raise PromptFormatError(
        f"unknown `prompt_format` {spec!r}: not auto, chat or plain, no file of that name, and no {SLOT} in it; "
        f"choose auto, chat or plain, or give a wrapper holding {SLOT} (a string or a file)"
    )


def wrapper_file(path: Path) -> Wrapper:
    """The wrapper in the file ``path``; errors name the file (not its content)."""
    text = read_utf8(path, "`prompt_format` file", PromptFormatError)
    if text.count(SLOT) != 1:
        found = f"holds no {SLOT}" if SLOT not in text else f"holds {SLOT} {text.count(SLOT)} times"
        raise PromptFormatError(
            f"`prompt_format` file {path} {found}; a wrapper holds it exactly once, where the task text "
            "goes (e.g. '<|user|>\\n{task_template}<|assistant|>\\n')"
        )
    return Wrapper.parse(text)


def format_key(spec: str) -> str:
    """What a resume key records of a ``prompt_format`` value: the wrapper itself for a file (so that editing
    the file redoes the work it decides), the value as given otherwise."""
    parsed = parse_prompt_format(spec)
    return parsed.template if isinstance(parsed, Wrapper) else spec


def resolve_wrapper(spec: str, folder: str | Path | None) -> Wrapper:
    """The wrapper a ``prompt_format`` value (:func:`parse_prompt_format`) gives the model in ``folder``:
    ``auto`` is its chat template where its files have one, else ``plain``; ``chat`` its chat template.
    ``folder``: the model folder whose chat template ``auto``/``chat`` use (``None``: no template, e.g. the
    byte tokenizer)."""
    parsed = parse_prompt_format(spec)
    if isinstance(parsed, Wrapper):
        return parsed
    if parsed is PromptFormat.PLAIN or (parsed is PromptFormat.AUTO and not has_chat_template(folder)):
        return PLAIN
    if folder is None:
        raise PromptFormatError(
            "`prompt_format` chat needs a model's chat template, and no model folder was given: pass "
            f"`tokenizer` MODEL_DIR (a folder with tokenizer.json and its chat template) or MODEL.gguf, or give a "
            f"wrapper holding {SLOT}"
        )
    return chat_wrapper(folder)
