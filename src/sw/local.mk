# Software mlx5 device (libvqp_sw): filled in by the software device issue.
