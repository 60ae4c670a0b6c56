"""``headprobe export hf``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def export_hf(
    ctx: typer.Context,
    checkpoint: Annotated[
        Path, typer.Argument(help="our checkpoint folder (config.json, model.safetensors); not a .gguf file")
    ],
    out: Annotated[Path, typer.Argument(help="the Hugging Face model folder to write")],
    overwrite: Annotated[bool, typer.Option(help="replace OUT if it exists")] = False,
) -> None:
    """Our checkpoint as a Hugging Face model folder: transformers loads it with trust_remote_code=True
    (standalone modeling code inside), or without it once headprobe is imported; lm-eval's `hf` model
    and headprobe's own commands load it by path (docs/checkpoints.md)."""
    from headprobe.export.hf import export_hf as run

    folder = run(checkpoint, out, overwrite=overwrite)
    typer.echo(f"{checkpoint} -> {folder}")
    typer.echo(f"  transformers: AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)")
