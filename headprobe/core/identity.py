"""A checkpoint's identity: what tells it from every other, read without reading a weight
(:func:`checkpoint_identity`, recorded with its results), and what changed between two identities
(:func:`identity_changes`, :func:`changed_since`)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any

from headprobe.core.paths import file_sha256
from headprobe.core.steps import WEIGHTS_DIR, is_step_folder

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # the files a checkpoint folder's weights are in
# the files beside the weights that decide a model's numbers too: its shape, RoPE and window (config.json; a
# training step folder's state.json), its tokens, chat template and end ids (the tokenizer's and generation files)
CONFIG_FILES = (
    "config.json", "state.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json", "tokenizer.model",
    "vocab.json", "merges.txt",
)  # fmt: skip


def checkpoint_identity(checkpoint: str | Path) -> dict[str, Any]:
    """What tells a checkpoint from every other, read without reading a weight (recorded with its results,
    :attr:`headprobe.results.TableMeta.identity`): ``path``, the checkpoint resolved; ``weights``, a
    fingerprint of its weight files (a GGUF file itself, or a folder's ``*.safetensors``, ``*.bin``,
    ``*.pt``, ``*.pth``, ``*.gguf``, a training step folder's ``dcp/`` shards: each one's name, size in bytes
    and modification time in ns, hashed), so
    that a checkpoint retrained or replaced at one path is another; ``config``, a folder's
    :data:`CONFIG_FILES` by name with a fingerprint of each one's content (SHA-256), so that one whose config
    or tokenizer was edited is another too (a GGUF file holds them in itself; tables written before headprobe
    recorded them lack it); ``modified``, when the newest of all those files was written (UTC, ISO 8601 to the
    second). Empty for a path that does not exist."""
    path = Path(checkpoint)
    if path.is_file():
        files, configs = [path], []
    elif path.is_dir():
        files = sorted(f for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())
        if is_step_folder(path):  # a training step folder: its weights are the shards in dcp/
            files += sorted(f for f in (path / WEIGHTS_DIR).iterdir() if f.is_file())
        configs = [path / name for name in CONFIG_FILES if (path / name).is_file()]
    else:
        return {}
    stats = [(f.name, f.stat()) for f in files]
    listed = json.dumps([(name, st.st_size, st.st_mtime_ns) for name, st in stats])
    newest = max((f.stat().st_mtime for f in [*files, *configs]), default=None)
    return {
        "path": str(path.resolve()),
        "weights": hashlib.sha256(listed.encode()).hexdigest()[:16],
        "config": {f.name: file_sha256(f)[:16] for f in configs},
        "modified": None
        if newest is None
        else _dt.datetime.fromtimestamp(newest, _dt.timezone.utc).isoformat(timespec="seconds"),
    }


def identity_changes(made: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What of a checkpoint changed between two of its identities (:func:`checkpoint_identity`): ``weights``
    and the names of the config files added or edited; empty when they agree in all that both record (an
    identity written before the config files were recorded tells nothing of them). A file removed since is
    left to loading the checkpoint, which names it as missing and how to restore it."""
    changed = ["weights"] if made.get("weights") and now.get("weights") and made["weights"] != now["weights"] else []
    before, after = made.get("config"), now.get("config")
    if isinstance(before, dict) and isinstance(after, dict):
        changed += [name for name in CONFIG_FILES if name in after and before.get(name) != after[name]]
    return changed


def changed_since(made: dict[str, Any], now: dict[str, Any]) -> str:
    """:func:`identity_changes` in words, for a message: ``its weights or config changed since (config.json
    differs)``."""
    changed = identity_changes(made, now)
    what = ", ".join("the weights" if c == "weights" else c for c in changed)
    verb = "differs" if len(changed) == 1 and changed != ["weights"] else "differ"
    return f"its weights or config changed since ({what} {verb})"
