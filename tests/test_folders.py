"""Folder datasets (ImageFolder / AudioFolder) on the loopback S3 server: work units, labels,
the class list in the state, resume by seeking to a file, decoding in the reader pool."""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import ray

import ingest
from ingest.core.errors import ConfigError, ShardError
from ingest.formats.base import ReadOptions
from ingest.formats.folder import FolderLabelsWarning, ImageFolderFormat, class_of, group
from ingest.storage.sources import Shard, Source
from ingest.testing import Store, write_audio_folder, write_image_folder
from tests.resumed import through_a_resume

CLASSES = ("cat", "dog", "eel")
PER_CLASS = 45  # 135 files: 3 work units of 64, 64 and 7 (FILES_PER_UNIT)


def files(n: int, fmt: str = "imagefolder", size: int = 10) -> list[Shard]:
    return [
        Shard(f"s3://b/pets/{'cat' if i % 2 else 'dog'}/{i:04d}.png", size, f"v{i}", fmt)
        for i in range(n)
    ]


def test_files_are_grouped_into_units_with_their_labels() -> None:
    listed = [*files(150), Shard("s3://b/x.parquet", 5, "", "parquet")]
    units, classes = group(sorted(listed, key=lambda s: s.url), files_per_unit=64)
    assert classes == ("cat", "dog")
    folder = [u for u in units if u.members]
    assert [len(u.members) for u in folder] == [64, 64, 22]
    assert Shard("s3://b/x.parquet", 5, "", "parquet") in units, "other formats pass unchanged"
    members = [m for u in folder for m in u.members]
    assert members == sorted(members, key=lambda s: s.url) and len(set(members)) == 150
    for u in folder:
        assert u.url == f"{u.members[0].url}+{len(u.members) - 1}"
        assert u.size == sum(m.size for m in u.members)
        assert [classes[i] for i in u.labels] == [class_of(m.url) for m in u.members]


def test_files_at_several_depths_are_labelled_with_a_warning_naming_them() -> None:
    """A file's label is its directory's name: files at several depths below the listing
    (``pets/top.png`` beside ``pets/cat/a.png``, or ``pets/dog/puppy/e.png``) were labelled
    ``pets`` and ``puppy`` without a word. ``datasets`` adds labels only where every file is
    at one depth; the stream keeps its labels and says which files it labelled so."""
    shards = [
        Shard(f"s3://b/pets/{name}", 10, "v", "imagefolder")
        for name in ("cat/a.png", "dog/c.png", "dog/puppy/e.png", "top.png")
    ]
    with pytest.warns(FolderLabelsWarning, match="folders above other labelled folders") as w:
        _, classes = group(shards)
    said = str(w[0].message)
    assert said.startswith("2 files"), said
    assert "s3://b/pets/top.png" in said and "s3://b/pets/dog/c.png" in said, said
    assert classes == ("cat", "dog", "pets", "puppy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FolderLabelsWarning)
        group(files(10))  # one depth: no warning
        group([*files(4), Shard("s3://b/more/pets/cat/x.png", 10, "v", "imagefolder")])


def test_a_unit_is_cut_at_its_byte_bound_and_changes_with_any_file() -> None:
    units, _ = group(files(10, size=40), files_per_unit=64, unit_bytes=100)
    assert [len(u.members) for u in units] == [2, 2, 2, 2, 2]
    changed = files(10, size=40)
    changed[3] = Shard(changed[3].url, 40, "v-new", "imagefolder")
    again, _ = group(changed, files_per_unit=64, unit_bytes=100)
    assert [u.version != v.version for u, v in zip(units, again, strict=True)] == [
        False,
        True,
        False,
        False,
        False,
    ]
    with pytest.raises(ValueError, match="files_per_unit"):
        group(files(2), files_per_unit=0)


@pytest.fixture(scope="module")
def pets(s3: Any) -> tuple[Store, dict[str, str]]:
    store = Store("s3", s3.filesystem(), "s3://ingest-test/folders/pets", s3.storage_options())
    written = write_image_folder(store.fs, store.root, CLASSES, PER_CLASS)
    return store, {"s3://" + store.fs._strip_protocol(u): c for u, c in written.items()}


def stream(store: Store, **kwargs: Any) -> ingest.Stream:
    options: dict[str, Any] = {"batch_size": 8, "shuffle_seed": 3, **kwargs}
    return ingest.Stream(
        store.root + "/",
        format="imagefolder",
        storage_options=store.storage_options,
        **options,
    )


def rows(batches: Any) -> list[tuple[str, int, str]]:
    out: list[tuple[str, int, str]] = []
    for b in batches:
        out += zip(b["path"], b["label"].tolist(), b["label_name"], strict=True)
    return out


def test_every_file_once_per_epoch_with_its_label(pets: tuple[Store, dict[str, str]]) -> None:
    store, written = pets
    s = stream(store)
    got = rows(s)
    assert len(s.state_dict()["dataset"]["shards"]) == 3, "135 files: 3 work units"
    paths = [p for p, _, _ in got]
    assert len(paths) == len(set(paths)) and set(paths) <= set(written)
    assert len(written) - len(paths) < 8, "only the remainder (< a batch) is carried"
    for path, label, name in got:
        assert name == written[path] and CLASSES[label] == name
    assert "README.txt" not in " ".join(paths)
    assert s.stats["opens"] >= len(paths), "each file is fetched on its own"


def test_a_resume_seeks_to_the_file_and_keeps_the_class_list(
    pets: tuple[Store, dict[str, str]],
) -> None:
    store, written = pets
    # A resume rebuilds the shuffle window it stopped in (the rows of the uninterrupted run's
    # next batches), so a small window bounds the files fetched again.
    first = stream(store, shuffle_window=16, shuffle_lanes=2)
    loop = iter(first)
    head = rows(next(loop) for _ in range(6))
    state = first.state_dict()
    assert state["dataset"]["classes"] == list(CLASSES)
    second = stream(store, shuffle_window=16, shuffle_lanes=2)
    second.load_state_dict(state)
    rest = rows(second)
    paths = [p for p, _, _ in head + rest]
    assert len(paths) == len(set(paths)) and len(written) - len(paths) < 8
    # A seek, not a replay: the files delivered, and at most one window's again.
    assert second.stats["opens"] <= len(rest) + 16


def test_a_class_added_since_the_state_was_saved_is_refused(s3_store: Store) -> None:
    write_image_folder(s3_store.fs, s3_store.root, ("a", "b"), 3)
    first = stream(s3_store, batch_size=2)
    next(iter(first))
    state = first.state_dict()
    write_image_folder(s3_store.fs, s3_store.root, ("c",), 1)
    second = stream(s3_store, batch_size=2)
    with pytest.raises(ingest.StateError, match=r"classes changed.*added: \['c'\]"):
        second.load_state_dict(state)


def test_a_file_that_is_not_an_image_fails_with_its_url(s3_store: Store) -> None:
    write_image_folder(s3_store.fs, s3_store.root, ("a",), 2)
    s3_store.write("a/broken.png", b"not a png")
    s = stream(s3_store, batch_size=3, transform=ingest.decode.Images((16, 16)))
    with pytest.raises(ingest.ShardError, match=r"a/broken\.png.*cannot be decoded as an image"):
        list(s)


def test_with_on_error_skip_an_image_that_does_not_decode_is_quarantined_alone(
    s3_store: Store,
) -> None:
    """Issue 17: the one image that did not decode quarantined its whole batch (7 good
    files of 8 lost with it); now it is quarantined alone, as a bad JSONL line is."""
    write_image_folder(s3_store.fs, s3_store.root, ("a",), 7)
    s3_store.write("a/broken.png", b"not a png")
    s = stream(
        s3_store,
        batch_size=8,
        transform=ingest.decode.Images((16, 16), keep=("label",)),
        read=ReadOptions(on_error="skip"),
    )
    (batch,) = list(s)
    assert batch["image"].shape == (7, 3, 16, 16) and batch["label"].tolist() == [0] * 7
    [record] = s.quarantined
    broken = sorted(s3_store.fs.ls(s3_store.root + "/a")).index(
        s3_store.fs._strip_protocol(s3_store.url("a/broken.png"))
    )
    assert record.url is not None and record.url.endswith("+7"), record  # the work unit
    assert (record.start, record.stop, record.rows) == (broken, broken + 1, 1), record
    assert "a/broken.png" in record.reason and "cannot be decoded as an image" in record.reason


def _captioned(root: Path, kind: str) -> dict[str, str]:
    """Six PNGs in ``root`` and ``root/sub`` and a metadata file at ``root`` (``kind``:
    jsonl, csv or parquet) giving each its caption and a number; the captions by file."""
    from PIL import Image

    (root / "sub").mkdir(parents=True)
    names = [f"sub/{i}.png" if i % 2 else f"{i}.png" for i in range(6)]
    for i, name in enumerate(names):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(root / name)
    table = pa.table(
        {"file_name": names, "text": [f"caption {i}" for i in range(6)], "n": list(range(6))}
    )
    if kind == "jsonl":
        (root / "metadata.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in table.to_pylist())
        )
    elif kind == "csv":
        pcsv.write_csv(table, root / "metadata.csv")
    else:
        pq.write_table(table, root / "metadata.parquet")
    return {str(root / n): f"caption {i}" for i, n in enumerate(names)}


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_a_metadata_file_gives_the_files_its_columns_as_datasets_reads_it(
    tmp_path: Path, kind: str
) -> None:
    """``datasets``' imagefolder reads ``metadata.jsonl`` (``.csv``, ``.parquet``) beside
    the images as their columns by ``file_name`` (a caption per image: how text-to-image
    datasets are laid out), without labels. A folder stream dropped it without a word and
    labelled the rows by their directories' names; now each row has its columns, as
    ``datasets`` gives them, resumed exactly once."""
    datasets = pytest.importorskip("datasets")
    captions = _captioned(tmp_path / "d", kind)
    reference = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "d"), split="train")
    assert sorted(reference.column_names) == ["image", "n", "text"]
    assert sorted(reference["text"]) == sorted(captions.values())
    url = str(tmp_path / "d") + "/"
    got = {}
    for batch in ingest.Stream(url, format="imagefolder", batch_size=2, shuffle_seed=1):
        assert sorted(batch) == ["image", "n", "path", "text"]
        for path, text, n in zip(batch["path"], batch["text"], batch["n"].tolist(), strict=True):
            got[path.removeprefix("file://")] = (text, n)
    assert got == {p: (c, int(c.split()[1])) for p, c in captions.items()}
    kwargs: dict[str, Any] = {"format": "imagefolder", "batch_size": 2, "shuffle_seed": 3}
    assert sorted(through_a_resume(url, 1, "text", **kwargs)) == sorted(captions.values())


def test_a_file_without_a_metadata_row_is_named(tmp_path: Path) -> None:
    _captioned(tmp_path / "d", "jsonl")
    lines = (tmp_path / "d" / "metadata.jsonl").read_text().splitlines()
    (tmp_path / "d" / "metadata.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ShardError, match=r"sub/5\.png.*no row in .*metadata\.jsonl.*file_name"):
        list(ingest.Stream(str(tmp_path / "d") + "/", format="imagefolder", batch_size=6))
    # Files beside which no metadata file lies, in a listing of files that have one.
    (tmp_path / "e" / "x").mkdir(parents=True)
    _captioned(tmp_path / "e" / "y", "jsonl")
    (tmp_path / "e" / "x" / "lone.png").write_bytes((tmp_path / "e" / "y" / "0.png").read_bytes())
    with pytest.raises(ConfigError, match=r"x/lone\.png has no metadata"):
        list(ingest.Stream(str(tmp_path / "e") + "/", format="imagefolder", batch_size=6))
    # A file named twice, and a metadata file without file_name.
    meta = tmp_path / "d" / "metadata.jsonl"
    meta.write_text("\n".join([*lines, lines[0]]) + "\n")
    with pytest.raises(ShardError, match=r"names '0\.png' in two rows"):
        list(ingest.Stream(str(tmp_path / "d") + "/", format="imagefolder", batch_size=6))
    meta.write_text(json.dumps({"name": "0.png", "text": "a"}) + "\n")
    with pytest.raises(ShardError, match=r"no 'file_name' column"):
        list(ingest.Stream(str(tmp_path / "d") + "/", format="imagefolder", batch_size=6))


def test_a_single_file_named_with_a_folder_format_is_refused(
    pets: tuple[Store, dict[str, str]],
) -> None:
    store, _ = pets
    with pytest.raises(ingest.ConfigError, match="not a imagefolder file"):
        list(
            ingest.Stream(
                store.url("README.txt"), format="imagefolder", storage_options=store.storage_options
            )
        )


def test_images_decode_to_fixed_shape_tensors(pets: tuple[Store, dict[str, str]]) -> None:
    store, written = pets
    s = stream(store, transform=ingest.decode.Images((16, 16), keep=("label",)))
    seen: Counter[int] = Counter()
    for batch in s:
        image, label = batch["image"], batch["label"]
        assert image.shape[1:] == (3, 16, 16) and str(image.dtype) == "torch.float32"
        # Red says the class (write_image_folder), so the label went with its image.
        assert ((image[:, 0, 0, 0] * 255).round().long() == 40 * label).all()
        seen.update(label.tolist())
    assert sum(seen.values()) > len(written) - 8


def test_audio_decodes_to_mono_clips_with_their_lengths(s3_store: Store) -> None:
    written = write_audio_folder(s3_store.fs, s3_store.root, ("yes", "no"), 3)
    s = ingest.Stream(
        s3_store.root + "/",
        format="audiofolder",
        storage_options=s3_store.storage_options,
        batch_size=6,
        transform=ingest.decode.Audio(sample_rate=8000, seconds=0.25),
    )
    (batch,) = list(s)
    assert batch["audio"].shape == (6, 2000)
    names = ("no", "yes")  # the class list is sorted: "no" is label 0
    for clip, frames, label in zip(batch["audio"], batch["frames"], batch["label"], strict=True):
        # write_audio_folder: class c of ("yes", "no") is a signal of (c + 1) / 10.
        level = (("yes", "no").index(names[int(label)]) + 1) / 10
        assert abs(float(clip[0]) - level) < 1e-6, "the signal went with its label"
        assert 1990 <= int(frames) < 2000 and float(clip[int(frames) :].abs().sum()) == 0.0
    assert len(written) == 6


def test_a_unit_s_files_are_fetched_with_bounded_concurrency(tmp_path: Any) -> None:
    fs = fsspec.filesystem("file")
    write_image_folder(fs, f"file://{tmp_path}/p", ("a",), 12)
    units, _ = group(
        Source(f"file://{tmp_path}/p/", format="imagefolder").list_shards(
            ingest.formats.FORMAT_RESOLVER
        )
    )
    (unit,) = units
    in_flight, most, lock = 0, 0, threading.Lock()

    class Slow(Source):
        def open(self, shard: Shard, **kwargs: Any) -> Any:
            nonlocal in_flight, most
            with lock:
                in_flight += 1
                most = max(most, in_flight)
            time.sleep(0.05)
            with lock:
                in_flight -= 1
            return super().open(shard, **kwargs)

    fmt = ImageFolderFormat()
    source = Slow(f"file://{tmp_path}/p/")
    info = fmt.inspect(source, unit, ReadOptions())
    ctx = ingest.formats.ReadContext(
        source, unit, info, ReadOptions(file_concurrency=3), fmt.schema(), "", None
    )
    with fmt.open(ctx) as reader:
        got = [
            b for batch in reader.read(2, 11, None) for b in batch.data.column("path").to_pylist()
        ]
    assert got == [m.url for m in unit.members[2:11]], "in order, rows 2..10"
    assert most == 3


@pytest.mark.usefixtures("ray_session")
def test_a_ray_stream_decodes_in_the_pool_with_every_file_once(
    pets: tuple[Store, dict[str, str]],
) -> None:
    store, written = pets
    with ingest.RayStream(
        store.root + "/",
        format="imagefolder",
        storage_options=store.storage_options,
        world_size=2,
        batch_size=8,
        shuffle_seed=1,
        columns=["path", "image", "label"],
        transform=ingest.decode.Images((16, 16), keep=("label",)),
    ) as rs:
        refs = [_ids.remote(rs.rank_iterator(r)) for r in range(2)]
        got = ray.get(refs, timeout=240)
    assert len(got[0]) == len(got[1]), "equal steps"
    ids = got[0] + got[1]
    assert len(ids) == len(set(ids)) and len(written) - len(ids) < 16


@ray.remote(num_cpus=0)
def _ids(it: Any) -> list[tuple[int, int]]:
    # (class, file number) from the decoded pixels: red and pixel (0, 0)'s green and blue.
    out = []
    for batch in it:
        image = (batch["image"] * 255).round().long()
        out += [
            (int(r) // 40, 256 * int(g) + int(b))
            for r, g, b in zip(image[:, 0, 0, 0], image[:, 1, 0, 0], image[:, 2, 0, 0], strict=True)
        ]
    return out


@pytest.mark.system
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("ray_session")
def test_the_image_job_trains_on_an_image_folder_exactly_once(tmp_path: Any) -> None:
    # The image job (train/image.py): an ImageFolder tree, decoded in the pool, under
    # TorchTrainer with an injected worker death (rank 1 exits once at step 5; Ray Train
    # restarts the group).
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        # The job joins the session's Ray (harness.init_ray) instead of starting and
        # stopping a local Ray of its own: ~17 s of 96 on a busy 2-core machine.
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        # The Ray Train controller polls its workers every 0.25 s, not 2 s (TorchTrainer
        # passes this variable of the driver on to it): the worker's death and the final
        # report are taken sooner.
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    }
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parent.parent / "train" / "image.py"),
            f"data.url={tmp_path}/pets/",
            f"run.storage_path={tmp_path}/runs",
            f"fault.marker={tmp_path}/died",
            "fault.die_at_step=5",
            "train.epochs=1",
            "data.generate.rows=384",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=560,
        env=env,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "exactly once: 384 of 384 rows seen 1x" in out, out[-4000:]
    assert (tmp_path / "died").exists(), "the injected death happened"


def hub_media_shard(path: Path, column: str, datas: list[bytes | None]) -> None:
    """A Parquet shard as the Hugging Face Hub holds an image or audio dataset (what
    ``datasets`` writes for an ``Image()`` or ``Audio()`` feature): each row's file as
    ``struct<bytes, path>`` beside its ``label``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    files = [{"bytes": d, "path": f"train/{n:03d}.bin"} for n, d in enumerate(datas)]
    pq.write_table(
        pa.table({column: pa.array(files, kind), "label": list(range(len(datas)))}), path
    )


def test_images_decode_from_a_hub_dataset_s_image_column(tmp_path: Path) -> None:
    """Image datasets on the Hub are Parquet with an ``Image()`` feature, ``struct<bytes,
    path>``, often not named ``image`` (CIFAR-10's is ``img``). Before, ``Images`` took the
    ``image`` column's values as bytes: a KeyError on ``img``, and a struct failed to decode
    ("a bytes-like object is required, not 'dict'")."""
    import io

    from PIL import Image

    def png(level: int) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", (5, 7), (level, 0, 0)).save(out, format="PNG")
        return out.getvalue()

    hub_media_shard(tmp_path / "train.parquet", "img", [png(10 * n) for n in range(6)])
    s = ingest.Stream(
        str(tmp_path / "train.parquet"),
        batch_size=6,
        transform=ingest.decode.Images((4, 4), column="img"),
    )
    (batch,) = list(s)
    assert batch["img"].shape == (6, 3, 4, 4)
    assert ((batch["img"][:, 0, 0, 0] * 255).round().long() == 10 * batch["label"]).all()

    hub_media_shard(tmp_path / "bad.parquet", "img", [png(0), None])
    bad = ingest.Stream(
        str(tmp_path / "bad.parquet"), batch_size=2, transform=ingest.decode.Images(column="img")
    )
    with pytest.raises(ingest.ShardError, match=r"train/001\.bin.*no bytes"):
        list(bad)
    with pytest.raises(ingest.ConfigError, match=r"column 'image'.*\['img', 'label'\]"):
        list(
            ingest.Stream(
                str(tmp_path / "train.parquet"), batch_size=6, transform=ingest.decode.Images()
            )
        )


def test_audio_decodes_from_a_hub_dataset_s_audio_column(tmp_path: Path) -> None:
    import io

    import numpy as np

    soundfile = pytest.importorskip("soundfile")

    def wav(level: float) -> bytes:
        out = io.BytesIO()
        soundfile.write(out, np.full(800, level, np.float32), 8000, format="WAV")
        return out.getvalue()

    hub_media_shard(tmp_path / "train.parquet", "speech", [wav(n / 10) for n in range(4)])
    s = ingest.Stream(
        str(tmp_path / "train.parquet"),
        batch_size=4,
        transform=ingest.decode.Audio(8000, 0.2, column="speech"),
    )
    (batch,) = list(s)
    assert batch["speech"].shape == (4, 1600) and batch["frames"].tolist() == [800] * 4
    assert np.allclose(batch["speech"][:, 0].numpy(), batch["label"].numpy() / 10, atol=1e-4)


def test_an_image_folder_read_without_its_format_says_which_format_reads_it(
    tmp_path: Path,
) -> None:
    """Images are read only with ``format="imagefolder"`` named. Without it, an image folder
    with a README.txt streamed the README as a one-row text dataset, without a word; one
    without a README failed with the known extensions alone. Both now name the format."""
    fs = fsspec.filesystem("file")
    write_image_folder(fs, str(tmp_path / "with_readme"))  # (it writes a README.txt)
    with pytest.warns(
        ingest.storage.sources.UnreadFolderFilesWarning,
        match=r"only 1 document.*20 image files.*imagefolder",
    ):
        stream = ingest.Stream(str(tmp_path / "with_readme"), batch_size=1)
        assert stream.listing().shards[0].format == "text"  # what was asked is read
    write_image_folder(fs, str(tmp_path / "bare"))
    fs.rm(str(tmp_path / "bare" / "README.txt"))
    with pytest.raises(ingest.NoShardsError, match=r"20 image files.*format='imagefolder'"):
        ingest.Stream(str(tmp_path / "bare"), batch_size=1).listing()
    # a picture beside a dataset's shards: no word
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "bare" / "data.parquet")
    fs.rm(str(tmp_path / "bare" / "cat"), recursive=True)
    fs.rm(str(tmp_path / "bare" / "dog" / "dog-00000.png"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ingest.storage.sources.UnreadFolderFilesWarning)
        ingest.Stream(str(tmp_path / "bare"), batch_size=1).listing()


@pytest.mark.parametrize("size", [7, (4,), (0, 4), (4.5, "4"), "224"])
def test_an_image_size_that_is_not_height_and_width_is_named(size: Any) -> None:
    # Found by a probe: Images(7) (torchvision's habit: one side) was a bare
    # "TypeError: object of type 'int' has no len()".
    with pytest.raises(ConfigError, match=r"size=.* must be \(height, width\)"):
        ingest.decode.Images(size)


def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def test_an_image_that_does_not_decode_is_named_without_an_object_address(
    tmp_path: Path,
) -> None:
    """Found by a probe: the error named ``<_io.BytesIO object at 0x7f...>``, Pillow's name
    for the bytes it was given, instead of the file. It names the file, Pillow's reason and
    the fix, and no object address."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "good.png").write_bytes(_png())
    (tmp_path / "a" / "bad.png").write_bytes(b"garbage, not a png")
    s = ingest.Stream(
        f"{tmp_path}/", format="imagefolder", batch_size=2, transform=ingest.decode.Images((4, 4))
    )
    with pytest.raises(ingest.ShardError) as err:
        list(s)
    message = str(err.value)
    assert "a/bad.png" in message and "cannot identify image file" in message
    assert "on_error='skip'" in message and " at 0x" not in message


def test_a_webdataset_member_that_does_not_decode_is_named_with_its_shard(
    tmp_path: Path,
) -> None:
    """Found by a probe: a WebDataset sample whose image did not decode was named ``row 1 of a
    batch`` (and an object address): neither the shard nor the member. It names both."""
    import io
    import tarfile

    with tarfile.open(tmp_path / "s-000.tar", "w") as tar:
        for key, data in (("k0", _png()), ("k1", b"garbage, not a png")):
            for ext, payload in (("png", data), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    decode = ingest.decode.Images((4, 4), keep=(), column="png")
    with pytest.raises(ingest.ShardError) as err:
        list(ingest.Stream(str(tmp_path / "s-000.tar"), batch_size=2, transform=decode))
    message = str(err.value)
    assert "s-000.tar" in message and "row 1" in message and "k1.png" in message
    assert "cannot identify image file" in message and " at 0x" not in message
    # under on_error="skip", the sample is quarantined alone, named the same way
    s = ingest.Stream(
        str(tmp_path / "s-000.tar"),
        batch_size=2,
        transform=decode,
        read=ReadOptions(on_error="skip"),
    )
    (batch,) = list(s)
    assert batch["png"].shape == (1, 3, 4, 4)
    [record] = s.quarantined
    assert record.url is not None and record.url.endswith("s-000.tar") and record.start == 1
    assert "k1.png" in record.reason and "row 0 of a batch" not in record.reason
