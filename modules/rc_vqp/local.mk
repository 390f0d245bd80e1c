# The UCT module libuct_rc_vqp.so, installed under $(libdir)/ucx.
rc_vqp_module_sources = \
	modules/rc_vqp/rc_vqp_abi.c \
	modules/rc_vqp/rc_vqp_md.c \
	modules/rc_vqp/rc_vqp_iface.c \
	modules/rc_vqp/rc_vqp_ep.c \
	modules/rc_vqp/rc_vqp_cm.c \
	modules/rc_vqp/rc_vqp_event.c \
	modules/rc_vqp/rc_vqp_memcheck.c

noinst_HEADERS += \
	modules/rc_vqp/rc_vqp_abi.h \
	modules/rc_vqp/rc_vqp_md.h \
	modules/rc_vqp/rc_vqp_iface.h \
	modules/rc_vqp/rc_vqp_cm.h \
	modules/rc_vqp/rc_vqp_memcheck.h \
	modules/rc_vqp/rc_vqp.h

rc_vqp_module_ldflags = -module -avoid-version -shared -Wl,--no-undefined
rc_vqp_module_libadd  = src/core/libvqp.la $(UCX_LIBS)

module_LTLIBRARIES += modules/rc_vqp/libuct_rc_vqp.la
modules_rc_vqp_libuct_rc_vqp_la_SOURCES = $(rc_vqp_module_sources)
modules_rc_vqp_libuct_rc_vqp_la_LDFLAGS = $(AM_LDFLAGS) $(rc_vqp_module_ldflags) -rpath $(moduledir)
modules_rc_vqp_libuct_rc_vqp_la_LIBADD  = $(rc_vqp_module_libadd)

# A copy with one recorded size deliberately skewed: the ABI guard must refuse
# to register it (test/unit/test_module.sh and test_abi_skew).
check_LTLIBRARIES += modules/rc_vqp/libuct_rc_vqp_skew.la
modules_rc_vqp_libuct_rc_vqp_skew_la_SOURCES  = $(rc_vqp_module_sources)
modules_rc_vqp_libuct_rc_vqp_skew_la_CPPFLAGS = $(AM_CPPFLAGS) -DUCT_RC_VQP_ABI_TEST_SKEW=8
modules_rc_vqp_libuct_rc_vqp_skew_la_LDFLAGS  = $(AM_LDFLAGS) $(rc_vqp_module_ldflags) -rpath /nowhere
modules_rc_vqp_libuct_rc_vqp_skew_la_LIBADD   = $(rc_vqp_module_libadd)
