"""Shuffle quality: mean per-batch label entropy as a fraction of a uniform shuffle's.

A batch of an ideal (uniform) shuffle is an i.i.d. sample of the labels, so its label
entropy is as high as the label mix allows; a reader that serves one sorted shard at a time
gives batches of one label, entropy 0. Only full batches count. Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def batch_entropy(labels: npt.NDArray[np.integer], n_labels: int) -> float:
    """Shannon entropy (nats) of the labels in one batch."""
    counts = np.bincount(labels, minlength=n_labels)
    p = counts[counts > 0] / len(labels)
    return float(-(p * np.log(p)).sum())


def uniform_entropy(
    shard_labels: Sequence[int], rows_per_shard: int, batch_size: int, seed: int = 0
) -> float:
    """Mean batch entropy of a uniform random permutation of every row's label.

    Args:
        shard_labels: The label of each shard (each shard holds one label).
        rows_per_shard: Rows in each shard.
        batch_size: Rows per batch, as the contenders deliver them.
        seed: Seed of the permutation.

    Returns:
        The mean entropy over the full batches of the permutation.

    Raises:
        ValueError: If the rows do not fill one batch.
    """
    labels = np.repeat(np.asarray(shard_labels, dtype=np.int64), rows_per_shard)
    full = len(labels) // batch_size
    if full == 0:
        raise ValueError(f"{len(labels)} rows do not fill one batch of {batch_size}")
    n_labels = int(labels.max()) + 1
    perm = np.random.default_rng(seed).permutation(labels)[: full * batch_size]
    return float(np.mean([batch_entropy(b, n_labels) for b in perm.reshape(full, batch_size)]))
