"""The toy models' tokenizer: a byte-level BPE of 4,096 ids built here, offline, from our own text.

Byte-level toys did not learn to retrieve on a CPU budget: a key spread over many bytes needs a match
on several of them, and a digit has no predictor but exact copying (docs/training.md). With this BPE
a common word is one token, a noun one to three, and every digit its own token carrying the space
before it (``' 4471'`` is ``' 4', '4', '7', '1'``), so finding a key and copying its value is a few
token-level induction steps. It is trained on the built-in corpus, the synthetic tasks and the word
lists (held-out nouns included, as a tokenizer sees all the text a user might bring), deterministic
in the build recipe below, and cached as ``toy-bpe-4096.json`` under ``$HEADPROBE_CACHE`` (default
``~/.cache/headprobe``); checkpoints carry their own ``tokenizer.json``.

:func:`open_tokenizer` ``("toy")`` gives it (and anything :func:`headprobe.model.tokenizer.load_tokenizer`
takes); ``headprobe train --tokenizer toy``.
"""

from __future__ import annotations

import os
from pathlib import Path

from headprobe.core.atomic import atomic_write_text
from headprobe.model.presets import TOY_VOCAB_SIZE
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

TOY = "toy"
SPECIAL_TOKENS = ("<|endoftext|>", "<pad>")
_DOCUMENTS = 400  # built-in corpus documents in the training text
_TASK_EXAMPLES = 3000  # synthetic task documents
_WORDLIST_REPEATS = 5  # every listed word this often, so each noun's pieces are seen


def cache_dir() -> Path:
    """headprobe's cache folder: ``$HEADPROBE_CACHE``, default ``~/.cache/headprobe`` (the trainer's too)."""
    return Path(os.environ.get("HEADPROBE_CACHE", Path.home() / ".cache" / "headprobe"))


def training_texts() -> list[str]:
    """What the BPE is trained on (deterministic)."""
    from headprobe.text.corpus import document
    from headprobe.text.tasks import TaskMix
    from headprobe.text.wordlists import words

    mix = TaskMix.parse("copy=1,recall=1,needle=1,magic=1,prose=1")
    texts = [document(0, i)[1] for i in range(_DOCUMENTS)]
    texts += [mix.example(7, i).text for i in range(_TASK_EXAMPLES)]
    texts += [" " + " ".join(words(kind)) for kind in ("nouns", "verbs", "adjectives")] * _WORDLIST_REPEATS
    return texts


def build_toy_tokenizer(vocab_size: int = TOY_VOCAB_SIZE):
    """A ``tokenizers.Tokenizer``: digits split one by one (each with an optional leading space), then
    GPT-2's byte-level pre-tokenisation, BPE merges learned from :func:`training_texts`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(" ?[0-9]"), "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_texts(), trainer)
    return tok


def toy_tokenizer_path(vocab_size: int = TOY_VOCAB_SIZE) -> Path:
    """The cached ``tokenizer.json``, built (about 1 s) and written atomically on first use."""
    path = cache_dir() / f"toy-bpe-{vocab_size}.json"
    if not path.is_file():
        atomic_write_text(path, build_toy_tokenizer(vocab_size).to_str())
    return path


def open_tokenizer(spec: str | Path) -> ByteTokenizer | HFTokenizer:
    """``"toy"`` for the toys' BPE (built on first use), else what ``load_tokenizer`` takes: ``"byte"`` or
    a ``tokenizer.json`` path or folder."""
    if str(spec) != TOY:
        return load_tokenizer(spec)
    tok = HFTokenizer(toy_tokenizer_path())
    tok.name = TOY  # what configs and data manifests record: rebuilt the same anywhere
    return tok


def step_tokenizer(folder: str | Path) -> ByteTokenizer | HFTokenizer:
    """The tokenizer a training step folder (:mod:`headprobe.core.steps`) recorded in its ``state.json``: the
    byte tokenizer, the toy BPE, or a ``tokenizer.json`` checked against the SHA-256 recorded when it trained.
    Raises :class:`~headprobe.model.checkpoint.CheckpointError` naming the file and the fix when it went
    missing or changed."""
    from headprobe.core.errors import HeadprobeError
    from headprobe.core.paths import file_sha256
    from headprobe.core.steps import read_step
    from headprobe.model.checkpoint import CheckpointError

    state = read_step(folder)
    spec = state.get("tokenizer", "byte")
    try:
        tokenizer = open_tokenizer(spec)
    except (OSError, ValueError, HeadprobeError) as err:
        raise CheckpointError(
            f"{folder} was trained with the tokenizer {spec}, which cannot be opened ({err}); restore that "
            "tokenizer.json at that path"
        ) from None
    want = state.get("tokenizer_sha256")
    if want and isinstance(tokenizer, HFTokenizer):
        have = file_sha256(tokenizer.path)
        if have != want:
            raise CheckpointError(
                f"{tokenizer.path} is not the tokenizer {folder} was trained with (SHA-256 {want[:12]} then, "
                f"{have[:12]} now), so its text would be read with other ids. Restore that tokenizer.json at that "
                "path"
            )
    return tokenizer
