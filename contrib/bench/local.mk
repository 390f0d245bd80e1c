# End-to-end benchmark (issue 7): 'make bench' builds the module and runs
# contrib/bench/run.sh, stock ucx_perftest over rc_vqp (software device), cma
# and posix, into $(BENCH_OUT) (results.json, results.md, bw.png). Not part
# of 'make check'. BENCH_FLAGS passes options, e.g. BENCH_FLAGS='-r 3'.
BENCH_OUT   = bench-results
BENCH_FLAGS =

EXTRA_DIST += contrib/bench/run.sh contrib/bench/summarize.awk contrib/bench/plot.gp \
	contrib/bench/profile.sh

bench: all
	bindir='$(UCX_BINDIR)'; \
	UCX_PERFTEST="$${bindir:+$$bindir/}ucx_perftest" \
	$(top_srcdir)/contrib/bench/run.sh \
	  -m $(abs_top_builddir)/modules/rc_vqp/.libs/libuct_rc_vqp.so \
	  -o $(BENCH_OUT) $(BENCH_FLAGS)

.PHONY: bench
