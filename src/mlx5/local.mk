# mlx5 data path: header-only (static inline), nothing to compile here.
noinst_HEADERS += \
	src/mlx5/vqp_mlx5.h \
	src/mlx5/vqp_mlx5_tx.inl \
	src/mlx5/vqp_mlx5_rx.inl \
	src/mlx5/vqp_mlx5_cq.inl
