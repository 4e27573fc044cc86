"""Generated folder datasets: an ImageFolder of PNGs and an AudioFolder of WAVs whose pixels
and samples tell which file they came from.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import fsspec
import numpy as np


def write_image_folder(
    fs: fsspec.AbstractFileSystem,
    root: str,
    classes: Sequence[str] = ("cat", "dog"),
    per_class: int = 10,
    *,
    size: int = 16,
) -> dict[str, str]:
    """Write an ImageFolder layout, ``<root>/<class>/<class>-NNNNN.png``, and a README.

    Each class is a colour (class ``c`` has red ``40 * c``); pixel ``(0, 0)``'s green and
    blue hold the file's number (``256 * g + b``), so a decoded image tells which file it
    was. Returns every image's URL (as written) -> its class.
    """
    from PIL import Image

    written: dict[str, str] = {}
    base = root.rstrip("/")
    fs.makedirs(base, exist_ok=True)
    fs.pipe(f"{base}/README.txt", b"not an image: a folder listing leaves it out\n")
    for c, name in enumerate(classes):
        fs.makedirs(f"{base}/{name}", exist_ok=True)
        for n in range(per_class):
            pixels = np.full((size, size, 3), (40 * c % 256, 0, 0), dtype=np.uint8)
            pixels[0, 0, 1:] = (n // 256, n % 256)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="PNG")
            url = f"{base}/{name}/{name}-{n:05d}.png"
            fs.pipe(url, out.getvalue())
            written[url] = name
    return written


def write_audio_folder(
    fs: fsspec.AbstractFileSystem,
    root: str,
    classes: Sequence[str] = ("yes", "no"),
    per_class: int = 4,
    *,
    sample_rate: int = 8000,
    seconds: float = 0.25,
) -> dict[str, str]:
    """Write an AudioFolder layout of WAV files, ``<root>/<class>/<class>-NNNNN.wav``.

    File ``n`` of class ``c`` is a constant signal of ``(c + 1) / 10``, ``n + 1`` samples
    shorter than ``seconds``. Needs soundfile. Returns every file's URL -> its class.
    """
    import soundfile

    written: dict[str, str] = {}
    base = root.rstrip("/")
    frames = round(sample_rate * seconds)
    for c, name in enumerate(classes):
        fs.makedirs(f"{base}/{name}", exist_ok=True)
        for n in range(per_class):
            signal = np.full(frames - n - 1, (c + 1) / 10, dtype=np.float32)
            out = io.BytesIO()
            soundfile.write(out, signal, sample_rate, format="WAV", subtype="FLOAT")
            url = f"{base}/{name}/{name}-{n:05d}.wav"
            fs.pipe(url, out.getvalue())
            written[url] = name
    return written


__all__ = [
    "write_audio_folder",
    "write_image_folder",
]
