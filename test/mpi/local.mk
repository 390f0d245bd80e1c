# Open MPI over UCX with rc_vqp (make check-mpi, check-mpi-full). test_mpi is
# built with mpicc when configure finds it; the build works without MPI.
# The CI subset runs in make check (it fails, not skips, without mpicc).
dist_check_SCRIPTS += test/mpi/test_mpi.sh
TESTS += test/mpi/test_mpi.sh
EXTRA_DIST += test/mpi/test_mpi.c

if HAVE_MPICC
# A program of another compiler: automake's programs all use $(CC). Built by
# 'make' so that a compile error shows without MPI tests being run.
noinst_SCRIPTS = test/mpi/test_mpi
CLEANFILES += test/mpi/test_mpi

test/mpi/test_mpi: $(top_srcdir)/test/mpi/test_mpi.c
	@$(MKDIR_P) test/mpi
	$(AM_V_CC)$(MPICC) $(BASE_CFLAGS) -O2 -o $@ $(top_srcdir)/test/mpi/test_mpi.c
endif

check-mpi: all
	$(AM_TESTS_ENVIRONMENT) MPIRUN='$(MPIRUN)'; export MPIRUN; \
	$(top_srcdir)/test/mpi/test_mpi.sh

check-mpi-full: all
	$(AM_TESTS_ENVIRONMENT) MPIRUN='$(MPIRUN)'; export MPIRUN; \
	$(top_srcdir)/test/mpi/test_mpi.sh --full

.PHONY: check-mpi check-mpi-full
