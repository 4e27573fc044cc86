"""The planner: listings with row counts (footers, the persistent index) handed to the book."""
