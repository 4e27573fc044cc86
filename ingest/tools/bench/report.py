"""The figures of a bench run: per-contender results, the table, the JSON and the plot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ingest.tools.bench.measure import EpochFigures, Measured

Status = Literal["ok", "skipped", "failed"]
Value = float | int | bool | None


@dataclass(frozen=True, slots=True)
class Figure:
    """A column of the table: JSON key, header, format and meaning."""

    key: str
    header: str
    fmt: str
    doc: str


FIGURES: tuple[Figure, ...] = (
    Figure("first_batch_s", "first s", ".2f", "seconds from building to a batch on every rank"),
    Figure(
        "convert_s",
        "convert s",
        ".1f",
        "seconds to write the main dataset's rows in the contender's own format with its own "
        "writer, before its first epoch (0: reads the Parquet shards as they are)",
    ),
    Figure(
        "convert_cpu_s",
        "convert CPU s",
        ".1f",
        "CPU s of that conversion: the bench's own process, the workers it started and "
        "reaped, and the S3 server",
    ),
    Figure("epoch1_rows_per_s", "ep1 rows/s", ",.0f", "epoch 1 rows / wall (start-up included)"),
    Figure("epoch1_mb_per_s", "ep1 MB/s", ".1f", "epoch 1 tensor MB delivered / wall"),
    Figure("warm_rows_per_s", "warm rows/s", ",.0f", "epochs 2.. rows / wall"),
    Figure("warm_mb_per_s", "warm MB/s", ".1f", "epochs 2.. tensor MB delivered / wall"),
    Figure("epoch1_requests", "req ep1", ",d", "S3 requests in epoch 1 (listing included)"),
    Figure("epoch1_mb_read", "MB read ep1", ".1f", "response MB from S3 in epoch 1"),
    Figure("rank_cpu_s_per_mrows", "rank CPU s/Mrow", ".2f", "rank-process CPU s per million rows"),
    Figure(
        "loader_cpu_s_per_mrows",
        "loader CPU s/Mrow",
        ".2f",
        "rank-process CPU s per million rows less the consumer's own (the loader's cost "
        "inside the training process)",
    ),
    Figure(
        "run_cpu_s_per_mrows",
        "all CPU s/Mrow",
        ".2f",
        "CPU s of every process of the run per million rows (Ray, workers, S3 server, proxy)",
    ),
    Figure(
        "warm_run_cpu_s_per_mrows",
        "warm all CPU s/Mrow",
        ".2f",
        "all CPU s/Mrow over epochs 2.. (the processes' start-up left out)",
    ),
    Figure(
        "rank_peak_rss_mb",
        "rank RSS MB",
        ",.0f",
        "largest peak resident MB of a rank process (its worker processes not included)",
    ),
    Figure(
        "resume_first_batch_s",
        "resume s",
        ".2f",
        "seconds from building a pipeline from the 45% state to a batch on every rank",
    ),
    Figure(
        "resume_exactly_once",
        "resume once",
        "",
        "the rows before the 45% checkpoint and the resumed pipeline's rows to the end of the "
        "epoch hold every id exactly once",
    ),
    Figure(
        "shuffle_quality",
        "shuffle q",
        ".2f",
        "mean per-batch label entropy / a uniform shuffle's, on label-sorted shards",
    ),
    Figure("rows_delivered", "rows ep1", ",d", "rows delivered in epoch 1, all ranks"),
    Figure("exactly_once", "once", "", "every id exactly once in every epoch (main and labeled)"),
)
"""Every figure a contender reports, in table order."""


@dataclass(slots=True, kw_only=True)
class ContenderReport:
    """One contender's line of the report.

    Attributes:
        name: Registry name.
        title: Name in the table.
        status: ``ok``, ``skipped`` (not installed) or ``failed``.
        reason: Why it was skipped or failed (with the install hint when skipped).
        ranks: Rank processes that consumed its batches.
        figures: Every key of :data:`FIGURES` (when ok); None where not measurable.
        notes: Why a figure is None, by key.
        epochs: Per-epoch figures of the main dataset.
    """

    name: str
    title: str
    status: Status
    reason: str | None = None
    ranks: int = 0
    figures: dict[str, Value] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    epochs: list[dict[str, Any]] = field(default_factory=list)


def _rate(epochs: list[EpochFigures]) -> tuple[float, float]:
    wall = sum(e.wall_s for e in epochs)
    return sum(e.rows for e in epochs) / wall, sum(e.tensor_bytes for e in epochs) / wall / 1e6


def contender_report(name: str, title: str, measured: Measured, uniform: float) -> ContenderReport:
    """Figures from what was measured for one contender.

    Args:
        name: Registry name.
        title: Name in the table.
        measured: What :func:`ingest.tools.bench.measure.measure` returned.
        uniform: Mean batch entropy of a uniform shuffle of the labeled data.

    Returns:
        The report line, every figure present.
    """
    first, warm = measured.epochs[0], measured.epochs[1:]
    rows = sum(e.rows for e in measured.epochs)
    notes: dict[str, str] = {}
    warm_rows: float | None = None
    warm_mb: float | None = None
    if warm:
        warm_rows, warm_mb = _rate(warm)
    else:
        for key in ("warm_rows_per_s", "warm_mb_per_s", "warm_run_cpu_s_per_mrows"):
            notes[key] = "one epoch run (--epochs 1)"
    if measured.read_note is not None:
        notes["epoch1_requests"] = measured.read_note
    resume_once: bool | None = None
    if measured.resume_first_batch_s is None:
        notes["resume_first_batch_s"] = measured.resume_note or "not measured"
        notes["resume_exactly_once"] = notes["resume_first_batch_s"]
    else:
        resume_once = measured.resume_duplicates == 0 and measured.resume_missing == 0
    if resume_once is False:
        notes["resume_exactly_once"] = (
            f"before the checkpoint and after the resume: {measured.resume_duplicates:,} "
            f"duplicated, {measured.resume_missing:,} missing ids"
            + (f"; {measured.resume_note}" if measured.resume_note else "")
        )
    once = all(e.duplicates == 0 and e.missing == 0 for e in measured.epochs) and (
        measured.quality_duplicates == 0 and measured.quality_missing == 0
    )
    quality = None if measured.mean_entropy is None else measured.mean_entropy / uniform
    figures: dict[str, Value] = {
        "first_batch_s": measured.first_batch_s,
        "convert_s": measured.convert_s,
        "convert_cpu_s": measured.convert_cpu_s,
        "epoch1_rows_per_s": first.rows_per_s,
        "epoch1_mb_per_s": first.mb_per_s,
        "warm_rows_per_s": warm_rows,
        "warm_mb_per_s": warm_mb,
        "epoch1_requests": first.requests,
        "epoch1_mb_read": first.bytes_read / 1e6,
        "rank_cpu_s_per_mrows": sum(e.rank_cpu_s for e in measured.epochs) / rows * 1e6,
        "loader_cpu_s_per_mrows": sum(e.rank_cpu_s - e.consumer_cpu_s for e in measured.epochs)
        / rows
        * 1e6,
        "run_cpu_s_per_mrows": sum(e.run_cpu_s for e in measured.epochs) / rows * 1e6,
        "warm_run_cpu_s_per_mrows": (
            sum(e.run_cpu_s for e in warm) / sum(e.rows for e in warm) * 1e6 if warm else None
        ),
        "rank_peak_rss_mb": measured.rank_peak_rss_bytes / 1e6,
        "resume_first_batch_s": measured.resume_first_batch_s,
        "resume_exactly_once": resume_once,
        "shuffle_quality": quality,
        "rows_delivered": first.rows,
        "exactly_once": once,
    }
    return ContenderReport(
        name=name,
        title=title,
        status="ok",
        ranks=measured.ranks,
        figures=figures,
        notes=notes,
        epochs=[{**asdict(e), "rows_per_s": e.rows_per_s} for e in measured.epochs],
    )


def _figure(reports: list[ContenderReport], name: str, key: str) -> float | None:
    for r in reports:
        if r.name == name and r.status == "ok":
            value = r.figures.get(key)
            return float(value) if isinstance(value, (int, float)) else None
    return None


def _epoch1_wall(reports: list[ContenderReport], name: str) -> float | None:
    for r in reports:
        if r.name == name and r.status == "ok":
            return float(r.epochs[0]["wall_s"])
    return None


def ratios(reports: list[ContenderReport]) -> dict[str, float]:
    """The ratios issues 7 and 18 set targets for, where both sides were measured in this
    run."""
    pairs = {
        "raystream/torch warm rows/s": (
            _figure(reports, "raystream", "warm_rows_per_s"),
            _figure(reports, "torch", "warm_rows_per_s"),
        ),
        "raystream/stream all CPU per row": (
            _figure(reports, "raystream", "run_cpu_s_per_mrows"),
            _figure(reports, "stream", "run_cpu_s_per_mrows"),
        ),
        "raystream/stream warm all CPU per row": (
            _figure(reports, "raystream", "warm_run_cpu_s_per_mrows"),
            _figure(reports, "stream", "warm_run_cpu_s_per_mrows"),
        ),
        "raystream/stream warm rows/s": (
            _figure(reports, "raystream", "warm_rows_per_s"),
            _figure(reports, "stream", "warm_rows_per_s"),
        ),
        "raystream/raydata warm rows/s": (
            _figure(reports, "raystream", "warm_rows_per_s"),
            _figure(reports, "raydata", "warm_rows_per_s"),
        ),
        "raystream/raydata epoch 1 wall": (
            _epoch1_wall(reports, "raystream"),
            _epoch1_wall(reports, "raydata"),
        ),
        "raystream/raydata rank CPU per row": (
            _figure(reports, "raystream", "rank_cpu_s_per_mrows"),
            _figure(reports, "raydata", "rank_cpu_s_per_mrows"),
        ),
        "raystream/raydata loader CPU per row": (
            _figure(reports, "raystream", "loader_cpu_s_per_mrows"),
            _figure(reports, "raydata", "loader_cpu_s_per_mrows"),
        ),
    }
    for r in reports:
        pairs[f"{r.name} resume/fresh first batch"] = (
            _figure(reports, r.name, "resume_first_batch_s"),
            _figure(reports, r.name, "first_batch_s"),
        )
    return {k: a / b for k, (a, b) in pairs.items() if a is not None and b}


def _cell(figure: Figure, value: Value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, figure.fmt)


def _cell_of(key: str, value: Value) -> str:
    return _cell(next(f for f in FIGURES if f.key == key), value)


def table(reports: list[ContenderReport]) -> str:
    """The figures as a plain-text table, then the reasons behind every n/a."""
    headers = ["contender", "ranks", *(f.header for f in FIGURES)]
    rows = [
        [r.title, str(r.ranks), *(_cell(f, r.figures.get(f.key)) for f in FIGURES)]
        for r in reports
        if r.status == "ok"
    ]
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [headers, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in reports:
        if r.status != "ok":
            lines.append(f"{r.title}: {r.status}: {r.reason}")
        by_note: dict[str, list[str]] = {}  # figures with the same reason share a line
        for key, note in r.notes.items():
            header = next(f.header for f in FIGURES if f.key == key)
            shown = "n/a" if r.figures.get(key) is None else _cell_of(key, r.figures[key])
            by_note.setdefault(note, []).append(f"{header} {shown}")
        lines.extend(f"{r.title}: {', '.join(cells)}: {note}" for note, cells in by_note.items())
    lines.extend(f"ratio {k}: {v:.2f}x" for k, v in ratios(reports).items())
    return "\n".join(lines)


def write_json(path: str, document: dict[str, Any]) -> None:
    """Write ``document`` (from :func:`ingest.tools.bench.run.document`) to ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=2) + "\n")


_PANELS = (
    ("warm_rows_per_s", "warm epoch rows/s (higher is better)"),
    ("first_batch_s", "first batch s (lower is better)"),
    ("loader_cpu_s_per_mrows", "loader CPU s per M rows in the rank (lower is better)"),
    ("shuffle_quality", "shuffle quality, 1 = uniform (higher is better)"),
)


def plot(path: str, reports: list[ContenderReport], title: str) -> None:
    """Bar charts of the main figures, one panel each, saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in reports if r.status == "ok"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), constrained_layout=True)
    for ax, (key, label) in zip(axes.flat, _PANELS, strict=True):
        shown = [(r.title, r.figures[key]) for r in ok if isinstance(r.figures[key], float)]
        ax.barh([t for t, _ in shown], [float(v) for _, v in shown if v is not None])
        ax.set_title(label, fontsize=10)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle(title, fontsize=10)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=120)
    plt.close(fig)
