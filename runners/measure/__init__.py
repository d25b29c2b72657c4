"""Measurement: timing, efficiency, OOM thresholds, attention error, memory facts."""
