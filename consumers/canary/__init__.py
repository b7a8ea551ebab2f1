"""Canaries on live topics: the partitions a candidate borrows from the active group."""
