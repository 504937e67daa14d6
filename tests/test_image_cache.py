"""The training disk cache (MONAI PersistentDataset) is verified on read: an entry altered on disk (bit rot that
still loads), a truncated entry and a source image replaced in place are never served; the first two are rebuilt
from the source with one log line."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
import torch
from monai.transforms import Compose
from PIL import Image

from medclr.training.data import _load_resize_transform, pixel_checksum, source_identity, verified_persistent_dataset


def _png(path, seed):
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 48), dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture
def cached(tmp_path):
    paths = [_png(tmp_path / f"img{i}.png", i) for i in range(3)]

    def dataset():
        items = [{"image": p, "resize": 32, "dtype": "uint8", "source": source_identity(p)} for p in paths]
        return verified_persistent_dataset(items, Compose([_load_resize_transform(32, "uint8")]), tmp_path / "cache")

    (tmp_path / "cache").mkdir()
    first = dataset()
    originals = [first[i]["image"].clone() for i in range(3)]
    return dataset, paths, originals, tmp_path / "cache"


def _entry(cache_dir, ds, i):
    return cache_dir / f"{ds.hash_func(ds.data[i]).decode('utf-8')}{ds.transform_hash}.pt"


def test_altered_and_truncated_entries_are_rebuilt_not_served(cached, caplog):
    dataset, _paths, originals, cache_dir = cached
    ds = dataset()
    rotted = _entry(cache_dir, ds, 0)
    entry = torch.load(rotted, weights_only=True)
    entry["image"][0, 3, :5] ^= 0x40  # flipped bits; the file still loads, the stored checksum no longer fits
    torch.save(entry, rotted)
    truncated = _entry(cache_dir, ds, 1)
    truncated.write_bytes(truncated.read_bytes()[:200])
    with caplog.at_level(logging.WARNING, logger="medclr.training.data"):
        got = [ds[i]["image"] for i in range(3)]
    for a, b in zip(got, originals):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert "do not match the checksum" in caplog.text and "unreadable" in caplog.text
    assert len([r for r in caplog.records if "rebuilt from" in r.getMessage()]) == 2
    rebuilt = torch.load(rotted, weights_only=True)  # rewritten with the source's pixels
    assert pixel_checksum(rebuilt["image"]) == rebuilt["checksum"] == pixel_checksum(originals[0])


def test_a_source_replaced_in_place_gets_a_new_entry(cached):
    dataset, paths, originals, _ = cached
    before = os.stat(paths[2]).st_mtime_ns
    _png(paths[2], seed=99)
    os.utime(paths[2], ns=(time.time_ns(), max(before + 1, time.time_ns())))
    fresh = dataset()[2]["image"]
    assert not torch.equal(fresh, originals[2])
    want = Compose([_load_resize_transform(32, "uint8")])({"image": paths[2]})["image"]
    torch.testing.assert_close(fresh, want, rtol=0, atol=0)
