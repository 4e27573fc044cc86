"""The pure core: plans, interval sets, shares, the ledger, the state schema, the book and
the errors. No I/O, no Ray, no torch, nothing from the layers above."""
