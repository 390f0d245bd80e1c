# mlx5 data path (header-only fast path): filled in by the data path issue.
