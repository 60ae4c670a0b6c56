"""GGUF files as model folders: converted once into a plain Hugging Face folder, cached by content.

A ``.gguf`` file (llama.cpp's format, often quantised) is read by transformers with the ``gguf``
package: its tensors are dequantised to float32 and its tokenizer, config and chat template rebuilt.
That takes tens of seconds, so it happens once per file *content*:

    $HEADPROBE_CACHE/gguf/<sha256 of the file>/
        config.json  generation_config.json  model.safetensors  tokenizer.json
        tokenizer_config.json  chat_template.jinja  source.json

``source.json`` records the file it came from (name, size, SHA-256), the transformers version that
converted it and the size of every file the conversion wrote. The folder is written atomically
(:func:`headprobe.core.atomic.atomic_directory`) under a lock, so concurrent runs convert once and a killed
run leaves nothing that looks finished. A folder changed since (a file cut short, removed or rewritten to
another size: something other than headprobe touched it), or one converted before the sizes were recorded,
is converted again, and the ``log`` says so (:func:`cache_damage`).

Bad inputs are refused before any conversion, from the header alone (:func:`check_gguf`): a missing
file, a file that is not GGUF, the ``gguf`` package missing, an architecture transformers cannot read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from headprobe.core.atomic import atomic_directory
from headprobe.core.paths import GGUF_SUFFIX, file_sha256, not_a
from headprobe.hooked.errors import ModelLoadError
from headprobe.hooked.hf import quiet_transformers
from headprobe.text.toy_tokenizer import cache_dir

SUFFIX = GGUF_SUFFIX
MAGIC = b"GGUF"
SOURCE_FILE = "source.json"
INSTALL_HINT = "pip install 'headprobe[real]' (or: pip install gguf)"

Log = Callable[[str], None]


def _reader(path: Path) -> Any:
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(f"{path}: reading GGUF files needs the `gguf` package; {INSTALL_HINT}") from None
    try:
        return gguf.GGUFReader(str(path))
    except Exception as err:  # the reader raises ValueError, struct.error, IndexError... on a damaged file
        raise ModelLoadError(
            f"{path} is not a readable GGUF file ({type(err).__name__}: {err}); is it complete?"
        ) from None


def _field(reader: Any, name: str) -> Any:
    field = reader.fields.get(name)
    return None if field is None else field.contents()


def check_gguf(path: str | Path) -> dict[str, Any]:
    """The header facts of the GGUF file ``path`` (``architecture``, ``context_length``, ``name``); raises
    :class:`ModelLoadError` naming the problem and the fix when it cannot become a model folder."""
    path = Path(path)
    if why := not_a(path, "file"):
        raise ModelLoadError(f"GGUF file {path} {why}")
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise ModelLoadError(f"{path} is not a GGUF file (it does not start with 'GGUF'); give a .gguf model file")
    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{path}: the GGUF header names no `general.architecture`; the file is damaged")
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        import transformers

        raise ModelLoadError(
            f"{path}: GGUF architecture {arch!r} is not one transformers {transformers.__version__} can read "
            f"(it reads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); convert the model to a Hugging Face "
            "folder another way and give that folder"
        )
    context = _field(reader, f"{arch}.context_length")
    return {
        "architecture": arch,
        "context_length": int(context) if isinstance(context, int) else None,
        "name": _field(reader, "general.name"),
    }


def cached_folder(sha256: str) -> Path:
    """Where the conversion of a file with this content lives (whether or not it exists yet)."""
    return cache_dir() / "gguf" / sha256


@contextlib.contextmanager
def _waiting_lock(lock: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock`` that waits (a second run converting the same file waits for the first)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def gguf_folder(path: str | Path, log: Log | None = None) -> Path:
    """The plain Hugging Face folder of the GGUF file ``path``: from the cache, or converted now (once).

    ``log`` hears one line before a conversion starts, and why a cached conversion is made again (it was
    damaged: :func:`cache_damage`). Raises :class:`ModelLoadError` for bad files (:func:`check_gguf`) and
    conversions transformers refuses."""
    path = Path(path)
    if why := not_a(path, "file"):
        raise ModelLoadError(f"GGUF file {path} {why}")
    sha = file_sha256(path)
    folder = cached_folder(sha)
    if folder.is_dir() and cache_damage(folder) is None:
        return folder
    facts = check_gguf(path)
    with _waiting_lock(folder.parent / f".{sha}.lock"):
        damage = cache_damage(folder) if folder.is_dir() else "does not exist"
        if damage is None:  # another run converted it while this one waited
            return folder
        if log and folder.is_dir():
            log(f"{folder}, the conversion of {path.name}, {damage}; converting it again (dequantised to float32)")
        elif log:
            log(f"converting {path.name} ({facts['architecture']}) once into {folder} (dequantised to float32)")
        with atomic_directory(folder) as tmp:
            _convert(path, tmp)
            source = {"file": path.name, "size": path.stat().st_size, "sha256": sha, **facts, **_versions()}
            source["files"] = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
            (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    return folder


def cache_damage(folder: Path) -> str | None:
    """What is wrong with the converted folder ``folder``, as a clause to follow its name (``None`` when it
    is as its conversion left it): damaged (``source.json`` unreadable, a file it records missing or of
    another size), or made by an older headprobe that recorded no file sizes. A conversion is written
    atomically, so damage means something else changed the folder; either way the fix is to convert again."""
    try:
        files = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8")).get("files")
    except FileNotFoundError:
        return f"is damaged: {SOURCE_FILE} does not exist"
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, not an object
        return f"is damaged: {SOURCE_FILE} is unreadable"
    if not isinstance(files, dict):
        return "was made by an older headprobe, which recorded no file sizes to check it by"
    for name, size in files.items():
        if why := not_a(folder / name, "file"):
            return f"is damaged: {name} {why}"
        if (actual := (folder / name).stat().st_size) != size:
            return f"is damaged: {name} is {actual:,} bytes, {size:,} when converted"
    return None


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("transformers", "gguf"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[f"{pkg}_version"] = md.version(pkg)
    return out


def _convert(path: Path, out: Path) -> None:
    """Dequantise ``path`` with transformers and save model, tokenizer and generation config into ``out``."""
    from unittest import mock

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    no_bar = mock.patch.object(gguf_utils, "tqdm", lambda items, **kw: items)  # its own bar, not ours to show
    try:
        with no_bar, quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
            )
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        raise ModelLoadError(f"{path}: transformers cannot convert this GGUF file ({err})") from None
    # the weights are dequantised now: saved as a plain float32 model, not as a GGUF-quantised one
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    with quiet_transformers():
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
