"""Asynchronous training: generation overlapping the update, within a bounded staleness."""
