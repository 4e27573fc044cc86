"""The distributed stream on Ray: coordinator actor, Ray Data read/decode, rank iterators.

Import the pieces from their modules (or from ``ingest``); this package stays empty so that
Ray workers running read tasks do not import torch.
"""
