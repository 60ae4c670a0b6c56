"""RULER's prompt templates and answer prefixes, character for character (NVIDIA/RULER
``scripts/data/synthetic/constants.py``), and the model wrappers around them.

A *wrapper* is RULER's ``model_template``: a string holding ``{task_template}`` once (``base`` is just
``{task_template}``; a chat wrapper adds the user-turn header before and the assistant-turn header
after). The final prompt is ``wrapper(task prompt) + answer_prefix``; which wrapper a model gets is the
one prompt-format rule of :mod:`headprobe.text.prompt_format`.
"""

from __future__ import annotations

from headprobe.text.prompt_format import PLAIN

BASE_WRAPPER = PLAIN.template  # RULER's ``base``: the task prompt alone

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
