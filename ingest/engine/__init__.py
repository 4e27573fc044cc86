"""The engine: the feed (read, shuffle window, stages, batches with provenance), prefetch,
conversion to torch and the single-process :class:`ingest.Stream`. Knows no Ray."""
