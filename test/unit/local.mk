# Unit tests (cmocka), run by 'make check'.
if HAVE_CMOCKA
unit_cflags  = $(AM_CFLAGS) $(CMOCKA_CFLAGS)
unit_ldadd   = $(CMOCKA_LIBS) $(UCX_LIBS)

# ABI guard logic, linked directly.
check_PROGRAMS += test/unit/test_abi
test_unit_test_abi_SOURCES = test/unit/test_abi.c modules/rc_vqp/rc_vqp_abi.c
test_unit_test_abi_CFLAGS  = $(unit_cflags)
test_unit_test_abi_LDADD   = $(unit_ldadd)

# The built module loaded into a UCX process the way users load it.
check_PROGRAMS += test/unit/test_module
test_unit_test_module_SOURCES  = test/unit/test_module.c
test_unit_test_module_CFLAGS   = $(unit_cflags)
test_unit_test_module_CPPFLAGS = $(AM_CPPFLAGS) \
	-DRC_VQP_MODULE='"$(abs_top_builddir)/modules/rc_vqp/.libs/libuct_rc_vqp.so"' \
	-DRC_VQP_EXPECT_REGISTERED=1
test_unit_test_module_LDADD    = $(unit_ldadd) -ldl

# The same with the deliberately mismatched module: it must not register.
check_PROGRAMS += test/unit/test_module_skew
test_unit_test_module_skew_SOURCES  = test/unit/test_module.c
test_unit_test_module_skew_CFLAGS   = $(unit_cflags)
test_unit_test_module_skew_CPPFLAGS = $(AM_CPPFLAGS) \
	-DRC_VQP_MODULE='"$(abs_top_builddir)/modules/rc_vqp/.libs/libuct_rc_vqp_skew.so"' \
	-DRC_VQP_EXPECT_REGISTERED=0
test_unit_test_module_skew_LDADD    = $(unit_ldadd) -ldl

TESTS += test/unit/test_abi test/unit/test_module test/unit/test_module_skew
endif

# Stock /usr/bin/ucx_info with the module preloaded.
dist_check_SCRIPTS += test/unit/test_ucx_info.sh
TESTS += test/unit/test_ucx_info.sh
