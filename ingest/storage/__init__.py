"""Storage: fsspec sources (listing, retries, credentials), the node-local shard cache, the
Hugging Face Hub and follow mode. Never parses a shard's contents."""
