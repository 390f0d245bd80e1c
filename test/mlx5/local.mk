# mlx5 data path tests (cmocka, no device) and its microbenchmark.
noinst_HEADERS += test/mlx5/mlx5_fake.h

if HAVE_CMOCKA
mlx5_test_cflags = $(AM_CFLAGS) $(CMOCKA_CFLAGS)
mlx5_test_ldadd  = $(CMOCKA_LIBS) $(UCX_LIBS)

check_PROGRAMS += test/mlx5/test_mlx5_tx test/mlx5/test_mlx5_rx \
	test/mlx5/test_mlx5_cq
test_mlx5_test_mlx5_tx_SOURCES = test/mlx5/test_mlx5_tx.c
test_mlx5_test_mlx5_tx_CFLAGS  = $(mlx5_test_cflags)
test_mlx5_test_mlx5_tx_LDADD   = $(mlx5_test_ldadd)
test_mlx5_test_mlx5_rx_SOURCES = test/mlx5/test_mlx5_rx.c
test_mlx5_test_mlx5_rx_CFLAGS  = $(mlx5_test_cflags)
test_mlx5_test_mlx5_rx_LDADD   = $(mlx5_test_ldadd)
test_mlx5_test_mlx5_cq_SOURCES = test/mlx5/test_mlx5_cq.c
test_mlx5_test_mlx5_cq_CFLAGS  = $(mlx5_test_cflags)
test_mlx5_test_mlx5_cq_LDADD   = $(mlx5_test_ldadd)
TESTS += test/mlx5/test_mlx5_tx test/mlx5/test_mlx5_rx test/mlx5/test_mlx5_cq
endif

# Bare post+poll cost per WQE: built by 'make check', run by 'make bench-mlx5'.
check_PROGRAMS += test/mlx5/bench_post_poll
test_mlx5_bench_post_poll_SOURCES = test/mlx5/bench_post_poll.c
test_mlx5_bench_post_poll_LDADD   = $(UCX_LIBS)

bench-mlx5: test/mlx5/bench_post_poll
	$(builddir)/test/mlx5/bench_post_poll

.PHONY: bench-mlx5

# The data path driving the software device (one process and fork()ed pairs).
if HAVE_CMOCKA
check_PROGRAMS += test/mlx5/test_mlx5_sw
test_mlx5_test_mlx5_sw_SOURCES = test/mlx5/test_mlx5_sw.c
test_mlx5_test_mlx5_sw_CFLAGS  = $(mlx5_test_cflags)
test_mlx5_test_mlx5_sw_LDADD   = src/sw/libvqp_sw.la $(mlx5_test_ldadd)
TESTS += test/mlx5/test_mlx5_sw

# UD sends: WQE layout (no device) and end to end on the software device.
check_PROGRAMS += test/mlx5/test_mlx5_ud
test_mlx5_test_mlx5_ud_SOURCES = test/mlx5/test_mlx5_ud.c
test_mlx5_test_mlx5_ud_CFLAGS  = $(mlx5_test_cflags)
test_mlx5_test_mlx5_ud_LDADD   = src/sw/libvqp_sw.la $(mlx5_test_ldadd)
TESTS += test/mlx5/test_mlx5_ud
endif
