"""RULER's prompt templates and answer prefixes, character for character (NVIDIA/RULER
``scripts/data/synthetic/constants.py``), and the model wrappers around them.

A *wrapper* is RULER's ``model_template``: a string holding ``{task_template}`` once (``base`` is just
``{task_template}``; a chat wrapper adds the user-turn header before and the assistant-turn header
after). The final prompt is ``wrapper(task prompt) + answer_prefix``.
"""

from __future__ import annotations

from pathlib import Path

BASE_WRAPPER = "{task_template}"
_SLOT = "{task_template}"

NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."

VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned "
    "the value {query}, they are: "
)

CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
    "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"

FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"

QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
)
QA_PREFIX = " Answer:"

NOISE_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def singular(template: str) -> str:
    """RULER's rewrite of a template (before it is filled in) when exactly one value is asked for:
    ``Some -> A``, ``are all -> is``, ``are -> is``, ``answers -> answer``. The caller also drops the
    plural ``s`` of the value type (``numbers -> number``)."""
    return template.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


def split_wrapper(wrapper: str) -> tuple[str, str]:
    """``(before, after)`` of a wrapper's ``{task_template}`` slot; raises ``ValueError`` naming the problem."""
    if wrapper.count(_SLOT) != 1:
        raise ValueError(
            f"a wrapper must contain {_SLOT} exactly once (found {wrapper.count(_SLOT)}): e.g. "
            "'<|user|>\\n{task_template}<|assistant|>\\n'"
        )
    before, after = wrapper.split(_SLOT)
    return before, after


def resolve_wrapper(spec: str, model_dir: str | Path | None = None) -> str:
    """The wrapper string for ``--wrapper``: ``base``; ``chat`` (the chat template in the model's
    ``tokenizer_config.json``, rendered for one user turn plus the assistant-turn header); a file holding
    the wrapper; or the wrapper string itself."""
    if spec == "base":
        return BASE_WRAPPER
    if spec == "chat":
        return chat_wrapper(model_dir)
    path = Path(spec)
    if _SLOT not in spec and path.is_file():
        spec = path.read_text(encoding="utf-8")
    split_wrapper(spec)
    return spec


def chat_wrapper(model_dir: str | Path | None) -> str:
    """A local model's chat template as a wrapper (rendered by transformers, offline)."""
    if model_dir is None or not (Path(model_dir) / "tokenizer_config.json").is_file():
        raise ValueError(
            f"`wrapper` chat needs a model folder with tokenizer_config.json (got {model_dir}); give the "
            "wrapper string instead, e.g. `wrapper` '<|user|>\\n{task_template}<|assistant|>\\n'"
        )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{model_dir}/tokenizer_config.json has no chat_template; use `wrapper` base or a string")
    marker = "\x00HEADPROBE_TASK\x00"
    text = tok.apply_chat_template([{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True)
    if text.count(marker) != 1:
        raise ValueError(f"{model_dir}: the chat template does not place the user message exactly once")
    return text.replace(marker, _SLOT)
