"""``python -m headprobe ...`` (also ``torchrun ... -m headprobe train ...``): the ``headprobe`` command."""

from headprobe.cli import app

if __name__ == "__main__":
    app(prog_name="headprobe")
