"""``python -m ingest.tools.bench``: the same as ``ingest bench``."""

from ingest.tools.bench import main

raise SystemExit(main())
