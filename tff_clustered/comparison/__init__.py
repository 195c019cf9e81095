"""Comparison tables of several algorithms over seeds: their rows, writing and checking."""
