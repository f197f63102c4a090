"""Benchmarks: scripts whose figures go into the README (not timed tests)."""
