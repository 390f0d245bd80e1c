# Device control (libvqp_dev): one interface (vqp_dev.h), a hardware
# implementation over libibverbs + mlx5dv and a software one over libvqp_sw.
noinst_LTLIBRARIES += src/dev/libvqp_dev.la
src_dev_libvqp_dev_la_SOURCES = \
	src/dev/dev.c \
	src/dev/dev_addr.c \
	src/dev/dev_hw.c \
	src/dev/dev_hw_caps.c \
	src/dev/dev_hw_event.c \
	src/dev/dev_sw.c
src_dev_libvqp_dev_la_LIBADD = \
	src/sw/libvqp_sw.la $(IBVERBS_LIBS) $(MLX5_LIBS) $(UCX_LIBS)

noinst_HEADERS += \
	src/dev/vqp_dev.h \
	src/dev/dev_int.h \
	src/dev/dev_hw_event.h

# Run by users with a ConnectX (builds and runs test/dev/vqp_dev_smoke).
EXTRA_DIST += contrib/hw-smoke.sh docs/devices.md
