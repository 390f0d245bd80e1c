# Core microbenchmark (issue 7): built with 'make check' but not run by it;
# 'make bench-core' runs it (time, then instructions under callgrind when
# valgrind is installed) and leaves one JSON line per configuration in
# bench-core.jsonl. The program wraps vqp_dev_progress to stop the device
# while completions are timed.
check_PROGRAMS += test/core/bench_vqp
test_core_bench_vqp_SOURCES = test/core/bench_vqp.c
test_core_bench_vqp_LDADD   = src/core/libvqp.la $(UCX_LIBS)
test_core_bench_vqp_LDFLAGS = $(AM_LDFLAGS) -Wl,--wrap=vqp_dev_progress

BENCH_CORE_OUT   = bench-core.jsonl
BENCH_CORE_FLAGS =

bench-core: test/core/bench_vqp
	rm -f $(BENCH_CORE_OUT) bench-core.cg*
	$(builddir)/test/core/bench_vqp --out $(BENCH_CORE_OUT) $(BENCH_CORE_FLAGS)
	if command -v valgrind >/dev/null 2>&1; then \
	  valgrind --tool=callgrind --collect-atstart=no --instr-atstart=no \
	    --callgrind-out-file=bench-core.cg -q \
	    $(builddir)/test/core/bench_vqp --insn --cg-out bench-core.cg \
	    --out $(BENCH_CORE_OUT) $(BENCH_CORE_FLAGS); \
	else \
	  echo "valgrind not found: no instruction counts"; \
	fi
	rm -f bench-core.cg*
	@echo "JSON lines: $(abs_builddir)/$(BENCH_CORE_OUT)"

CLEANFILES += bench-core.jsonl

.PHONY: bench-core
