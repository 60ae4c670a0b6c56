"""``python -m trainer ...``: the same command as ``headprobe train ...`` (works under torchrun)."""

from trainer.cli import train_app

if __name__ == "__main__":
    train_app(prog_name="python -m trainer")
