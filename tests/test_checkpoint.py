import json

import pytest
import torch

import headprobe.model.checkpoint as ckpt_mod
from headprobe.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from headprobe.model.presets import preset
from headprobe.model.tokenizer import ByteTokenizer, load_tokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import build_toy_bpe, tiny_config


def test_round_trip_byte_tokenizer(tmp_path):
    model = Transformer(preset("toy-k16v64"))
    path = save_checkpoint(model, tmp_path / "ck", ByteTokenizer())
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    loaded, tok = load_checkpoint(path)
    assert isinstance(tok, ByteTokenizer) and loaded.cfg == model.cfg and not loaded.training
    ids = torch.randint(0, 256, (2, 90))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
    assert loaded.lm_head.weight is loaded.embed.weight  # tying survives the round trip
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporary folders left behind


def test_round_trip_untied_bf16_with_bpe_tokenizer(tmp_path):
    tok = load_tokenizer(build_toy_bpe(tmp_path / "bpe.json"))
    model = Transformer(tiny_config(vocab_size=tok.vocab_size, tie_embeddings=False)).to(torch.bfloat16)
    save_checkpoint(model, tmp_path / "ck", tok)
    loaded, tok2 = load_checkpoint(tmp_path / "ck")
    assert (tmp_path / "ck" / "tokenizer.json").is_file()
    assert tok2.encode("the north door") == tok.encode("the north door")
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert b.dtype == torch.bfloat16 and torch.equal(a, b), n


def test_overwrite_replaces_atomically(tmp_path):
    first, second = Transformer(tiny_config(vocab_size=264)), Transformer(tiny_config(vocab_size=264))
    save_checkpoint(first, tmp_path / "ck")
    save_checkpoint(second, tmp_path / "ck")
    loaded, _ = load_checkpoint(tmp_path / "ck")
    assert torch.equal(loaded.embed.weight, second.embed.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_crash_while_saving_leaves_previous_checkpoint(tmp_path, monkeypatch):
    old = Transformer(tiny_config(vocab_size=264))
    save_checkpoint(old, tmp_path / "ck")

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 100)  # half a file, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt_mod, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "fresh")
    loaded, _ = load_checkpoint(tmp_path / "ck")
    assert torch.equal(loaded.embed.weight, old.embed.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # "fresh" never appeared


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing")
    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    (tmp_path / "ck" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors is missing"):
        load_checkpoint(tmp_path / "ck")


def test_truncated_weights(tmp_path):
    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    f = tmp_path / "ck" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated or corrupted"):
        load_checkpoint(tmp_path / "ck")


def test_flipped_byte_is_caught_by_crc(tmp_path):
    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    f = tmp_path / "ck" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-7] ^= 0xFF  # inside the last tensor's data, the header stays valid
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC-32"):
        load_checkpoint(tmp_path / "ck")


def test_weights_of_another_shape(tmp_path, monkeypatch):
    save_checkpoint(Transformer(preset("toy-d16")), tmp_path / "ck")
    (tmp_path / "ck" / "config.json").write_text(preset("toy-k64v16").to_json())
    # without the layout record (files written by other tools) the shape check names the tensor
    monkeypatch.setattr(ckpt_mod, "_layout", lambda cfg: {})
    with pytest.raises(CheckpointError, match=r"blocks\.3\.attn\.v_proj\.weight: file \(128, 128\).*different"):
        load_checkpoint(tmp_path / "ck")


def test_same_shapes_other_head_split(tmp_path):
    """toy-d16 and toy-d64 have identical tensor shapes (8 x 16 vs 2 x 64 = 128); only the recorded
    layout can tell that 16-wide heads are about to be read as 64-wide ones."""
    save_checkpoint(Transformer(preset("toy-d16")), tmp_path / "ck")
    (tmp_path / "ck" / "config.json").write_text(preset("toy-d64").to_json())
    with pytest.raises(CheckpointError, match=r"full\.n_heads: weights 8 vs config 2"):
        load_checkpoint(tmp_path / "ck")


def test_broken_config(tmp_path):
    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    cfg["full"]["rope_dim"] = 99
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json.*rope_dim"):
        load_checkpoint(tmp_path / "ck")
