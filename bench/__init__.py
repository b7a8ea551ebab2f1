"""Benchmarks: timed runs that print and save figures; never run as tests."""
