"""Typed training configs: YAML recipes, unknown keys, overrides, nested configs, the recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from draftsmith.core.config import (
    ConfigError,
    apply_overrides,
    config_help,
    config_to_dict,
    save_config,
)
from draftsmith.data.documents import DataConfig
from draftsmith.heads import Eagle3Config, MedusaConfig
from draftsmith.train.config import TrainConfig
from draftsmith.train.config import load_train_config as load_config
from draftsmith.train.objectives import ObjectiveConfig

REPO = Path(__file__).resolve().parents[1]
MINIMAL = {
    "target": "smollm2-135m",
    "head": "eagle3",
    "data": {"source": "stdlib", "seq_len": 256},
    "max_steps": 10,
    "output_dir": "runs/x",
}


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_minimal_recipe_builds_typed_nested_configs(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert isinstance(config, TrainConfig)
    assert config.data == DataConfig(source="stdlib", seq_len=256)
    assert config.objective == ObjectiveConfig()
    assert config.eval_data is None and config.feature_cache is None
    assert config.adam_betas == (0.9, 0.95)


def test_unknown_keys_are_errors_naming_the_key_and_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'learning_rate' in TrainConfig; valid"):
        load_config(write(tmp_path, {**MINIMAL, "learning_rate": 1e-3}))
    with pytest.raises(ConfigError, match=r"'data.seqlen' in DataConfig; valid keys: source"):
        load_config(write(tmp_path, {**MINIMAL, "data": {"source": "stdlib", "seqlen": 4}}))
    with pytest.raises(ConfigError, match=r"'objective.decay'.*step_decay"):
        load_config(write(tmp_path, MINIMAL), ["objective.decay=0.5"])


def test_missing_and_mistyped_values_are_errors(tmp_path):
    raw = {k: v for k, v in MINIMAL.items() if k != "max_steps"}
    with pytest.raises(ConfigError, match="missing required key 'max_steps'"):
        load_config(write(tmp_path, raw))
    with pytest.raises(ConfigError, match="lr must be float, got 'fast'"):
        load_config(write(tmp_path, MINIMAL), ["lr=fast"])
    with pytest.raises(ConfigError, match="mixed_precision must be one of"):
        load_config(write(tmp_path, MINIMAL), ["mixed_precision=fp8"])
    with pytest.raises(ConfigError, match=r"data: seq_len must be at least 2"):
        load_config(write(tmp_path, MINIMAL), ["data.seq_len=1"])
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_config(write(tmp_path, MINIMAL), ["warmup_steps=10"])


def test_overrides_parse_yaml_scalars_and_reach_nested_keys(tmp_path):
    config = load_config(
        write(tmp_path, MINIMAL),
        [
            "lr=3e-4",
            "max_steps=20",
            "data.seq_len=128",
            "objective.divergence=jsd",
            "head_args.num_steps=5",
            "feature_cache=/tmp/cache",
            "clip_grad_norm=null",
            "adam_betas=[0.8, 0.9]",
            "eval_data.source=chitchat",
            "eval_data.split=heldout",
            "eval_data.seq_len=128",
        ],
    )
    assert config.lr == 3e-4 and config.max_steps == 20
    assert config.data.seq_len == 128 and config.data.source == "stdlib"
    assert config.objective.divergence == "jsd"
    assert config.head_args == Eagle3Config(num_steps=5)
    assert config.feature_cache == "/tmp/cache" and config.clip_grad_norm is None
    assert config.adam_betas == (0.8, 0.9)
    assert config.eval_data == DataConfig(source="chitchat", split="heldout", seq_len=128)


def test_integers_are_accepted_for_floats_but_not_booleans(tmp_path):
    assert load_config(write(tmp_path, MINIMAL), ["lr=1"]).lr == 1.0
    with pytest.raises(ConfigError, match="max_steps must be int"):
        load_config(write(tmp_path, MINIMAL), ["max_steps=true"])


def test_bad_override_syntax_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="is not key=value"):
        load_config(write(tmp_path, MINIMAL), ["max_steps"])
    with pytest.raises(ConfigError, match="lr is not a mapping"):
        apply_overrides({"lr": 1.0}, ["lr.x=1"])


def test_saved_config_loads_back_equal(tmp_path):
    config = load_config(
        write(tmp_path, MINIMAL), ["head_args.num_steps=3", "adam_betas=[0.5, 0.6]"]
    )
    save_config(config, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == config
    assert config_to_dict(config)["adam_betas"] == [0.5, 0.6]
    assert yaml.safe_load((tmp_path / "saved.yaml").read_text())["head_args"] == {
        "seed": 0,
        "num_steps": 3,
        "draft_vocab_size": None,
        "feature_layers": None,
        "norm_before_fc": False,
        "norm_before_residual": False,
        "standardize_fc_init": True,
    }


def test_head_args_are_read_into_the_kind_s_typed_config(tmp_path):
    raw = {**MINIMAL, "head": "medusa", "head_args": {"num_steps": 3, "draft_vocab_size": 64}}
    assert load_config(write(tmp_path, raw)).head_args == MedusaConfig(
        num_steps=3, draft_vocab_size=64
    )


def test_head_args_typo_is_an_error_when_the_recipe_is_read(tmp_path):
    """Before any model loads (reading a recipe loads none), not deep in the head's build."""
    raw = {**MINIMAL, "head": "medusa", "head_args": {"num_heads": 3}}
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'head_args.num_heads' in MedusaConfig; valid keys: seed, num_steps, "
        r"draft_vocab_size$",
    ):
        load_config(write(tmp_path, raw))
    with pytest.raises(ConfigError, match="head_args: num_steps must be at least 1"):
        load_config(write(tmp_path, MINIMAL), ["head_args.num_steps=0"])
    with pytest.raises(ConfigError, match="head: unknown drafter kind 'eagle4'"):
        load_config(write(tmp_path, {**MINIMAL, "head": "eagle4"}))


def test_help_lists_every_key_with_its_docstring():
    text = config_help(TrainConfig)
    assert "  data.seq_len = 2048: Tokens per packed row." in text
    assert "  objective.divergence = 'forward_kl': forward_kl (soft labels, EAGLE-3)" in text
    assert "  max_steps (required): Optimizer steps" in text


RECIPES = sorted((REPO / "recipes").glob("*/*.yaml"))


@pytest.mark.parametrize("path", [p for p in RECIPES if p.parent.name != "accelerate"], ids=str)
def test_every_recipe_loads_and_opens_with_its_launch_command(path):
    first = path.read_text().splitlines()[0]
    # The launch command's own overrides (a recipe may need one, e.g. init_from), then ours.
    overrides = [word for word in first.split() if "=" in word and not word.startswith("-")]
    if any(word.startswith("init_from=") for word in overrides):
        # It builds on an artifact its user trains first: every other key checks out, and the
        # one complaint is the artifact that is not there yet.
        with pytest.raises(ConfigError, match="^init_from: no drafter artifact at"):
            load_config(path, [*overrides, "output_dir=/tmp/x"])
        return
    config = load_config(path, [*overrides, "output_dir=/tmp/x"])
    assert config.output_dir == "/tmp/x"
    assert first.startswith("# accelerate launch") or first.startswith("# draftsmith train")
    assert str(path.relative_to(REPO)) in path.read_text().splitlines()[1] + first


def test_a_bare_no_reads_as_the_literal_option_it_spells(tmp_path):
    # YAML 1.1 parses `no` as False; mixed_precision's options are strings.
    assert load_config(write(tmp_path, MINIMAL), ["mixed_precision=no"]).mixed_precision == "no"
    raw = {**MINIMAL, "mixed_precision": False}
    assert load_config(write(tmp_path, raw)).mixed_precision == "no"
    with pytest.raises(ConfigError, match="mixed_precision"):
        load_config(write(tmp_path, MINIMAL), ["mixed_precision=yes"])
