"""One bench run: start the loopback S3 server, the counting proxy and Ray once, write the
data, measure every contender in turn, stop everything, and return the report."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from tqdm.auto import tqdm

from ingest.core.errors import ConfigError
from ingest.tools.bench import data
from ingest.tools.bench.config import BenchConfig
from ingest.tools.bench.consumer import error_line
from ingest.tools.bench.contenders import Entry, entry
from ingest.tools.bench.measure import measure, phases
from ingest.tools.bench.proxy import CountingProxy
from ingest.tools.bench.quality import uniform_entropy
from ingest.tools.bench.report import FIGURES, ContenderReport, contender_report, ratios
from ingest.tools.loopback.s3 import LoopbackS3

_VERSIONS = (
    *("ingest", "ray", "torch", "pyarrow", "s3fs", "datasets", "torchdata", "moto"),
    *("mosaicml-streaming", "litdata"),
)


@dataclass(slots=True, kw_only=True)
class BenchResult:
    """A finished run: its settings, one report per contender, and how long it took."""

    config: BenchConfig
    reports: list[ContenderReport]
    uniform_entropy: float
    wall_s: float

    @property
    def failed(self) -> bool:
        """Whether any contender failed (skipped ones do not count)."""
        return any(r.status == "failed" for r in self.reports)


class _Bar:
    """A tqdm bar over every phase of every contender."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = tqdm(
            total=total, unit="phase", disable=not enabled, file=sys.stderr, dynamic_ncols=True
        )
        self.title = ""
        self._left = 0

    def contender(self, title: str, steps: int) -> None:
        self.title, self._left = title, steps

    def begin(self, phase: str) -> None:
        self._bar.set_description(f"{self.title}: {phase}")

    def end(self) -> None:
        self._left -= 1
        self._bar.update(1)

    def skip_rest(self) -> None:
        self._bar.update(max(self._left, 0))
        self._left = 0

    def close(self) -> None:
        self._bar.close()


@contextlib.contextmanager
def _local_ray(config: BenchConfig) -> Iterator[None]:
    """A local Ray for the run, or the one already started (left running)."""
    import ray
    import ray.data

    with warnings.catch_warnings():  # Ray Data's own deprecated settings, on creation
        warnings.simplefilter("ignore", DeprecationWarning)
        context = ray.data.DataContext.get_current()
    bars = context.enable_progress_bars
    context.enable_progress_bars = False  # the bench's own bar reports progress
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=config.ray_cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    try:
        yield
    finally:
        context.enable_progress_bars = bars
        if started:
            ray.shutdown()


def _measure_one(
    item: Entry,
    config: BenchConfig,
    proxy: CountingProxy,
    datasets: tuple[data.Dataset, data.Dataset],
    uniform: float,
    bar: _Bar,
) -> ContenderReport:
    bar.contender(item.title, phases(config.epochs))
    missing = item.missing()
    if missing:
        bar.skip_rest()
        hint = item.install or f"pip install {' '.join(missing)}"
        return ContenderReport(
            name=item.name,
            title=item.title,
            status="skipped",
            reason=f"{', '.join(missing)} not installed: {hint}",
        )
    try:
        measured = measure(item, config, proxy, datasets, bar)
        return contender_report(item.name, item.title, measured, uniform)
    except Exception as e:
        return ContenderReport(
            name=item.name, title=item.title, status="failed", reason=error_line(e)
        )
    finally:
        bar.skip_rest()


def check_requirements() -> None:
    """Raise if what the harness itself needs (the loopback S3 server) is missing.

    Raises:
        ConfigError: Naming the packages and the pip command.
    """
    missing = [m for m in ("moto", "boto3", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f'ingest bench needs {", ".join(missing)}: pip install "ingest[bench]" '
            '(or pip install "moto[server]" boto3 matplotlib)'
        )


def run(config: BenchConfig) -> BenchResult:
    """Measure every contender of ``config`` on the same generated data.

    Args:
        config: What to run.

    Returns:
        The result; a contender that raised is reported as failed, one whose packages are
        missing as skipped.

    Raises:
        ConfigError: If a contender name is unknown or the harness's packages are missing.
    """
    check_requirements()
    start = time.perf_counter()
    entries = [entry(name) for name in config.contenders]
    uniform = uniform_entropy(
        [shard % config.labels for shard in range(config.shards)],
        config.rows,
        config.batch_size,
    )
    reports: list[ContenderReport] = []
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(LoopbackS3())
        proxy = stack.enter_context(CountingProxy(s3.endpoint))
        bar = _Bar(len(entries) * phases(config.epochs), config.progress)
        stack.callback(bar.close)
        bar.contender("setup", 0)
        bar.begin("writing data")
        datasets = data.write(s3, proxy.endpoint, config)
        bar.begin("starting Ray")
        stack.enter_context(_local_ray(config))
        for item in entries:
            reports.append(_measure_one(item, config, proxy, datasets, uniform, bar))
    return BenchResult(
        config=config,
        reports=reports,
        uniform_entropy=uniform,
        wall_s=time.perf_counter() - start,
    )


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def document(result: BenchResult) -> dict[str, Any]:
    """The JSON document of ``result``: settings, environment, figures and their meaning."""
    return {
        "config": asdict(result.config),
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "versions": {p: _version(p) for p in _VERSIONS},
        },
        "wall_s": result.wall_s,
        "rows_per_dataset": result.config.total_rows,
        "uniform_entropy": result.uniform_entropy,
        "figures": {f.key: f.doc for f in FIGURES},
        "contenders": [asdict(r) for r in result.reports],
        "ratios": ratios(result.reports),
    }
