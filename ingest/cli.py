"""The ``ingest`` command line. Thin: parses arguments and calls the library.

    ingest ls URL [URL ...] [--storage-option KEY=VALUE ...] [--format NAME] [--count]

Exit codes: 0 success, 2 bad input (the one-line error says what and how to fix it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tqdm.auto import tqdm

from ingest.catalog import Catalog, Listing
from ingest.errors import IngestError
from ingest.formats import get_format
from ingest.formats.base import ReadOptions
from ingest.sources import Source, parse_storage_options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ingest", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list the shards of a source with their sizes and rows")
    ls.add_argument("urls", nargs="+", metavar="URL", help="file, directory or glob (fsspec)")
    ls.add_argument(
        "--storage-option",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec storage option; dotted keys nest "
        "(client_kwargs.endpoint_url=http://127.0.0.1:9000)",
    )
    ls.add_argument("--format", help="format of every shard (default: from the extension)")
    ls.add_argument(
        "--count",
        action="store_true",
        help="read shards whose footer has no row count (JSONL, CSV, tar) to count",
    )
    return parser


def _count(catalog: Catalog, listing: Listing) -> list[int | None]:
    rows: list[int | None] = [i.rows for i in listing.infos]
    todo = [n for n, r in enumerate(rows) if r is None]
    for n in tqdm(todo, desc="counting rows", unit="shard", leave=False, disable=not todo):
        ctx = listing.context(n, catalog.source, catalog.options, None)
        with get_format(ctx.shard.format).open(ctx) as reader:
            rows[n] = sum(b.data.num_rows for b in reader.read(0, None, None))
    return rows


def ls(urls: Sequence[str], storage_options: Sequence[str], format: str | None, count: bool) -> int:
    source = Source(urls, storage_options=parse_storage_options(storage_options), format=format)
    catalog = Catalog(source, ReadOptions(), None)
    listing = catalog.scan(progress=True, schema=False)
    rows = _count(catalog, listing) if count else [i.rows for i in listing.infos]
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "ls":
            return ls(args.urls, args.storage_option, args.format, args.count)
    except IngestError as e:
        print(f"ingest {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
