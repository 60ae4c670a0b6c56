"""The grid runner: recipes (runs, `from`, `like`, profiles, seeds), resuming, the manifest."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from trainer.config import TrainConfig, TrainError
from trainer.grid import Recipe, run_grid
from trainer.train import train

TINY = dict(steps=2, batch_size=2, seq_len=64, warmup_steps=0, progress=False)
RECIPE = {
    "scale": "toy",
    "seeds": [0, 1],
    "runs": {
        "pt": {"stage": "pt", "lr": 0.003},
        "cpt": {"stage": "cpt", "from": "pt", "lr": 0.001},
        "cpt-frozen": {"like": "cpt", "freeze": "attention"},
        "sft": {"stage": "sft", "from": "cpt"},
    },
    "profiles": {"quick": {"seeds": [7], "runs": {"cpt": {"lr": 0.0005}}}},
}


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(raw))
    return path


def test_runs_start_from_their_sources_per_seed_and_finished_runs_are_skipped(tmp_path):
    calls: list[TrainConfig] = []

    def spy(cfg: TrainConfig):
        calls.append(cfg)
        return train(cfg)

    runs = tmp_path / "runs"
    manifest = run_grid(write(tmp_path, RECIPE), runs, ["d16"], overrides=TINY, run_stage=spy, log=lambda _: None)
    seen = [(Path(c.out).parent.name, Path(c.out).name) for c in calls]
    assert seen == [(f"s{s}", r) for s in (0, 1) for r in ("pt", "cpt", "cpt-frozen", "sft")]
    for c in calls:
        assert c.resume and c.seed == int(Path(c.out).parent.name[1:])
        source = {"pt": None, "cpt": "pt", "cpt-frozen": "pt", "sft": "cpt"}[Path(c.out).name]
        assert c.init == (None if source is None else str(Path(c.out).parent / source / "final"))
        assert (c.freeze == "attention") == (Path(c.out).name == "cpt-frozen")
        assert c.lr == {"pt": 0.003, "cpt": 0.001, "cpt-frozen": 0.001, "sft": 3e-3}[Path(c.out).name]
    assert len(manifest["runs"]) == 8 and all(Path(r["checkpoint"]).is_dir() for r in manifest["runs"])
    assert json.loads((runs / "manifest.json").read_text()) == manifest
    calls.clear()
    (runs / "toy-d16" / "s1" / "sft" / "result.json").unlink()  # as if sft crashed before finishing
    again = run_grid(write(tmp_path, RECIPE), runs, ["d16"], overrides=TINY, run_stage=spy, log=lambda _: None)
    assert [(Path(c.out).parent.name, Path(c.out).name) for c in calls] == [("s1", "sft")]
    assert sorted(map(json.dumps, again["runs"])) == sorted(map(json.dumps, manifest["runs"]))


def test_choosing_a_run_brings_the_runs_it_starts_from_and_seeds_override(tmp_path):
    calls: list[str] = []

    def spy(cfg: TrainConfig):
        calls.append(f"{Path(cfg.out).parent.name}/{Path(cfg.out).name}")
        return train(cfg)

    run_grid(write(tmp_path, RECIPE), tmp_path / "r", ["d16"], ["cpt-frozen"], [3], overrides=TINY, run_stage=spy)
    assert calls == ["s3/pt", "s3/cpt-frozen"]


def test_profiles_change_seeds_and_settings_and_like_copies_then_changes():
    recipe = Recipe.from_dict(RECIPE, Path("/nowhere/recipe.json"), "quick")
    assert recipe.seeds == (7,)
    assert recipe.runs["cpt"]["lr"] == 0.0005 and recipe.runs["cpt-frozen"]["lr"] == 0.0005
    assert recipe.runs["cpt-frozen"]["freeze"] == "attention" and recipe.runs["cpt-frozen"]["from"] == "pt"
    assert Recipe.from_dict(RECIPE, Path("/nowhere/recipe.json")).runs["cpt"]["lr"] == 0.001


def test_relative_curricula_are_read_beside_the_recipe(tmp_path):
    (tmp_path / "c.json").write_text("{}")
    raw = {"scale": "toy", "runs": {"pt": {"curriculum": "c.json"}, "cpt": {"from": "pt", "curriculum": "x.json"}}}
    recipe = Recipe.from_dict(raw, tmp_path / "recipe.json")
    assert recipe.runs["pt"]["curriculum"] == str(tmp_path / "c.json")
    assert recipe.runs["cpt"]["curriculum"] == "x.json"  # not beside the recipe: left as given


def test_builtin_recipes_parse_with_every_profile():
    for scale in ("toy", "0.6b", "3b"):
        recipe = Recipe.load(scale)
        assert recipe.scale == scale and list(recipe.runs)[:2] == ["pt", "cpt"]
        assert recipe.runs["cpt-frozen"]["freeze"] == "attention"
        for run in recipe.runs.values():
            if "curriculum" in run:
                assert Path(run["curriculum"]).is_file()
    assert Recipe.load("toy", "demo").seeds == (0,)
    for scale in ("toy", "0.6b", "3b"):  # every profile a built-in recipe names loads
        for profile in json.loads(Path(Recipe.load(scale).source).read_text()).get("profiles", {}):
            assert Recipe.load(scale, profile).scale == scale


def test_the_toy_recipe_s_qk_norm_profile_changes_pt_alone():
    """``--profile qk-norm`` (docs/training.md, why toy-k64v16 collapses): the pt of every member with its queries
    and keys RMS-normalised and one logit bound, 16, for every head width; every other setting as the recipe's."""
    plain, qkn = Recipe.load("toy"), Recipe.load("toy", "qk-norm")
    assert qkn.runs["pt"] == plain.runs["pt"] | {"qk_norm": True, "qk_norm_scale": 16.0}
    assert {k: v for k, v in qkn.runs.items() if k != "pt"} == {k: v for k, v in plain.runs.items() if k != "pt"}
    assert qkn.seeds == plain.seeds == (0, 1, 2)


@pytest.mark.parametrize(
    "runs, match",
    [
        ({"pt": {}, "cpt": {"from": "nope"}}, "not an earlier run"),
        ({"pt": {}, "b": {"like": "nope"}}, "not an earlier run"),
        ({"pt": {"from": "pt"}}, "has no `from`"),
        ({"pt": {"lrr": 1}}, r"unknown settings \['lrr'\]"),
        ({"warm": {}}, "stages are pt, cpt and sft"),
    ],
)
def test_bad_recipes_are_refused(runs, match):
    with pytest.raises(TrainError, match=match):
        Recipe.from_dict({"scale": "toy", "runs": runs}, Path("r.json"))


def test_missing_recipe_profile_and_members_are_named(tmp_path):
    with pytest.raises(TrainError, match="does not exist"):
        Recipe.load(tmp_path / "none.json")
    with pytest.raises(TrainError, match="no profile 'fast'"):
        Recipe.load(write(tmp_path, RECIPE), "fast")
    with pytest.raises(TrainError, match="unknown members"):
        run_grid(write(tmp_path, RECIPE), tmp_path / "r", ["d99"])


def test_parallel_chains_train_exactly_what_one_process_trains(tmp_path):
    from safetensors.torch import load_file

    recipe = write(tmp_path, {**RECIPE, "runs": {k: RECIPE["runs"][k] for k in ("pt", "cpt")}})
    one_thread = {**TINY, "threads": 1}
    serial = run_grid(recipe, tmp_path / "serial", ["d16"], overrides=one_thread, log=lambda _: None)
    counts: list[tuple[int, int]] = []

    def told(done: int, total: int, _status: str) -> None:
        counts.append((done, total))

    parallel = run_grid(recipe, tmp_path / "parallel", ["d16"], overrides={**one_thread, "progress": True},
                        log=lambda _: None, jobs=2, on_step=told)  # fmt: skip
    # all chains' steps as one count: 2 seeds x (pt, cpt) x 2 steps, each step told once, in order
    assert [done for done, _ in counts] == list(range(1, 9)) and {total for _, total in counts} == {8}
    key = lambda r: (r["member"], r["seed"], r["run"])  # noqa: E731
    assert sorted(map(key, parallel["runs"])) == sorted(map(key, serial["runs"])) and len(serial["runs"]) == 4
    for a in serial["runs"]:
        b = next(r for r in parallel["runs"] if key(r) == key(a))
        wa, wb = (load_file(Path(r["checkpoint"]) / "model.safetensors") for r in (a, b))
        assert all(torch.equal(wa[n], wb[n]) for n in wa) and a["final_loss"] == b["final_loss"]


def test_a_parallel_grid_starts_every_chains_long_run_before_the_short_runs_that_follow(tmp_path, capfd):
    """Runs, not whole chains, are what the processes take: with three chains on two processes the third
    chain's pt starts before any cpt (its longer work ahead goes first), and each cpt once its own pt is done.
    A scheduler of whole chains would leave one process idle while the third chain trains alone."""
    recipe = write(tmp_path, {**RECIPE, "seeds": [0, 1, 2], "runs": {k: RECIPE["runs"][k] for k in ("pt", "cpt")}})
    tiny = {**TINY, "threads": 1}
    manifest = run_grid(recipe, tmp_path / "runs", ["d16"], overrides=tiny, log=lambda _: None, jobs=2)
    started = [(int(m[1]), m[2]) for m in re.finditer(r"seed (\d) (\w+): training into", capfd.readouterr().out)]
    assert sorted(started) == [(s, r) for s in (0, 1, 2) for r in ("cpt", "pt")], started
    first_cpt = min(i for i, (_, run) in enumerate(started) if run == "cpt")
    assert started.index((2, "pt")) < first_cpt, started
    done = [(r["seed"], r["run"]) for r in manifest["runs"]]
    assert done == [(s, r) for s in (0, 1, 2) for r in ("pt", "cpt")]  # the manifest in chain and recipe order
    for seed in (0, 1, 2):  # each cpt started from its own chain's pt
        chain = tmp_path / "runs" / "toy-d16" / f"s{seed}"
        assert json.loads((chain / "cpt" / "train_config.json").read_text())["init"] == str(chain / "pt" / "final")
