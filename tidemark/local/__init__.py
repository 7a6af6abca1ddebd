"""A whole Tidemark on one machine: what ``tidemark up`` starts, and how it watches it."""
