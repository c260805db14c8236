"""Aggregation factories (`tff.aggregators` style: one `create` each)."""
