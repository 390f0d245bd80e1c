# Stock ucx_perftest UCP tests over rc_vqp (make check-ucp, check-ucp-full).
# The CI subset runs in make check. UCP_TLS=posix,self runs the same
# harness over UCX's own shared memory.
dist_check_SCRIPTS += test/ucp/test_ucp_perftest.sh
TESTS += test/ucp/test_ucp_perftest.sh
# UCP's client/server API (UCX's example program, built by the test).
dist_check_SCRIPTS += test/ucp/test_ucp_client_server.sh
TESTS += test/ucp/test_ucp_client_server.sh
EXTRA_DIST += contrib/ucp-pair.sh
# UCP with error handling: rendezvous over rc_vqp, and the invalidation of
# an outstanding rendezvous send's buffer when its receiver dies.
check_PROGRAMS += test/ucp/test_ucp_err_rndv
test_ucp_test_ucp_err_rndv_SOURCES  = test/ucp/test_ucp_err_rndv.c
test_ucp_test_ucp_err_rndv_CPPFLAGS = $(AM_CPPFLAGS) \
	-DRC_VQP_MODULE='"$(abs_top_builddir)/modules/rc_vqp/.libs/libuct_rc_vqp.so"'
test_ucp_test_ucp_err_rndv_LDADD    = $(UCX_LIBS) -lucp -ldl
TESTS += test/ucp/test_ucp_err_rndv

check-ucp: all
	$(AM_TESTS_ENVIRONMENT) $(top_srcdir)/test/ucp/test_ucp_perftest.sh && \
	$(top_srcdir)/test/ucp/test_ucp_client_server.sh

check-ucp-full: all
	$(AM_TESTS_ENVIRONMENT) $(top_srcdir)/test/ucp/test_ucp_perftest.sh --full

.PHONY: check-ucp check-ucp-full
