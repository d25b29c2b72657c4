"""Grids, shards and experiment sweeps."""
