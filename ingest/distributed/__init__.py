"""The Ray service, a transport for the engine: the coordinator actor (the book over Ray),
the reader pool's actors and the rank iterators.

Import the pieces from their modules (or from ``ingest``); this package stays empty so that
Ray workers running read tasks do not import torch.
"""
