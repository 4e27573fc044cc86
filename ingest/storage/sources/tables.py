"""Table formats whose data files a listing cannot tell apart from those of earlier
versions: Apache Iceberg and Apache Hudi.

Their directories keep the files of earlier snapshots (commits) until they are expired or
cleaned, and only the table's metadata says which are the table's now. A listing that holds
one's metadata is refused with the fix (:func:`refuse_other_tables`); a plain listing would
read rows the table has since deleted or replaced (and Iceberg's ``metadata/*.json`` as JSON
shards). Delta Lake tables are read (:mod:`ingest.storage.sources.delta`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ingest.core.errors import SourceError

_ICEBERG = re.compile(r"^(.*)/metadata/[^/]+\.metadata\.json$")
"""An Iceberg table's metadata file (``v2.metadata.json``, ``00002-<uuid>.metadata.json``)."""
_HUDI = "/.hoodie/"


def refuse_other_tables(names: Iterable[str], unstrip: Callable[[str], str] | None = None) -> None:
    """Raise if ``names`` (a listing's paths) hold an Iceberg or Hudi table's metadata.

    Args:
        names: The paths the listing found (every file, before any is left out).
        unstrip: The filesystem's ``unstrip_protocol``, for the table's URL in the error.

    Raises:
        SourceError: Naming the table's root, the format and the fix.
    """
    for name in names:
        iceberg = _ICEBERG.match(name) if name.endswith(".metadata.json") else None
        at = name.find(_HUDI)
        if iceberg is None and at < 0:
            continue
        root = iceberg[1] if iceberg else name[:at]
        url = unstrip(root) if unstrip is not None else root
        if iceberg:
            raise SourceError(
                str(url),
                "an Apache Iceberg table (its metadata/*.metadata.json): its data directory "
                "keeps the files of earlier snapshots until they are expired, and only its "
                "metadata says which hold its rows now",
                "pass the files of its current snapshot as the stream's URLs (pyiceberg: "
                "[task.file.file_path for task in table.scan().plan_files()]; a partitioned "
                "table's partition columns may not be in its files: add them in a stage)",
            )
        raise SourceError(
            str(url),
            "an Apache Hudi table (its .hoodie directory): its directories keep the file "
            "versions of earlier commits until they are cleaned, and only its timeline says "
            "which hold its rows now",
            "pass the files of its latest file slices as the stream's URLs (read them with "
            "Hudi's reader, or a snapshot query in Spark, and write them out)",
        )


__all__ = ["refuse_other_tables"]
