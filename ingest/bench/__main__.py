"""``python -m ingest.bench``: the same as ``ingest bench``."""

from ingest.bench import main

raise SystemExit(main())
