# Tests of the software mlx5 device; they link libvqp_sw only (no higher
# layer) and build every WQE by hand.
if HAVE_CMOCKA
sw_test_cflags = $(AM_CFLAGS) $(CMOCKA_CFLAGS)
sw_test_ldadd  = src/sw/libvqp_sw.la $(CMOCKA_LIBS) $(UCX_LIBS)

noinst_HEADERS += test/sw/sw_test_util.h test/sw/sw_test_fx.h \
	test/sw/sw_test_lock.h

check_PROGRAMS += test/sw/test_sw_ops
test_sw_test_sw_ops_SOURCES = test/sw/test_sw_ops.c
test_sw_test_sw_ops_CFLAGS  = $(sw_test_cflags)
test_sw_test_sw_ops_LDADD   = $(sw_test_ldadd)

check_PROGRAMS += test/sw/test_sw_err
test_sw_test_sw_err_SOURCES = test/sw/test_sw_err.c
test_sw_test_sw_err_CFLAGS  = $(sw_test_cflags)
test_sw_test_sw_err_LDADD   = $(sw_test_ldadd)

check_PROGRAMS += test/sw/test_sw_proc
test_sw_test_sw_proc_SOURCES  = test/sw/test_sw_proc.c
test_sw_test_sw_proc_CFLAGS   = $(sw_test_cflags)
test_sw_test_sw_proc_CPPFLAGS = $(AM_CPPFLAGS) \
	-DVQP_SW_STAT='"$(abs_top_builddir)/src/sw/vqp_sw_stat"'
test_sw_test_sw_proc_LDADD    = $(sw_test_ldadd)

check_PROGRAMS += test/sw/test_sw_limits
test_sw_test_sw_limits_SOURCES = test/sw/test_sw_limits.c
test_sw_test_sw_limits_CFLAGS  = $(sw_test_cflags)
test_sw_test_sw_limits_LDADD   = $(sw_test_ldadd)

check_PROGRAMS += test/sw/test_sw_fault
test_sw_test_sw_fault_SOURCES = test/sw/test_sw_fault.c
test_sw_test_sw_fault_CFLAGS  = $(sw_test_cflags)
test_sw_test_sw_fault_LDADD   = $(sw_test_ldadd)

check_PROGRAMS += test/sw/test_sw_small
test_sw_test_sw_small_SOURCES = test/sw/test_sw_small.c
test_sw_test_sw_small_CFLAGS  = $(sw_test_cflags)
test_sw_test_sw_small_LDADD   = $(sw_test_ldadd)

check_PROGRAMS += test/sw/test_sw_ud
test_sw_test_sw_ud_SOURCES = test/sw/test_sw_ud.c
test_sw_test_sw_ud_CFLAGS  = $(sw_test_cflags)
test_sw_test_sw_ud_CPPFLAGS = $(AM_CPPFLAGS) \
	-DVQP_SW_STAT='"$(abs_top_builddir)/src/sw/vqp_sw_stat"'
test_sw_test_sw_ud_LDADD   = $(sw_test_ldadd)

check_PROGRAMS += test/sw/test_sw_event
test_sw_test_sw_event_SOURCES = test/sw/test_sw_event.c
test_sw_test_sw_event_CFLAGS  = $(sw_test_cflags)
test_sw_test_sw_event_LDADD   = $(sw_test_ldadd)

check_PROGRAMS += test/sw/test_sw_exec
test_sw_test_sw_exec_SOURCES = test/sw/test_sw_exec.c
test_sw_test_sw_exec_CFLAGS  = $(sw_test_cflags)
test_sw_test_sw_exec_LDADD   = $(sw_test_ldadd)

# Benchmark (built by 'make check', run by hand: test/sw/bench_sw).
check_PROGRAMS += test/sw/bench_sw
test_sw_bench_sw_SOURCES = test/sw/bench_sw.c
test_sw_bench_sw_CFLAGS  = $(sw_test_cflags) -Wno-unused-result
test_sw_bench_sw_LDADD   = $(sw_test_ldadd)

TESTS += test/sw/test_sw_ops test/sw/test_sw_err test/sw/test_sw_proc \
	test/sw/test_sw_fault test/sw/test_sw_limits test/sw/test_sw_small \
	test/sw/test_sw_ud test/sw/test_sw_event test/sw/test_sw_exec
endif
