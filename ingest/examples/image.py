"""A small image classifier over WebDataset shards, decoded in the Ray Data pool.

    python -m ingest.examples.image [--config PATH] [KEY=VALUE ...]

Each sample of a tar shard is ``<key>.png`` (the image) and ``<key>.cls`` (the label). The
PNGs are decoded by :class:`DecodeImages` on the CPU decode pool, never on the training
ranks, which receive ready float tensors. With ``data.generate`` set and no shards at
``data.url``, synthetic shards are written first (each class a different colour pattern).
"""

from __future__ import annotations

import io
import sys
import tarfile
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import torch
from torch import nn

from ingest.examples.common import Config, Job, default_config, main

SIZE = 32


class DecodeImages:
    """Decode-pool transform: PNG bytes -> (n, 3, 32, 32) float32, label, id."""

    def __init__(self) -> None:
        from PIL import Image  # imported once per pool actor

        self._image = Image

    def __call__(self, table: pa.Table) -> dict[str, Any]:
        """Decode one block: ``id`` from the key, ``image`` from the PNG, ``label``."""
        keys = table.column("__key__").to_pylist()
        images = np.stack(
            [
                np.asarray(
                    self._image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32
                ).transpose(2, 0, 1)
                / 255.0
                for png in table.column("png").to_pylist()
            ]
        )
        labels = np.array([int(c) for c in table.column("cls").to_pylist()], dtype=np.int64)
        ids = np.array([int(k.rsplit("-", 1)[1]) for k in keys], dtype=np.int64)
        return {"id": ids, "image": images, "label": labels}


def build(config: Config) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small CNN over ``data.generate.classes`` classes, with AdamW at ``train.lr``."""
    classes = int(config["data"]["generate"]["classes"])
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )
    return model, torch.optim.AdamW(model.parameters(), lr=float(config["train"]["lr"]))


def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, Any]) -> torch.Tensor:
    """One classification step on ``batch["image"]``/``batch["label"]``; the detached loss."""
    loss = nn.functional.cross_entropy(model(batch["image"]), batch["label"])
    optimizer.zero_grad()
    torch.autograd.backward(loss)
    optimizer.step()
    return loss.detach()


def write_image_shards(
    url: str, storage_options: dict[str, Any], shards: int, rows: int, classes: int, seed: int = 0
) -> None:
    """Write synthetic WebDataset shards of 32x32 PNGs with a class label each.

    Args:
        url: Directory URL to write ``images-NNNNN.tar`` files to.
        storage_options: fsspec options for that URL's store.
        shards: Number of files.
        rows: Samples per file (keys run on across files).
        classes: Labels are in ``range(classes)``; each has its own colour pattern.
        seed: Seed of the generator.
    """
    from PIL import Image

    fs, root = fsspec.core.url_to_fs(url, **storage_options)
    fs.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for n in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(n * rows, (n + 1) * rows):
                label = int(rng.integers(0, classes))
                pixels = rng.integers(0, 60, (SIZE, SIZE, 3), dtype=np.uint8)
                pixels[:, :, label % 3] += np.uint8(120 + 40 * (label // 3))
                png = io.BytesIO()
                Image.fromarray(pixels).save(png, format="PNG")
                for ext, payload in (("png", png.getvalue()), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"sample-{i:08d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        with fs.open(f"{root.rstrip('/')}/images-{n:05d}.tar", "wb") as f:
            f.write(buf.getvalue())


JOB = Job("image", build, step, columns=["__key__", "png", "cls"], transform=DecodeImages)


def _generate(url: str, storage_options: dict[str, Any], gen: dict[str, Any]) -> None:
    write_image_shards(
        url, storage_options, int(gen["shards"]), int(gen["rows"]), int(gen["classes"])
    )


if __name__ == "__main__":
    sys.exit(main(JOB, default_config("image"), "*.tar", _generate))
