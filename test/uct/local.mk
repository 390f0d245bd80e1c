# UCT-level integration test (issue 6): two processes, the module loaded
# with dlopen as applications do. 'make check' runs the fast matrix;
# 'make check-uct-full' the full one (sizes up to 64 MiB, 1/4/64 QPs,
# both schemes, three fragment sizes).
check_PROGRAMS += test/uct/test_uct_pair
test_uct_test_uct_pair_SOURCES  = test/uct/test_uct_pair.c test/uct/uct_pair.c
test_uct_test_uct_pair_CPPFLAGS = $(AM_CPPFLAGS) \
	-DRC_VQP_MODULE='"$(abs_top_builddir)/modules/rc_vqp/.libs/libuct_rc_vqp.so"'
test_uct_test_uct_pair_LDADD    = $(UCX_LIBS) -ldl
noinst_HEADERS += test/uct/uct_pair.h test/uct/test_check.h
TESTS += test/uct/test_uct_pair

check-uct-full: test/uct/test_uct_pair $(module_LTLIBRARIES)
	./test/uct/test_uct_pair --full

.PHONY: check-uct-full

# One process: interfaces connected to each other and to themselves.
check_PROGRAMS += test/uct/test_uct_loopback
test_uct_test_uct_loopback_SOURCES  = test/uct/test_uct_loopback.c
test_uct_test_uct_loopback_CPPFLAGS = $(AM_CPPFLAGS) \
	-DRC_VQP_MODULE='"$(abs_top_builddir)/modules/rc_vqp/.libs/libuct_rc_vqp.so"'
test_uct_test_uct_loopback_LDADD    = $(UCX_LIBS) -ldl
TESTS += test/uct/test_uct_loopback

# UCX's own UCT test suite (gtest of the installed UCX version, built once
# into ucx-gtest/ of the build directory) with rc_vqp preloaded; see
# contrib/ucx-gtest.sh. Not part of 'make check'; contrib/test.sh runs it.
EXTRA_DIST += contrib/ucx-gtest.sh

check-ucx-gtest: $(module_LTLIBRARIES)
	$(top_srcdir)/contrib/ucx-gtest.sh --ucx-src '$(UCX_SRC)' \
	  --module $(abs_top_builddir)/modules/rc_vqp/.libs/libuct_rc_vqp.so \
	  --dest $(abs_top_builddir)/ucx-gtest

.PHONY: check-ucx-gtest

# Randomized: seeded trials of configurations and operation streams against
# a model of the UCT contract (docs/architecture.md).
check_PROGRAMS += test/uct/test_uct_random
test_uct_test_uct_random_SOURCES  = test/uct/test_uct_random.c
test_uct_test_uct_random_CPPFLAGS = $(AM_CPPFLAGS) \
	-DRC_VQP_MODULE='"$(abs_top_builddir)/modules/rc_vqp/.libs/libuct_rc_vqp.so"'
test_uct_test_uct_random_LDADD    = $(UCX_LIBS) -ldl
TESTS += test/uct/test_uct_random
