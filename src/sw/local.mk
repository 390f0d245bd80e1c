# Software mlx5 device (libvqp_sw) and its inspection tool vqp_sw_stat.
noinst_LTLIBRARIES += src/sw/libvqp_sw.la
src_sw_libvqp_sw_la_SOURCES = \
	src/sw/sw_dev.c \
	src/sw/sw_peer.c \
	src/sw/sw_mr.c \
	src/sw/sw_queue.c \
	src/sw/sw_req.c \
	src/sw/sw_rdma.c \
	src/sw/sw_resp.c \
	src/sw/sw_comp.c \
	src/sw/sw_fault.c \
	src/sw/sw_ud.c \
	src/sw/sw_event.c \
	src/sw/sw_idle.c
src_sw_libvqp_sw_la_LIBADD = $(UCX_LIBS) -lrt -lpthread

noinst_HEADERS += src/sw/vqp_sw.h src/sw/sw_int.h

# Set here (first layer included); other layers may add with +=.
bin_PROGRAMS = src/sw/vqp_sw_stat
src_sw_vqp_sw_stat_SOURCES = src/sw/vqp_sw_stat.c
src_sw_vqp_sw_stat_LDADD   = src/sw/libvqp_sw.la
