# Multi-QP core (libvqp): virtual QP / CQ over the mlx5 data path, with
# queues created through device control.
noinst_LTLIBRARIES += src/core/libvqp.la
src_core_libvqp_la_SOURCES = \
	src/core/vqp_cq.c \
	src/core/vqp_op.c \
	src/core/vqp_recv.c \
	src/core/vqp_srq.c \
	src/core/vqp_qp.c
src_core_libvqp_la_LIBADD = src/dev/libvqp_dev.la $(UCX_LIBS)

noinst_HEADERS += \
	src/core/vqp.h \
	src/core/vqp_int.h
