"""The bench's cases, one module per group. This package imports nothing, so that a comparison's side
process loads only ``hot_paths``."""
