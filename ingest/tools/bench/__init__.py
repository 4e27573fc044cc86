"""``ingest bench``: this project against its peers, on the same data, in one run.

Contenders (``--contenders``, comma-separated, in this order by default):

- ``stream``: ``ingest.Stream`` in one process.
- ``raystream``: ``ingest.RayStream`` with ``--ranks`` rank processes.
- ``raydata``: Ray Data ``read_parquet`` + ``streaming_split(N, equal=True)`` +
  ``iter_torch_batches``.
- ``torch``: a torch ``DataLoader`` whose ``--workers`` processes read Parquet row groups
  with pyarrow over s3fs, shards split across the workers of every rank.
- ``hf``: Hugging Face ``datasets`` streaming (``split_dataset_by_node`` per rank) with
  torchdata's ``StatefulDataLoader`` (``pip install "ingest[bench]"``).
- ``mosaic``, ``litdata``: Mosaic Streaming and LitData, each over its own format written
  from the same rows with its own writer (conversion timed apart; ``make peers``).

All read the same generated Parquet shards on a loopback S3 server (moto) through a
counting proxy, all with the same shuffle window and seed, and every rank runs the same
consumer in its own process. Layout: :mod:`~ingest.tools.bench.config` (settings),
:mod:`~ingest.tools.bench.data` (datasets), :mod:`~ingest.tools.bench.proxy` (request counting),
:mod:`~ingest.tools.bench.consumer` (rank process and consumer),
:mod:`~ingest.tools.bench.contenders`
(registry) with :mod:`~ingest.tools.bench.ours`, :mod:`~ingest.tools.bench.raydata`,
:mod:`~ingest.tools.bench.torch_peer`, :mod:`~ingest.tools.bench.hf`;
:mod:`~ingest.tools.bench.measure`
(phases and figures), :mod:`~ingest.tools.bench.quality` (shuffle quality),
:mod:`~ingest.tools.bench.report` (table, JSON, plot) and :mod:`~ingest.tools.bench.run`.

    ingest bench [--contenders stream,raystream,raydata,torch,hf,mosaic,litdata] [--epochs 2]
                 [--shards 32] [--rows 16384] [--json bench.json] [--plot bench.png]
"""

from __future__ import annotations

import argparse
import sys

from ingest.core.errors import ConfigError
from ingest.tools.bench.config import BenchConfig, ShuffleSettings

__all__ = ["BenchConfig", "ShuffleSettings", "main"]

_ALL = "stream,raystream,raydata,torch,hf,mosaic,litdata"


def _seed(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def _parser() -> argparse.ArgumentParser:
    defaults = BenchConfig(contenders=("stream",))
    shuffle = ShuffleSettings()
    p = argparse.ArgumentParser(prog="ingest bench", description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--contenders", default=_ALL, help=f"comma-separated (default {_ALL})")
    p.add_argument("--shards", type=int, default=defaults.shards, help="shards per dataset")
    p.add_argument("--rows", type=int, default=defaults.rows, help="rows per shard")
    p.add_argument(
        "--row-group", type=int, default=defaults.row_group, help="rows per Parquet row group"
    )
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument(
        "--ranks", type=int, default=defaults.ranks, help="ranks of the distributed contenders"
    )
    p.add_argument(
        "--workers", type=int, default=defaults.workers, help="DataLoader workers per rank"
    )
    p.add_argument(
        "--epochs", type=int, default=defaults.epochs, help="epochs per contender; 2nd+ are warm"
    )
    p.add_argument(
        "--labels", type=int, default=defaults.labels, help="labels of the shuffle-quality data"
    )
    p.add_argument("--seed", type=_seed, default=shuffle.seed, help="shuffle seed or 'none'")
    p.add_argument(
        "--shuffle-window", type=int, default=shuffle.window, help="rows each shuffle mixes"
    )
    p.add_argument("--shuffle-lanes", type=int, default=None, help="ingest shuffle_lanes")
    p.add_argument(
        "--ray-cpus", type=int, default=defaults.ray_cpus, help="logical CPUs of the local Ray"
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=defaults.timeout_s,
        help="longest wait for one phase of a contender (an epoch, a resume); then it fails",
    )
    p.add_argument("--json", metavar="PATH", help="write every figure as JSON here")
    p.add_argument("--plot", metavar="PATH.png", help="write bar charts here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the bench from command-line arguments; print the table.

    Args:
        argv: Arguments after ``ingest bench``; None reads ``sys.argv``.

    Returns:
        0 when every contender ran or was skipped, 1 when one failed, 2 on bad arguments.
    """
    args = _parser().parse_args(argv)
    try:
        config = BenchConfig(
            contenders=tuple(n.strip() for n in args.contenders.split(",") if n.strip()),
            shards=args.shards,
            rows=args.rows,
            row_group=args.row_group,
            batch_size=args.batch_size,
            ranks=args.ranks,
            workers=args.workers,
            epochs=args.epochs,
            labels=args.labels,
            shuffle=ShuffleSettings(
                seed=args.seed, window=args.shuffle_window, lanes=args.shuffle_lanes
            ),
            ray_cpus=args.ray_cpus,
            timeout_s=args.timeout_s,
            progress=not args.no_progress,
        )
        from ingest.tools.bench.contenders import entry
        from ingest.tools.bench.run import check_requirements

        for name in config.contenders:
            entry(name)
        check_requirements()
    except ConfigError as e:
        print(f"ingest bench: error: {e}", file=sys.stderr)
        return 2
    from ingest.tools.bench.report import plot, table, write_json
    from ingest.tools.bench.run import document, run

    result = run(config)
    print(
        f"{config.total_rows:,} rows in {config.shards} Parquet shards on loopback S3, "
        f"batch {config.batch_size}, shuffle seed {config.shuffle.seed} "
        f"window {config.shuffle.window}, {config.epochs} epochs"
    )
    print(table(result.reports))
    print(f"wall time {result.wall_s:.0f} s")
    if args.json:
        write_json(args.json, document(result))
    if args.plot:
        plot(args.plot, result.reports, f"ingest bench, {config.total_rows:,} rows")
    return 1 if result.failed else 0
