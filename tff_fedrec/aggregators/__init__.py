"""Generic aggregation factories (`tff.aggregators` style: one `create`
each); a paper's own lives in its package."""
