"""What the frozen target gives the trainer: hidden-state features and next-token logits.

Two sources with one interface (`FeatureSource.batch(indices) -> TargetBatch`):

- `OnlineFeatures` runs the target under ``torch.no_grad`` inside the training loop.
- `CachedFeatures` reads a feature cache written once by `write_feature_cache`.

**What the cache stores.** Full-vocabulary logits do not fit on disk (seq_len x 49,152 floats a
row for SmolLM2, 151,936 for Qwen), and top-k logits would change the objective (the tail of
the target's distribution would be lost). The cache stores the hidden states instead: the
head's feature layers plus the target's last one, which in transformers' ``hidden_states`` is
taken after the final norm, so ``logits = lm_head(last)``. That one matrix product is
recomputed at train time: it costs a small share of a full target forward (the LM head only,
no attention or MLP). A target whose logits are not ``lm_head(last)`` (soft-capping, scaling)
is detected when the cache is written, and refused. Hidden states are stored in bf16 by default
(``feature_cache_dtype``), so cached logits differ from online ones by that rounding.

Layout of a cache folder::

    meta.json                     what was cached: target, layers, dtype, rows, data hash
    shard-00000.safetensors       input_ids (n, T) int32, loss_mask (n, T) int8,
    shard-00001.safetensors       hidden.<layer> (n, T, H) for each stored layer
    ...

Each shard is written to a temporary name and renamed, so a shard that exists is complete;
writing resumes by skipping existing shards, and with several processes each writes every
``world_size``-th shard.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from datasets import Dataset
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from draftsmith.core.target import Target, TargetBatch, next_token_mask

__all__ = [
    "CACHE_FORMAT",
    "CachedFeatures",
    "FeatureCache",
    "FeatureSource",
    "OnlineFeatures",
    "cache_layers",
    "estimate_cache_bytes",
    "write_feature_cache",
]

CACHE_FORMAT = 1
META_FILE = "meta.json"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def packed_rows(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids, loss_mask (N, T) of a packed dataset's rows (`build_dataset`)."""
    table = dataset.with_format("numpy")
    return (
        torch.from_numpy(np.asarray(table["input_ids"], dtype=np.int32)),
        torch.from_numpy(np.asarray(table["loss_mask"], dtype=np.int8)),
    )


class FeatureSource(Protocol):
    """Rows of training data with the frozen target's view of them."""

    def __len__(self) -> int: ...

    def batch(self, indices: torch.Tensor, device: torch.device | str) -> TargetBatch:
        """The `TargetBatch` of rows `indices` (B,), on `device`."""
        ...


class OnlineFeatures:
    """Runs the target on each batch (the target is in the training loop)."""

    def __init__(
        self,
        target: PreTrainedModel,
        layers: tuple[int, ...],
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
    ) -> None:
        """input_ids, loss_mask (N, T): all rows, in the data pipeline's mask convention."""
        self.target = target
        self.layers = tuple(layers)
        self.input_ids = input_ids
        self.loss_mask = loss_mask

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def batch(self, indices: torch.Tensor, device: torch.device | str) -> TargetBatch:
        input_ids = self.input_ids[indices].long().to(device)
        return Target(self.target, self.layers).batch(input_ids, self.loss_mask[indices])


def cache_layers(layers: tuple[int, ...], num_hidden_layers: int) -> tuple[int, ...]:
    """Hidden-state layers a cache stores: the head's, plus the last (its logits' input)."""
    return tuple(sorted({*layers, num_hidden_layers}))


def estimate_cache_bytes(rows: int, seq_len: int, hidden_size: int, layers: int, dtype: str) -> int:
    """Bytes of a cache of `rows` rows storing `layers` hidden-state layers."""
    per_token = layers * hidden_size * _DTYPES[dtype].itemsize + 4 + 1  # + int32 id + int8 mask
    return rows * seq_len * per_token


class FeatureCache:
    """Read access to a complete cache folder (see the module doc)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.meta = _read_meta(self.folder)
        if self.meta is None:
            raise FileNotFoundError(f"{self.folder} is not a feature cache (no {META_FILE})")
        missing = [s for s in range(self.meta["shards"]) if not self.shard_path(s).is_file()]
        if missing:
            raise FileNotFoundError(
                f"feature cache {self.folder} is incomplete: {len(missing)} of "
                f"{self.meta['shards']} shards missing (run the trainer again to finish it)"
            )
        self.rows_per_shard: int = self.meta["rows_per_shard"]
        self.layers: tuple[int, ...] = tuple(self.meta["layers"])
        self._open: dict[int, object] = {}

    def __len__(self) -> int:
        return self.meta["rows"]

    def shard_path(self, shard: int) -> Path:
        return _shard_path(self.folder, shard)

    def rows(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """Stored tensors of rows `indices` (B,): input_ids (B, T), loss_mask (B, T),
        hidden.<layer> (B, T, H)."""
        names = ["input_ids", "loss_mask", *(f"hidden.{i}" for i in self.layers)]
        picked: dict[str, list[torch.Tensor]] = {name: [] for name in names}
        for index in indices.tolist():
            shard, offset = divmod(index, self.rows_per_shard)
            handle = self._handle(shard)
            for name in names:
                picked[name].append(handle.get_slice(name)[offset : offset + 1])
        return {name: torch.cat(parts) for name, parts in picked.items()}

    def _handle(self, shard: int):
        if shard not in self._open:
            self._open[shard] = safe_open(str(self.shard_path(shard)), framework="pt")
        return self._open[shard]


class CachedFeatures:
    """Reads features from a `FeatureCache` and recomputes the logits with the target's LM head."""

    def __init__(self, target: PreTrainedModel, layers: tuple[int, ...], cache: FeatureCache):
        last = target.config.get_text_config().num_hidden_layers
        missing = sorted(set(cache_layers(layers, last)) - set(cache.layers))
        if missing:
            raise ValueError(
                f"feature cache {cache.folder} stores layers {list(cache.layers)} but this head "
                f"needs {missing} too: use another feature_cache folder"
            )
        self.target = target
        self.layers = tuple(layers)
        self.cache = cache
        self.last = last

    def __len__(self) -> int:
        return len(self.cache)

    @torch.no_grad()
    def batch(self, indices: torch.Tensor, device: torch.device | str) -> TargetBatch:
        rows = {name: t.to(device) for name, t in self.cache.rows(indices).items()}
        lm_head = self.target.get_output_embeddings()
        dtype = lm_head.weight.dtype
        features = None
        if self.layers:
            features = torch.cat([rows[f"hidden.{i}"].to(dtype) for i in self.layers], dim=-1)
        return TargetBatch(
            input_ids=rows["input_ids"].long(),
            loss_mask=next_token_mask(rows["loss_mask"]),
            features=features,
            target_logits=lm_head(rows[f"hidden.{self.last}"].to(dtype)),
        )


def write_feature_cache(
    target: PreTrainedModel,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    layers: tuple[int, ...],
    folder: str | Path,
    *,
    target_name: str,
    dtype: str = "bfloat16",
    batch_size: int = 8,
    rows_per_shard: int = 64,
    rank: int = 0,
    world_size: int = 1,
) -> int:
    """Write (or finish writing) the feature cache of rows `input_ids`, `loss_mask` (N, T).

    Every process calls it; process `rank` writes shards rank, rank + world_size, ... (small
    shards keep the processes' shares even). Shards already in `folder` are skipped, and a cache
    already started keeps its own rows_per_shard. The caller waits for all processes before
    reading.
    Returns how many rows this process wrote (0 when its shards were all there).

    Raises:
        ValueError: `folder` holds a cache of other data, target or layers; or the target's
            logits cannot be recomputed from its last hidden state.
        OSError: the disk lacks room for the estimated size.
    """
    folder = Path(folder)
    config = target.config.get_text_config()
    stored = cache_layers(layers, config.num_hidden_layers)
    rows, seq_len = input_ids.shape
    meta = {
        "format": CACHE_FORMAT,
        "target": target_name,
        "target_config": _config_digest(target),
        "layers": list(stored),
        "dtype": dtype,
        "rows": rows,
        "seq_len": seq_len,
        "rows_per_shard": rows_per_shard,
        "shards": math.ceil(rows / rows_per_shard),
        "data_sha256": _data_digest(input_ids, loss_mask),
    }
    existing = _read_meta(folder)
    if existing is not None and "rows_per_shard" in existing:
        rows_per_shard = existing["rows_per_shard"]  # how it is split is the cache's own business
        meta.update(rows_per_shard=rows_per_shard, shards=math.ceil(rows / rows_per_shard))
    if existing is not None and existing != meta:
        changed = sorted(k for k in meta if existing.get(k) != meta[k])
        raise ValueError(
            f"feature cache {folder} was written for other settings ({', '.join(changed)} "
            f"differ): delete it or set feature_cache to another folder"
        )
    todo = [
        s for s in range(rank, meta["shards"], world_size) if not _shard_path(folder, s).is_file()
    ]
    if rank == 0:
        size = estimate_cache_bytes(rows, seq_len, config.hidden_size, len(stored), dtype)
        done = meta["shards"] - sum(
            not _shard_path(folder, s).is_file() for s in range(meta["shards"])
        )
        print(
            f"feature cache {folder}: {rows:,} rows x {seq_len} tokens, layers {list(stored)} in "
            f"{dtype}: {size / 2**30:.2f} GiB in {meta['shards']} shards ({done} already written)"
        )
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        if size * (meta["shards"] - done) / meta["shards"] > free:
            raise OSError(
                f"feature cache {folder} needs about {size / 2**30:.2f} GiB but only "
                f"{free / 2**30:.2f} GiB is free: free space, cache fewer rows "
                f"(data.max_tokens) or train online (feature_cache=null)"
            )
        if existing is None:
            _write_json(folder / META_FILE, meta)
    if not todo:
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    _check_logits_from_last(target, input_ids[: min(rows, 2)].long(), stored)
    device = target.device
    with tqdm(
        total=len(todo) * rows_per_shard, unit="row", desc="caching features", disable=rank != 0
    ) as progress:
        for shard in todo:
            start, stop = shard * rows_per_shard, min((shard + 1) * rows_per_shard, rows)
            parts: dict[str, list[torch.Tensor]] = {f"hidden.{i}": [] for i in stored}
            for first in range(start, stop, batch_size):
                ids = input_ids[first : min(first + batch_size, stop)].long().to(device)
                _, _, hidden = Target(target, stored).forward(ids)
                for i in stored:
                    parts[f"hidden.{i}"].append(hidden[i].to(_DTYPES[dtype]).cpu())
                progress.update(ids.shape[0])
            tensors = {name: torch.cat(chunks).contiguous() for name, chunks in parts.items()}
            tensors["input_ids"] = input_ids[start:stop].to(torch.int32).contiguous()
            tensors["loss_mask"] = loss_mask[start:stop].to(torch.int8).contiguous()
            final = _shard_path(folder, shard)
            tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
            save_file(tensors, str(tmp))
            tmp.replace(final)
    return sum(min((s + 1) * rows_per_shard, rows) - s * rows_per_shard for s in todo)


def _check_logits_from_last(
    target: PreTrainedModel, input_ids: torch.Tensor, stored: tuple[int, ...]
) -> None:
    """Refuse targets whose logits are not the LM head applied to their last hidden state."""
    _, logits, hidden = Target(target, stored).forward(input_ids.to(target.device))
    with torch.no_grad():
        recomputed = target.get_output_embeddings()(hidden[-1])
    scale = logits.float().abs().max().clamp_min(1.0)
    if not torch.allclose(recomputed.float(), logits.float(), rtol=0, atol=1e-2 * float(scale)):
        raise ValueError(
            f"{type(target).__name__}'s logits are not lm_head(last hidden state) (logit "
            f"soft-capping or scaling?), so a feature cache cannot recompute them: train "
            f"online (feature_cache=null)"
        )


def _shard_path(folder: Path, shard: int) -> Path:
    return folder / f"shard-{shard:05d}.safetensors"


def _read_meta(folder: Path) -> dict | None:
    try:
        return json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, payload: dict) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)


def _config_digest(target: PreTrainedModel) -> str:
    """sha256 of the target's config: a cache is only reused for the same architecture."""
    return hashlib.sha256(target.config.to_json_string(use_diff=False).encode()).hexdigest()


def _data_digest(input_ids: torch.Tensor, loss_mask: torch.Tensor) -> str:
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(input_ids.to(torch.int32).numpy()).tobytes())
    digest.update(np.ascontiguousarray(loss_mask.to(torch.int8).numpy()).tobytes())
    return digest.hexdigest()
