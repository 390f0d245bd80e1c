# Stock ucx_perftest over rc_vqp (software device), two processes per run.
dist_check_SCRIPTS += test/perftest/test_perftest.sh
TESTS += test/perftest/test_perftest.sh
EXTRA_DIST += contrib/perftest-pair.sh

check-perftest-full: all
	$(AM_TESTS_ENVIRONMENT) $(top_srcdir)/test/perftest/test_perftest.sh --full

.PHONY: check-perftest-full
