# Device-control tests (cmocka) and the hardware smoke program.
dev_test_ldadd = src/dev/libvqp_dev.la $(UCX_LIBS) $(IBVERBS_LIBS) $(MLX5_LIBS)

noinst_HEADERS += test/dev/dev_wqe.h test/dev/test_dev_log.h

# Run by contrib/hw-smoke.sh on a machine with a ConnectX; here only through
# test_dev_smoke.sh (no device: clean exit; --sw: the same steps in software).
check_PROGRAMS += test/dev/vqp_dev_smoke
test_dev_vqp_dev_smoke_SOURCES = test/dev/vqp_dev_smoke.c
test_dev_vqp_dev_smoke_LDADD   = $(dev_test_ldadd)

dist_check_SCRIPTS += test/dev/test_dev_smoke.sh
TESTS += test/dev/test_dev_smoke.sh

if HAVE_CMOCKA
dev_test_cflags = $(AM_CFLAGS) $(CMOCKA_CFLAGS)
dev_test_cmocka = $(CMOCKA_LIBS) $(dev_test_ldadd)

check_PROGRAMS += test/dev/test_dev_addr test/dev/test_dev_hw test/dev/test_dev_sw
# QUERY_HCA_CAP parsers (dev_hw_caps.c) on hand-built command outputs.
check_PROGRAMS += test/dev/test_dev_caps
test_dev_test_dev_caps_SOURCES = test/dev/test_dev_caps.c
test_dev_test_dev_caps_CFLAGS  = $(dev_test_cflags)
test_dev_test_dev_caps_LDADD   = $(dev_test_cmocka)
test_dev_test_dev_addr_SOURCES = test/dev/test_dev_addr.c
test_dev_test_dev_addr_CFLAGS  = $(dev_test_cflags)
test_dev_test_dev_addr_LDADD   = $(dev_test_cmocka)
test_dev_test_dev_hw_SOURCES   = test/dev/test_dev_hw.c
test_dev_test_dev_hw_CFLAGS    = $(dev_test_cflags)
test_dev_test_dev_hw_LDADD     = $(dev_test_cmocka)
test_dev_test_dev_sw_SOURCES   = test/dev/test_dev_sw.c
test_dev_test_dev_sw_CFLAGS    = $(dev_test_cflags)
test_dev_test_dev_sw_LDADD     = $(dev_test_cmocka)

# dev_hw.c against a scripted fake of libibverbs/mlx5dv (ld --wrap).
dev_hw_mock_wrap = \
	-Wl,--wrap=ibv_get_device_list,--wrap=ibv_free_device_list \
	-Wl,--wrap=ibv_get_device_name,--wrap=mlx5dv_is_supported \
	-Wl,--wrap=ibv_open_device,--wrap=ibv_close_device \
	-Wl,--wrap=ibv_query_device,--wrap=_ibv_query_gid_ex,--wrap=ibv_query_gid \
	-Wl,--wrap=ibv_alloc_pd,--wrap=ibv_dealloc_pd \
	-Wl,--wrap=ibv_reg_mr,--wrap=ibv_reg_mr_iova2,--wrap=ibv_dereg_mr \
	-Wl,--wrap=ibv_create_cq,--wrap=ibv_destroy_cq,--wrap=mlx5dv_create_cq \
	-Wl,--wrap=mlx5dv_init_obj,--wrap=ibv_create_srq,--wrap=ibv_destroy_srq \
	-Wl,--wrap=ibv_create_qp,--wrap=ibv_destroy_qp,--wrap=ibv_modify_qp \
	-Wl,--wrap=mlx5dv_modify_qp_udp_sport \
	-Wl,--wrap=ibv_create_ah,--wrap=ibv_destroy_ah \
	-Wl,--wrap=mlx5dv_open_device,--wrap=mlx5dv_devx_general_cmd \
	-Wl,--wrap=ibv_create_comp_channel,--wrap=ibv_destroy_comp_channel
check_PROGRAMS += test/dev/test_dev_hw_mock
test_dev_test_dev_hw_mock_SOURCES = test/dev/test_dev_hw_mock.c \
	test/dev/dev_hw_mock_channel.c
test_dev_test_dev_hw_mock_CFLAGS  = $(dev_test_cflags)
test_dev_test_dev_hw_mock_LDFLAGS = $(AM_LDFLAGS) $(dev_hw_mock_wrap)
test_dev_test_dev_hw_mock_LDADD   = $(dev_test_cmocka)

# Completion events of dev_hw_event.c / dev.c under a fake completion
# channel.
check_PROGRAMS += test/dev/test_dev_hw_event
test_dev_test_dev_hw_event_SOURCES = test/dev/test_dev_hw_event.c
test_dev_test_dev_hw_event_CFLAGS  = $(dev_test_cflags)
test_dev_test_dev_hw_event_LDFLAGS = $(AM_LDFLAGS) \
	-Wl,--wrap=ibv_create_comp_channel,--wrap=ibv_destroy_comp_channel \
	-Wl,--wrap=ibv_get_cq_event,--wrap=ibv_ack_cq_events
test_dev_test_dev_hw_event_LDADD   = $(dev_test_cmocka)

TESTS += test/dev/test_dev_hw_event
TESTS += test/dev/test_dev_addr test/dev/test_dev_hw test/dev/test_dev_sw \
	test/dev/test_dev_hw_mock test/dev/test_dev_caps
endif
