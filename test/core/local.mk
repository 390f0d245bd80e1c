# Multi-QP core tests over the software device.
if HAVE_CMOCKA
check_PROGRAMS += test/core/test_vqp
test_core_test_vqp_SOURCES = test/core/test_vqp.c
test_core_test_vqp_CFLAGS  = $(AM_CFLAGS) $(CMOCKA_CFLAGS)
test_core_test_vqp_LDADD   = src/core/libvqp.la $(CMOCKA_LIBS) $(UCX_LIBS)
TESTS += test/core/test_vqp
endif

# The same, randomized: seeded trials of random configurations and
# operation streams checked against a model (VQP_RANDOM_SEED / _TRIALS).
if HAVE_CMOCKA
check_PROGRAMS += test/core/test_vqp_random
test_core_test_vqp_random_SOURCES = test/core/test_vqp_random.c
test_core_test_vqp_random_CFLAGS  = $(AM_CFLAGS) $(CMOCKA_CFLAGS)
test_core_test_vqp_random_LDADD   = src/core/libvqp.la $(CMOCKA_LIBS) $(UCX_LIBS)
TESTS += test/core/test_vqp_random
endif
