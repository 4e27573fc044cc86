"""The ``ingest`` command line. Thin: parses arguments and calls the library.

    ingest ls URL [URL ...] [--storage-option KEY=VALUE ...] [--format NAME] [--count]
    ingest index URL [URL ...] [-o KEY=VALUE ...] [--index-dir DIR_OR_URL] [--workers N] [--ray]
    ingest prepare URL [URL ...] --transform MODULE:NAME --derived URL_OR_DIR [-o KEY=VALUE ...]
                   [--columns A,B] [--format NAME] [--on-error raise|skip]
                   [--workers N] [--ray]
    ingest bench [ARGS ...]      (forwarded to ingest.tools.bench)

Exit codes: 0 success, 1 some units failed (``prepare --on-error skip``), 2 bad input (the
one-line error says what and how to fix it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from fsspec.utils import get_protocol
from tqdm.auto import tqdm

from ingest.core.errors import ConfigError, IngestError, StateError
from ingest.formats import open_reader
from ingest.formats.base import ReadOptions
from ingest.planner.catalog import Catalog, Listing
from ingest.planner.index import IndexConfig, Indexer, IndexStore, default_location, local_indexer
from ingest.storage.sources import Source, parse_storage_options

_DESCRIPTION = (
    "Work with the data a stream reads and the states it saves: list the shards of a source "
    "(ls), index them ahead of a run (index), derive them through a transform ahead of a run "
    "(prepare), find the rows a run's steps consumed (which), and leave rows out of a saved "
    "state after a loss spike (skip). Each command's --help says more."
)

_STORAGE_OPTION_HELP = (
    "fsspec storage option; dotted keys nest (client_kwargs.endpoint_url=http://127.0.0.1:9000)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ingest", description=_DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser(
        "ls",
        help="list the shards of a source with their sizes and rows",
        description="List the shards a stream over URL would read, with their format, size "
        "and row count (from their footers or the shard index; '?' where none is known: "
        "--count reads those shards to count them).",
    )
    _source_arguments(ls)
    ls.add_argument(
        "--count",
        action="store_true",
        help="read shards whose footer has no row count (JSONL, CSV, tar) to count",
    )
    ls.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per shard and line (url, format, bytes, rows: null if not counted)",
    )
    _index_parser(sub)
    _prepare_parser(sub)
    _which_parser(sub)
    _skip_parser(sub)
    sub.add_parser(
        "bench",
        add_help=False,
        help="compare this project with its peers on generated data (ingest bench --help)",
    )
    return parser


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every command that reads a source takes: URLs, store options, format."""
    parser.add_argument("urls", nargs="+", metavar="URL", help="file, directory or glob (fsspec)")
    parser.add_argument(
        "--storage-option",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=_STORAGE_OPTION_HELP,
    )
    parser.add_argument("--format", help="format of every shard (default: from the extension)")
    parser.add_argument(
        "--delimiter",
        help="CSV and TSV: the character between values (ReadOptions(delimiter=...)); the "
        "stream's, so that what the command keeps is the stream's",
    )
    parser.add_argument(
        "--column-names",
        type=_names,
        metavar="A,B,...",
        help="CSV and TSV without a header line: their columns' names, comma-separated "
        "(ReadOptions(column_names=[...])); the stream's, so that what the command keeps is "
        "the stream's",
    )
    parser.add_argument(
        "--field",
        metavar="KEY",
        help="JSON documents holding their rows under a key, as SQuAD's 'data' "
        "(ReadOptions(field=...)); the stream's, so that what the command keeps is the stream's",
    )
    parser.add_argument(
        "--no-partitions",
        action="store_true",
        help="read key=value directories as no columns (ReadOptions(partitioning=None))",
    )


def _names(text: str) -> list[str]:
    return text.split(",")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _index_parser(sub: Any) -> None:
    index = sub.add_parser(
        "index",
        help="build the persistent shard index (row counts, seek points) ahead of time",
        description="Read once every shard whose footer has no row count (JSONL, CSV, tar, "
        "Arrow streams) and store its row count and seek points in the shard index, so "
        "streams on this data plan without reading any shard. Shards already indexed at "
        "the same size and version are skipped.",
    )
    _source_arguments(index)
    index.add_argument(
        "--index-dir",
        metavar="DIR_OR_URL",
        help=f"where the index lives: a directory or an fsspec URL such as "
        f"s3://bucket/ingest-index/ shared by a cluster (default: {default_location()})",
    )
    index.add_argument(
        "--index-option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="fsspec storage option for --index-dir (default: the -o options when the index "
        "URL has the data's protocol, none otherwise)",
    )
    index.add_argument(
        "--workers",
        type=_positive,
        default=16,
        help="shards read at once: threads, or Ray tasks with --ray (default: 16)",
    )
    index.add_argument(
        "--ray",
        action="store_true",
        help="read in Ray tasks (joins the cluster at RAY_ADDRESS, or starts a local Ray)",
    )


def _prepare_parser(sub: Any) -> None:
    prepare = sub.add_parser(
        "prepare",
        help="run a stage chain over every unit and keep the copies a stream's derived= reads",
        description="Derive every unit of the source through --transform and write the copies "
        "to --derived, so that a stream with the same source, columns, format, transform and "
        "derived= runs no stage (see ingest.engine.derived.prepare for what a unit is). "
        "Units already there are skipped.",
    )
    _source_arguments(prepare)
    prepare.add_argument(
        "--transform",
        required=True,
        metavar="MODULE:NAME",
        help="the stream's transform: a stage, a class, or a function of no arguments that "
        "returns the stages (mypkg.tok:make_tokenize); it must import here and on Ray nodes",
    )
    prepare.add_argument(
        "--derived",
        required=True,
        metavar="URL_OR_DIR",
        help="where the copies go: what the streams get as derived= (s3://bucket/derived/)",
    )
    prepare.add_argument(
        "--derived-option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="fsspec storage option for --derived (default: the -o options when --derived "
        "has the data's protocol, none otherwise)",
    )
    prepare.add_argument("--columns", help="the stream's columns, comma-separated (default: all)")
    prepare.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="a unit that fails stops the run (raise), or is counted and left out (skip)",
    )
    prepare.add_argument(
        "--workers",
        type=_positive,
        default=4,
        help="shards derived at once: threads, or Ray tasks with --ray (default: 4)",
    )
    prepare.add_argument(
        "--ray",
        action="store_true",
        help="derive in Ray tasks (joins the cluster at RAY_ADDRESS, or starts a local Ray)",
    )


def _which_parser(sub: Any) -> None:
    which = sub.add_parser(
        "which",
        help="which rows each rank's step consumed, from a run's provenance log",
        description="Print, for every rank, the rows (URL and row range) that the given steps "
        "consumed, as the run that kept the log at URL (its provenance=) handed them out: "
        "for each step, the attempt started last that reached back to it.",
    )
    which.add_argument("url", help="the run's provenance= (a directory or an fsspec URL)")
    which.add_argument(
        "--steps",
        required=True,
        type=_steps,
        metavar="N or FIRST-LAST",
        help="a step, or an inclusive range of steps (41190-41210)",
    )
    which.add_argument(
        "-o",
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec storage option for the log's URL",
    )
    which.add_argument("--json", action="store_true", help="one JSON object per line")


def _skip_parser(sub: Any) -> None:
    skip = sub.add_parser(
        "skip",
        help="leave rows out of a saved state (after a loss spike), from a run's provenance log",
        description="Write STATE with the rows some steps consumed (from the run's provenance "
        "log) or the rows named left out: counted as consumed, never delivered at any world "
        "size, and listed in the state (ingest.skip). STATE is a state saved as JSON, or a "
        "Ray Train checkpoint directory holding the stream's state.",
    )
    skip.add_argument("state", help="a state's JSON file, or a checkpoint directory")
    skip.add_argument(
        "--steps", type=_steps, metavar="N or FIRST-LAST", help="the steps to leave out"
    )
    skip.add_argument(
        "--rows",
        action="append",
        default=[],
        type=_row_range,
        metavar="URL:START-STOP",
        help="rows [START, STOP) of a shard to leave out (repeat for more)",
    )
    skip.add_argument("--provenance", metavar="URL", help="the run's provenance= (for --steps)")
    skip.add_argument(
        "-o",
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec storage option for the log's URL",
    )
    where = skip.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", metavar="PATH", help="write the state there")
    where.add_argument(
        "--in-place", action="store_true", help="replace STATE's file (the old one kept as .bak)"
    )


def _row_range(text: str) -> tuple[str, int, int]:
    url, _, span = text.rpartition(":")
    first, _, last = span.partition("-")
    try:
        start, stop = int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not URL:START-STOP") from None
    if not url or start < 0 or stop <= start:
        raise argparse.ArgumentTypeError(f"{text!r}: rows are URL:START-STOP, START < STOP")
    return url, start, stop


def _steps(text: str) -> range:
    first, _, last = text.partition("-")
    try:
        a = int(first)
        b = int(last) if last else a
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step or FIRST-LAST") from None
    if a < 0 or b < a:
        raise argparse.ArgumentTypeError(f"{text!r}: steps are >= 0, FIRST <= LAST")
    return range(a, b + 1)


def which(url: str, steps: range, storage_options: Sequence[str], as_json: bool) -> int:
    from ingest.engine.provenance import which as which_rows

    table = which_rows(url, steps, storage_options=parse_storage_options(storage_options))
    records = table.to_pylist()
    base = ("step", "rank", "epoch", "url", "start", "stop")
    for r in records:
        if as_json:
            print(json.dumps(r))
        else:  # a packing stream's pieces, a mixture's sources: their columns after
            more = "".join(f" {k}={v}" for k, v in r.items() if k not in base)
            print(f"step {r['step']} rank {r['rank']} epoch {r['epoch']} {r['url']} "
                  f"[{r['start']}, {r['stop']}){more}")  # fmt: skip
    found = {r["step"] for r in records}
    if "token_start" in table.column_names:
        tokens = sum(r["token_stop"] - r["token_start"] for r in records)
        what = f"{len(records)} pieces of documents, {tokens} tokens"
    else:
        what = f"{sum(r['stop'] - r['start'] for r in records)} rows"
    missing = len(steps) - len(found)
    print(
        f"{len(found)} step(s), {len({(r['step'], r['rank']) for r in records})} rank-steps, "
        f"{what}" + (f"; {missing} step(s) in no attempt of the log" if missing else ""),
        file=sys.stderr if as_json else sys.stdout,
    )
    return 0 if found else 1


def _skip_state(args: argparse.Namespace) -> tuple[str, str]:
    """``ingest skip``'s state file (in a checkpoint folder, its state file) and text, once
    the arguments are checked."""
    from ingest.core.state.checks import MAX_STATE_BYTES
    from ingest.integrations.ray_train import STATE_FILE

    if args.steps is None and not args.rows:
        raise ConfigError("ingest skip: give --steps (with --provenance) or --rows")
    if args.steps is not None and not args.provenance:
        raise ConfigError(
            "--steps needs --provenance LOG: the run's provenance log (the URL the stream was "
            "given as its provenance), which names the rows of each step"
        )
    path = os.path.join(args.state, STATE_FILE) if os.path.isdir(args.state) else args.state
    try:
        with open(path, "rb") as f:
            return path, f.read(MAX_STATE_BYTES + 1).decode("utf-8", "replace")
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot read the state ({e.strerror or e}); pass the state file the job "
            f"saved (its state_dict() as JSON), or the checkpoint folder holding it as "
            f"{STATE_FILE}"
        ) from None


def skip(args: argparse.Namespace) -> int:
    """``ingest skip``: the state at ``args.state`` with the rows left out, written out."""
    from ingest.core.quarantine import SKIPPED, is_skip
    from ingest.core.state import StreamState, read_state
    from ingest.engine.provenance import skip as skip_rows

    path, text = _skip_state(args)
    try:
        out = skip_rows(
            text,
            steps=args.steps,
            rows=args.rows or None,
            provenance=args.provenance,
            storage_options=parse_storage_options(args.storage_option),
        )
    except StateError as e:  # what is wrong with the state: named by its file, as above
        raise StateError(f"{path}: {e}") from None
    target = path if args.in_place else args.out
    try:
        with open(target + ".tmp", "w") as written:
            json.dump(out, written)
    except OSError as e:
        raise ConfigError(
            f"{target}: cannot write the state ({e.strerror or e}); pass --out in a folder "
            "that exists and may be written"
        ) from None
    if args.in_place:  # the state before kept, the new one put in its place whole
        os.replace(path, path + ".bak")
    os.replace(target + ".tmp", target)

    def progress_of(state: Any) -> list[Any]:  # each part's progress (a mixture's several)
        parsed = read_state(state)
        parts = [parsed] if isinstance(parsed, StreamState) else list(parsed.parts.values())
        return [part.progress for part in parts]

    before, after = progress_of(text), progress_of(out)
    had = [q for p in before for q in p.quarantined if is_skip(q)]
    added = [q for p in after for q in p.quarantined if is_skip(q) and q not in had]
    for q in added:
        print(f"{q.reason}: {q.rows} rows left out")
    waiting = [a for p in before for a in p.ahead]
    later = [a for p in after for a in p.ahead if a not in waiting]
    for a in later:
        print(f"{SKIPPED}: {a.what}: {a.count()} rows of epoch {a.epoch} left out when the "
              "resumed run reaches it")  # fmt: skip
    if not added and not later:
        print("no row left out: the state had consumed them all already")
    print(f"wrote {target}" + (f" (the state before: {path}.bak)" if args.in_place else ""))
    return 0


def _count(catalog: Catalog, listing: Listing) -> list[int | None]:
    """Row counts, reading the shards whose footer has none; each with its own schema (a
    listing may mix formats and schemas; a stream over it could not, a listing can)."""
    rows: list[int | None] = [i.rows for i in listing.infos]
    todo = [n for n, r in enumerate(rows) if r is None]
    quiet = not todo or not sys.stderr.isatty()  # bars only on a terminal
    for n in tqdm(todo, desc="counting rows", unit="shard", leave=False, disable=quiet):
        one = listing.subset([listing.shards[n].url])
        schema, origin = catalog.shard_schema(one.shards[0], one.infos[0])
        if schema is None:  # no records (empty, or a CSV file of its header alone)
            rows[n] = 0
            continue
        ctx = Listing(one.shards, one.infos, schema, origin).context(
            0, catalog.source, catalog.options, None
        )
        with open_reader(ctx) as reader:
            rows[n] = sum(b.data.num_rows for b in reader.read(0, None, None))
    return rows


def _read_options(args: argparse.Namespace) -> ReadOptions:
    """The stream's ``ReadOptions`` that a command reading a source takes from ``args``."""
    return ReadOptions(
        delimiter=args.delimiter,
        column_names=args.column_names,
        field=args.field,
        partitioning=None if args.no_partitions else "hive",
    )


def ls(
    urls: Sequence[str],
    storage_options: Sequence[str],
    format: str | None,
    count: bool,
    as_json: bool = False,
    read: ReadOptions | None = None,
) -> int:
    source = Source(urls, storage_options=parse_storage_options(storage_options), format=format)
    catalog = Catalog(source, read or ReadOptions(), None)
    # Bars only on a terminal: in logs and pipes they are noise around the listing.
    listing = catalog.scan(progress=sys.stderr.isatty(), schema=False)
    rows = _count(catalog, listing) if count else [i.rows for i in listing.infos]
    if as_json:
        for shard, r in zip(listing.shards, rows, strict=True):
            line = {"url": shard.url, "format": shard.format, "bytes": shard.size, "rows": r}
            print(json.dumps(line))
        return 0
    width = max(len(s.url) for s in listing.shards)
    print(f"{'path':<{width}}  {'format':<10}  {'bytes':>14}  {'rows':>12}")
    for shard, r in zip(listing.shards, rows, strict=True):
        print(
            f"{shard.url:<{width}}  {shard.format:<10}  {shard.size:>14,}  "
            f"{'?' if r is None else f'{r:,}':>12}"
        )
    known = sum(r for r in rows if r is not None)
    unknown = sum(1 for r in rows if r is None)
    total_bytes = sum(s.size for s in listing.shards)
    suffix = f" (+{unknown} shards not counted; --count reads them)" if unknown else ""
    print(f"{len(listing.shards)} shards, {known} rows, {total_bytes} bytes{suffix}")
    return 0


def index(
    urls: Sequence[str],
    storage_options: Sequence[str],
    format: str | None,
    index_dir: str | None,
    index_options: Sequence[str] | None,
    workers: int,
    use_ray: bool,
    read: ReadOptions | None = None,
) -> int:
    source_options = parse_storage_options(storage_options)
    source = Source(urls, storage_options=source_options, format=format)
    if index_options is not None:
        store_options = parse_storage_options(index_options)
    elif index_dir is not None and get_protocol(index_dir) == get_protocol(urls[0]):
        store_options = source_options
    else:
        store_options = {}
    store = IndexStore(IndexConfig(location=index_dir, storage_options=store_options))
    indexer: Indexer = local_indexer(workers)
    if use_ray:
        from ingest.distributed.index_tasks import ray_indexer

        _join_ray("index")
        indexer = ray_indexer(max_tasks_in_flight=workers)
    try:
        options = read or ReadOptions()
        catalog = Catalog(source, options, None, index_store=store, indexer=indexer)
        # Bars only on a terminal: in logs and pipes they are noise around the one-line result.
        listing = catalog.scan(progress=sys.stderr.isatty(), index=True)
    finally:
        if use_ray:
            import ray

            ray.shutdown()
    stats = store.stats
    print(
        f"{len(listing.shards)} shards, {stats.misses} indexed, {stats.hits} already indexed, "
        f"{listing.rows or 0} rows"
    )
    return 0


def prepare(args: argparse.Namespace) -> int:
    from ingest.engine.derived.prepare import load_transform
    from ingest.engine.derived.prepare import prepare as prepare_units
    from ingest.engine.derived.store import DerivedConfig
    from ingest.engine.derived.units import local_deriver

    source_options = parse_storage_options(args.storage_option)
    if args.derived_option is not None:
        derived_options = parse_storage_options(args.derived_option)
    elif get_protocol(args.derived) == get_protocol(args.urls[0]):
        derived_options = source_options
    else:
        derived_options = {}
    derived = DerivedConfig(url=args.derived, storage_options=derived_options)
    columns = None if args.columns is None else [c for c in args.columns.split(",") if c]
    transform = load_transform(args.transform)
    deriver = local_deriver(args.workers)
    if args.ray:
        from ingest.distributed.prepare_tasks import ray_deriver

        _join_ray("prepare")
        deriver = ray_deriver(max_tasks_in_flight=args.workers)
    try:
        report = prepare_units(
            args.urls, transform, derived, format=args.format, columns=columns,
            storage_options=source_options, deriver=deriver, read=_read_options(args),
            on_error=args.on_error, progress=sys.stderr.isatty(),
        )  # fmt: skip
    finally:
        if args.ray:
            import ray

            ray.shutdown()
    for failure in report.failures:
        print(f"ingest prepare: failed: {failure}", file=sys.stderr)
    print(report.summary())
    return 1 if report.failed else 0


def _join_ray(command: str) -> None:
    """Join the Ray cluster at RAY_ADDRESS, or start a local one (with Ray's own token
    authentication, as ``ray.init`` sets it up)."""
    import ray

    try:
        ray.init(log_to_driver=False)
    except (ConnectionError, RuntimeError) as e:
        raise ConfigError(
            f"--ray cannot start or join Ray ({e}); check RAY_ADDRESS, or leave out --ray "
            f"to {command} in threads here"
        ) from None


def bench(argv: Sequence[str]) -> int:
    """Run ``ingest.tools.bench.main(argv)``, imported only now (it pulls in the peers)."""
    try:
        module = importlib.import_module("ingest.tools.bench")
    except ModuleNotFoundError as e:
        if e.name in ("ingest.tools.bench", None):
            print(
                "ingest bench: error: this install has no ingest.tools.bench module; "
                "install ingest from a checkout that has ingest/tools/bench/ (pip install -e .)",
                file=sys.stderr,
            )
        else:
            print(
                f"ingest bench: error: the benchmark needs the package {e.name!r}, which is not "
                "installed; install the peers with pip install -e '.[bench]'",
                file=sys.stderr,
            )
        return 2
    try:
        return int(module.main(list(argv)))
    except IngestError as e:
        print(f"ingest bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    """The command ``args`` names (every one but ``bench``), run."""
    if args.command == "ls":
        return ls(
            args.urls, args.storage_option, args.format, args.count, args.json, _read_options(args)
        )
    if args.command == "index":
        return index(
            args.urls, args.storage_option, args.format, args.index_dir, args.index_option,
            args.workers, args.ray, _read_options(args),
        )  # fmt: skip
    if args.command == "which":
        return which(args.url, args.steps, args.storage_option, args.json)
    if args.command == "skip":
        return skip(args)
    return prepare(args)  # the one command left: the parser takes no other


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["bench"]:
        return bench(args_list[1:])
    args = _parser().parse_args(args_list)

    def show(message: Warning | str, *_: Any, **__: Any) -> None:  # one line, no source line
        print(f"ingest {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            return _run(args)
    except IngestError as e:
        print(f"ingest {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
