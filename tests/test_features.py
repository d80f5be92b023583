"""Target features: online batches, the feature cache (equal to online, resumable, checked)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from draftsmith.core.target import next_token_mask
from draftsmith.train import features as features_module
from draftsmith.train.features import (
    CachedFeatures,
    FeatureCache,
    OnlineFeatures,
    cache_layers,
    estimate_cache_bytes,
    write_feature_cache,
)

LAYERS = (0, 1)  # the embeddings and the first layer; the cache adds the last (2)


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen2", seed=5)


@pytest.fixture(scope="module")
def rows():
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 256, (7, 16), generator=gen, dtype=torch.int32)
    loss_mask = torch.ones(7, 16, dtype=torch.int8)
    loss_mask[6, 10:] = 0  # a padded last row
    return input_ids, loss_mask


def write(target, rows, folder, **kwargs):
    options = {"target_name": "tiny", "dtype": "float32", "batch_size": 3, "rows_per_shard": 2}
    return write_feature_cache(target, *rows, LAYERS, folder, **{**options, **kwargs})


def test_next_token_mask_shifts_to_the_predicting_position():
    mask = torch.tensor([[1, 0, 1, 1]])
    assert next_token_mask(mask).tolist() == [[False, True, True, False]]


def test_online_batch_holds_the_requested_layers_and_the_target_logits(target, rows):
    source = OnlineFeatures(target, LAYERS, *rows)
    batch = source.batch(torch.tensor([4, 1]), "cpu")
    ids = rows[0][[4, 1]].long()
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    expected = torch.cat([out.hidden_states[0], out.hidden_states[1]], dim=-1)
    torch.testing.assert_close(batch.features, expected, rtol=0, atol=0)
    torch.testing.assert_close(batch.target_logits, out.logits, rtol=0, atol=0)
    assert batch.input_ids.dtype == torch.long and torch.equal(batch.input_ids, ids)
    assert not batch.target_logits.requires_grad


def test_heads_without_features_get_none(target, rows):
    batch = OnlineFeatures(target, (), *rows).batch(torch.tensor([0]), "cpu")
    assert batch.features is None and batch.target_logits.shape == (1, 16, 256)


def test_cached_batches_equal_online_ones(tmp_path, target, rows):
    write(target, rows, tmp_path / "cache")
    cache = FeatureCache(tmp_path / "cache")
    assert len(cache) == 7 and cache.layers == cache_layers(LAYERS, 2) == (0, 1, 2)
    online, cached = OnlineFeatures(target, LAYERS, *rows), CachedFeatures(target, LAYERS, cache)
    indices = torch.tensor([6, 0, 3])  # across shards, the padded row included
    a, b = online.batch(indices, "cpu"), cached.batch(indices, "cpu")
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    torch.testing.assert_close(b.features, a.features, rtol=0, atol=0)
    torch.testing.assert_close(b.target_logits, a.target_logits, rtol=1e-5, atol=1e-5)


def test_bfloat16_cache_is_close_to_online(tmp_path, target, rows):
    write(target, rows, tmp_path / "cache", dtype="bfloat16")
    cached = CachedFeatures(target, LAYERS, FeatureCache(tmp_path / "cache"))
    a = OnlineFeatures(target, LAYERS, *rows).batch(torch.arange(7), "cpu")
    b = cached.batch(torch.arange(7), "cpu")
    torch.testing.assert_close(b.features, a.features, rtol=2e-2, atol=2e-2)
    assert (b.target_logits.argmax(-1) == a.target_logits.argmax(-1)).float().mean() > 0.95


def test_an_interrupted_write_resumes_where_it_stopped(tmp_path, target, rows, monkeypatch):
    folder = tmp_path / "cache"
    real_save = features_module.save_file
    saved = []

    def dies_on_third_shard(tensors, path):
        if len(saved) == 2:
            with open(path, "wb") as half:  # the temporary file a crash leaves
                half.write(b"half a shard")
            raise KeyboardInterrupt
        saved.append(path)
        real_save(tensors, path)

    monkeypatch.setattr(features_module, "save_file", dies_on_third_shard)
    with pytest.raises(KeyboardInterrupt):
        write(target, rows, folder)
    assert sorted(p.name for p in folder.glob("shard-*.safetensors")) == [
        "shard-00000.safetensors",
        "shard-00001.safetensors",
    ]
    with pytest.raises(FileNotFoundError, match="2 of 4 shards missing"):
        FeatureCache(folder)
    written = {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-*.safetensors")}

    monkeypatch.setattr(features_module, "save_file", real_save)
    write(target, rows, folder)
    for name, mtime in written.items():
        assert (folder / name).stat().st_mtime_ns == mtime  # kept, not rewritten
    cached = CachedFeatures(target, LAYERS, FeatureCache(folder))
    a = OnlineFeatures(target, LAYERS, *rows).batch(torch.arange(7), "cpu")
    b = cached.batch(torch.arange(7), "cpu")
    torch.testing.assert_close(b.features, a.features, rtol=0, atol=0)


def test_processes_split_the_shards(tmp_path, target, rows):
    folder = tmp_path / "cache"
    assert write(target, rows, folder, rank=1, world_size=2) == 3  # rows 2-3 and 6
    assert sorted(p.name for p in folder.glob("shard-*")) == [
        "shard-00001.safetensors",
        "shard-00003.safetensors",
    ]
    assert write(target, rows, folder, rank=0, world_size=2) == 4
    assert write(target, rows, folder) == 0  # complete: nothing left to write
    assert len(FeatureCache(folder)) == 7


def test_a_started_cache_keeps_its_own_shard_size(tmp_path, target, rows):
    folder = tmp_path / "cache"
    assert write(target, rows, folder, rows_per_shard=3, rank=0, world_size=2) == 4  # 0-2, 6
    assert write(target, rows, folder, rows_per_shard=2) == 3  # rows 3-5: still shards of 3
    assert sorted(p.name for p in folder.glob("shard-*")) == [
        f"shard-0000{i}.safetensors" for i in range(3)
    ]
    cached = CachedFeatures(target, LAYERS, FeatureCache(folder))
    a = OnlineFeatures(target, LAYERS, *rows).batch(torch.arange(7), "cpu")
    torch.testing.assert_close(cached.batch(torch.arange(7), "cpu").features, a.features)


def test_size_is_estimated_and_printed_before_writing(tmp_path, target, rows, capsys):
    assert estimate_cache_bytes(7, 16, 64, 3, "bfloat16") == 7 * 16 * (3 * 64 * 2 + 5)
    write(target, rows, tmp_path / "cache")
    printed = capsys.readouterr().out
    assert "7 rows x 16 tokens, layers [0, 1, 2] in float32" in printed and "4 shards" in printed


def test_a_cache_of_other_data_or_layers_is_refused(tmp_path, target, rows):
    folder = tmp_path / "cache"
    write(target, rows, folder)
    other = (rows[0].flip(0), rows[1])
    with pytest.raises(ValueError, match="data_sha256"):
        write(target, other, folder)
    with pytest.raises(ValueError, match=r"needs \[3\] too"):
        CachedFeatures(tiny_model("qwen2", num_hidden_layers=3), (3,), FeatureCache(folder))


def test_targets_whose_logits_are_not_the_lm_head_of_the_last_layer_are_refused(
    tmp_path, rows, monkeypatch
):
    scaled = tiny_model("qwen2", seed=5)
    forward = scaled.forward

    def scaled_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits * 2  # like Cohere's logit_scale or Gemma's soft-capping
        return out

    monkeypatch.setattr(scaled, "forward", scaled_forward)
    with pytest.raises(ValueError, match="train online"):
        write(scaled, rows, tmp_path / "cache")
