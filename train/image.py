"""A small image classifier over an ImageFolder tree, decoded in the Ray Data pool.

    python train/image.py [--config PATH] [KEY=VALUE ...]
    ray job submit --working-dir . -- python train/image.py [KEY=VALUE ...]

The config is train/configs/image.yaml unless --config names another. data.url is an
ImageFolder layout, <root>/<class>/<id>.png (on disk, s3:// or hf://), read with
format="imagefolder": each file is a row with its label (the index of its directory's name).
The PNGs are decoded by DecodeImages in the CPU decode pool, never on the training ranks,
which receive ready float tensors. With data.generate set and no images at data.url,
synthetic ones are written first (each class a different colour pattern).
"""

from __future__ import annotations

import io
import posixpath
import sys
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import torch
from harness import Config, Job, main
from torch import nn

import ingest

CONFIG = Path(__file__).parent / "configs" / "image.yaml"
"""The default config."""
SIZE = 32


class DecodeImages:
    """Decode-pool transform: PNG bytes -> (n, 3, 32, 32) float32, label, and the row ``id``
    (the file's name, ``<id>.png``, which the job's exactly-once witness counts)."""

    def __init__(self) -> None:
        self._decode = ingest.decode.Images((SIZE, SIZE), keep=("label",))

    def __call__(self, table: pa.Table) -> dict[str, Any]:
        out = self._decode(table)
        names = table.column("path").to_pylist()
        out["id"] = np.array(
            [int(posixpath.splitext(posixpath.basename(p))[0]) for p in names], dtype=np.int64
        )
        return out


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


def write_image_folder(
    url: str, storage_options: dict[str, Any], rows: int, classes: int, seed: int = 0
) -> None:
    """Write a synthetic ImageFolder tree of 32x32 PNGs: ``<url>/class-<c>/<id>.png``.

    Args:
        url: Root directory URL.
        storage_options: fsspec options for that URL's store.
        rows: Images in all; ids run from 0.
        classes: Labels are in ``range(classes)``; each has its own colour pattern.
        seed: Seed of the generator.
    """
    from PIL import Image

    fs, root = fsspec.core.url_to_fs(url, **storage_options)
    rng = np.random.default_rng(seed)
    for c in range(classes):
        fs.makedirs(f"{root.rstrip('/')}/class-{c}", exist_ok=True)
    for i in range(rows):
        label = int(rng.integers(0, classes))
        pixels = rng.integers(0, 60, (SIZE, SIZE, 3), dtype=np.uint8)
        pixels[:, :, label % 3] += np.uint8(120 + 40 * (label // 3))
        png = io.BytesIO()
        Image.fromarray(pixels).save(png, format="PNG")
        with fs.open(f"{root.rstrip('/')}/class-{label}/{i:08d}.png", "wb") as f:
            f.write(png.getvalue())


JOB = Job(
    "image",
    build,
    step,
    columns=["path", "image", "label"],
    transform=DecodeImages,
    format="imagefolder",
)


def _generate(url: str, storage_options: dict[str, Any], gen: dict[str, Any]) -> None:
    write_image_folder(url, storage_options, int(gen["rows"]), int(gen["classes"]))


if __name__ == "__main__":
    sys.exit(main(JOB, CONFIG, "*/*.png", _generate, description=__doc__))
