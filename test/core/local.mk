# Multi-QP core tests over the software device.
if HAVE_CMOCKA
check_PROGRAMS += test/core/test_vqp
test_core_test_vqp_SOURCES = test/core/test_vqp.c
test_core_test_vqp_CFLAGS  = $(AM_CFLAGS) $(CMOCKA_CFLAGS)
test_core_test_vqp_LDADD   = src/core/libvqp.la $(CMOCKA_LIBS) $(UCX_LIBS)
TESTS += test/core/test_vqp
endif
