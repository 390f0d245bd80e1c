/*
 * MPI correctness over whatever transport UCX is given (rc_vqp by default in
 * test_mpi.sh): point-to-point at many sizes (blocking and non-blocking,
 * message order), a Sendrecv ring, collectives (Allreduce on int and double,
 * Bcast, Alltoall, Allgather) and one-sided Put/Get/Accumulate with fences
 * and with passive-target locks. Every buffer is filled with a pattern that
 * depends on sender, receiver, tag and byte position, and compared exactly,
 * so a lost, duplicated, misplaced or truncated fragment is caught. Rank 0
 * prints one "ok"/"not ok" line per check; a rank that sees a mismatch prints
 * where. Works for any number of ranks >= 2.
 *   test_mpi [--full] [--corrupt]
 *     --full     adds 64 MiB messages, larger windows and reductions
 *     --corrupt  damages each received buffer before comparing it: every
 *                pattern check must then fail (a test of the checks)
 */
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB 1024UL
#define MiB (1024UL * 1024UL)

static int rank, nranks;
static int failed_checks;
/* --corrupt: flip one received byte before every pattern compare, to show
 * that the checks catch a damaged message (the harness expects failures). */
static int corrupt;

/* Byte i of a message from src to dst with tag: a multiplicative hash, so
 * equal bytes at nearby positions are rare and a shifted copy differs. */
static inline uint8_t pattern(int src, int dst, int tag, size_t i)
{
    uint64_t x = ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ULL;
    x ^= ((uint64_t)src << 48) ^ ((uint64_t)dst << 40) ^ ((uint64_t)tag << 8);
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ULL;
    return (uint8_t)(x >> 56);
}

static void fill(uint8_t *buf, size_t len, int src, int dst, int tag)
{
    for (size_t i = 0; i < len; i++) {
        buf[i] = pattern(src, dst, tag, i);
    }
}

/* Returns 0 when buf holds the pattern, else prints the first bad byte and
 * the number of bad bytes and returns -1. */
static int verify(const char *what, uint8_t *buf, size_t len, int src, int dst,
                  int tag)
{
    size_t bad = 0, first = 0;

    if (corrupt && len > 0) {
        buf[len / 2] ^= 0x40;
    }
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != pattern(src, dst, tag, i)) {
            if (bad++ == 0) {
                first = i;
            }
        }
    }
    if (bad == 0) {
        return 0;
    }
    fprintf(stderr,
            "rank %d: %s: %zu of %zu bytes differ; first at offset %zu: got "
            "0x%02x expected "
            "0x%02x (from rank %d, tag %d)\n",
            rank, what, bad, len, first, buf[first],
            pattern(src, dst, tag, first), src, tag);
    return -1;
}

/* After a failed check of one-sided data: did it arrive after the
 * synchronization that should have waited for it (a completion reported
 * early), or never (lost, or written elsewhere)? Tells which in the log. */
/* Where else in this process do the @a len expected bytes lie (a write
 * to a wrong address)? Scans the writable mappings up to 256 MiB each,
 * redzones included: not instrumented by the sanitizer. */
__attribute__((no_sanitize_address)) static void
find_elsewhere(const char *what, const uint8_t *buf, size_t len, int src,
               int dst, int tag)
{
    unsigned long lo, hi;
    char line[512], perm[8];
    uint8_t want[64];
    unsigned found = 0;
    FILE *maps;

    if ((len < 8) || (len > sizeof(want))) {
        return;
    }
    for (size_t i = 0; i < len; i++) {
        want[i] = pattern(src, dst, tag, i);
    }
    maps = fopen("/proc/self/maps", "r");
    if (maps == NULL) {
        return;
    }
    while (fgets(line, sizeof(line), maps) != NULL) {
        if ((sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) != 3) ||
            (perm[0] != 'r') || (perm[1] != 'w') || (hi - lo > (256ul << 20)) ||
            (strstr(line, "[vvar]") != NULL)) {
            continue;
        }
        for (const uint8_t *p = (const uint8_t *)lo;
             p + len <= (const uint8_t *)hi; p++) {
            size_t i = 0;

            while ((i < len) && (p[i] == want[i])) {
                i++;
            }
            if ((i == len) && (p != want) && (found++ < 4)) {
                fprintf(stderr,
                        "rank %d: %s: the expected bytes are at %p (window "
                        "at %p, %+ld)\n",
                        rank, what, (const void *)p, (const void *)buf,
                        (long)((const uint8_t *)p - buf));
            }
        }
    }
    fclose(maps);
    fprintf(stderr, "rank %d: %s: found the expected bytes at %u places\n",
            rank, what, found);
}

static void late_arrival(const char *what, const uint8_t *buf, size_t len,
                         int src, int dst, int tag)
{
    for (int ms = 1; ms <= 2048; ms *= 2) {
        size_t i;

        usleep(ms * 1000);
        for (i = 0; (i < len) && (buf[i] == pattern(src, dst, tag, i)); i++) {
        }
        if (i == len) {
            fprintf(stderr,
                    "rank %d: %s: the data arrived within %d ms after the "
                    "synchronization\n",
                    rank, what, 2 * ms);
            return;
        }
    }
    fprintf(stderr, "rank %d: %s: the data never arrived (4 s)\n", rank, what);
    find_elsewhere(what, buf, len, src, dst, tag);
}

static int check_status(const char *what, MPI_Status *st, int src, int tag,
                        size_t len)
{
    int count = -1;

    MPI_Get_count(st, MPI_BYTE, &count);
    if (st->MPI_SOURCE != src || st->MPI_TAG != tag || (size_t)count != len) {
        fprintf(stderr,
                "rank %d: %s: status source %d tag %d count %d, expected %d %d "
                "%zu\n",
                rank, what, st->MPI_SOURCE, st->MPI_TAG, count, src, tag, len);
        return -1;
    }
    return 0;
}

/* Every rank passes its own verdict; rank 0 prints the combined one. */
static void report(int local_ok, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void report(int local_ok, const char *fmt, ...)
{
    int all_ok = 0;
    char desc[256];
    va_list ap;

    MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    va_start(ap, fmt);
    vsnprintf(desc, sizeof(desc), fmt, ap);
    va_end(ap);
    if (!all_ok) {
        failed_checks++;
    }
    if (rank == 0) {
        printf("%s - %s (np=%d)\n", all_ok ? "ok" : "not ok", desc, nranks);
        fflush(stdout);
    }
}

static void *xmalloc(size_t len)
{
    void *p = malloc(len ? len : 1);

    if (p == NULL) {
        fprintf(stderr, "rank %d: out of memory for %zu bytes\n", rank, len);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

static int right(void)
{
    return (rank + 1) % nranks;
}
static int left(void)
{
    return (rank + nranks - 1) % nranks;
}

/* Blocking send to the right, receive from the left. Even ranks send first
 * and odd ranks receive first, which cannot deadlock for any np >= 2 even
 * when a send waits for its receive (rendezvous). */
static void test_send_recv(size_t len, int tag)
{
    uint8_t *sbuf = xmalloc(len), *rbuf = xmalloc(len);
    MPI_Status st;
    int ok = 1;

    fill(sbuf, len, rank, right(), tag);
    memset(rbuf, 0, len);
    if (rank % 2 == 0) {
        MPI_Send(sbuf, (int)len, MPI_BYTE, right(), tag, MPI_COMM_WORLD);
        MPI_Recv(rbuf, (int)len, MPI_BYTE, left(), tag, MPI_COMM_WORLD, &st);
    } else {
        MPI_Recv(rbuf, (int)len, MPI_BYTE, left(), tag, MPI_COMM_WORLD, &st);
        MPI_Send(sbuf, (int)len, MPI_BYTE, right(), tag, MPI_COMM_WORLD);
    }
    ok &= check_status("Send/Recv", &st, left(), tag, len) == 0;
    ok &= verify("Send/Recv", rbuf, len, left(), rank, tag) == 0;
    report(ok, "Send/Recv %zu bytes", len);
    free(sbuf);
    free(rbuf);
}

/* Both neighbours at once, in both directions, receives posted before or
 * after the sends (unexpected messages). With np=2 left and right are the
 * same rank: the tags tell the two messages apart. */
static void test_isend_irecv(size_t len, int tag, int post_recv_first)
{
    uint8_t *sbuf[2], *rbuf[2];
    MPI_Request req[4];
    MPI_Status st[4];
    int peer[2] = {right(), left()};
    /* A message to the right carries tag, to the left tag + 1. */
    int stag[2] = {tag, tag + 1}, rtag[2] = {tag + 1, tag};
    int ok = 1;

    for (int k = 0; k < 2; k++) {
        sbuf[k] = xmalloc(len);
        rbuf[k] = xmalloc(len);
        fill(sbuf[k], len, rank, peer[k], stag[k]);
        memset(rbuf[k], 0, len);
    }
    if (post_recv_first) {
        for (int k = 0; k < 2; k++) {
            MPI_Irecv(rbuf[k], (int)len, MPI_BYTE, peer[k], rtag[k],
                      MPI_COMM_WORLD, &req[k]);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    for (int k = 0; k < 2; k++) {
        MPI_Isend(sbuf[k], (int)len, MPI_BYTE, peer[k], stag[k], MPI_COMM_WORLD,
                  &req[2 + k]);
    }
    if (!post_recv_first) {
        MPI_Barrier(MPI_COMM_WORLD);
        for (int k = 0; k < 2; k++) {
            MPI_Irecv(rbuf[k], (int)len, MPI_BYTE, peer[k], rtag[k],
                      MPI_COMM_WORLD, &req[k]);
        }
    }
    MPI_Waitall(4, req, st);
    for (int k = 0; k < 2; k++) {
        ok &= check_status("Isend/Irecv", &st[k], peer[k], rtag[k], len) == 0;
        ok &= verify("Isend/Irecv", rbuf[k], len, peer[k], rank, rtag[k]) == 0;
        free(sbuf[k]);
        free(rbuf[k]);
    }
    report(ok, "Isend/Irecv %zu bytes, both neighbours, %s", len,
           post_recv_first ? "receives posted first"
                           : "sends first (unexpected)");
}

/* MPI does not let messages of one sender, tag and communicator overtake
 * each other: many in flight of mixed sizes must arrive in order. */
static void test_order(void)
{
    enum { N = 64 };
    size_t len[N];
    uint8_t *sbuf[N], *rbuf[N];
    MPI_Request req[2 * N];
    int ok = 1;

    for (int k = 0; k < N; k++) {
        len[k]  = (k % 8 == 7) ? 100 * KiB + (size_t)k : (size_t)k * 37;
        sbuf[k] = xmalloc(len[k]);
        rbuf[k] = xmalloc(len[k]);
        /* The pattern's tag slot holds the sequence number. */
        fill(sbuf[k], len[k], rank, right(), 1000 + k);
        memset(rbuf[k], 0, len[k]);
    }
    for (int k = 0; k < N; k++) {
        MPI_Irecv(rbuf[k], (int)len[k], MPI_BYTE, left(), 77, MPI_COMM_WORLD,
                  &req[k]);
    }
    for (int k = 0; k < N; k++) {
        MPI_Isend(sbuf[k], (int)len[k], MPI_BYTE, right(), 77, MPI_COMM_WORLD,
                  &req[N + k]);
    }
    MPI_Waitall(2 * N, req, MPI_STATUSES_IGNORE);
    for (int k = 0; k < N; k++) {
        ok &= verify("message order", rbuf[k], len[k], left(), rank,
                     1000 + k) == 0;
        free(sbuf[k]);
        free(rbuf[k]);
    }
    report(
        ok,
        "%d messages of mixed sizes (0 .. 100 KiB) on one tag arrive in order",
        N);
}

static void test_sendrecv_ring(size_t len)
{
    uint8_t *sbuf = xmalloc(len), *rbuf = xmalloc(len);
    MPI_Status st;
    int ok = 1;

    /* Data travels around the whole ring: each step forwards what arrived. */
    fill(sbuf, len, rank, 0, 5);
    for (int step = 1; step < nranks; step++) {
        memset(rbuf, 0, len);
        MPI_Sendrecv(sbuf, (int)len, MPI_BYTE, right(), step, rbuf, (int)len,
                     MPI_BYTE, left(), step, MPI_COMM_WORLD, &st);
        ok &= check_status("Sendrecv", &st, left(), step, len) == 0;
        ok &= verify("Sendrecv ring", rbuf, len,
                     (rank + nranks - step) % nranks, 0, 5) == 0;
        memcpy(sbuf, rbuf, len);
    }
    report(ok, "Sendrecv ring, %zu bytes, %d steps", len, nranks - 1);
    free(sbuf);
    free(rbuf);
}

/* Values small enough that the int sum cannot overflow, and doubles that are
 * integers or halves, so every summation order gives the exact result. */
static int ival(int r, size_t i)
{
    return (int)((i * 7 + (size_t)r * 13) % 100003) - 50000;
}
static double dval(int r, size_t i)
{
    return (double)((i + (size_t)r * 3) % 4099) * 0.5 - 1000.0;
}

static void test_allreduce(size_t count)
{
    int *is = xmalloc(count * sizeof(int)), *ir = xmalloc(count * sizeof(int));
    double *ds  = xmalloc(count * sizeof(double)),
           *dr  = xmalloc(count * sizeof(double));
    size_t ibad = 0, dbad = 0, first = 0;
    int ok = 1;

    for (size_t i = 0; i < count; i++) {
        is[i] = ival(rank, i);
        ds[i] = dval(rank, i);
    }
    memset(ir, 0, count * sizeof(int));
    memset(dr, 0, count * sizeof(double));
    MPI_Allreduce(is, ir, (int)count, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(ds, dr, (int)count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < count; i++) {
        int ie    = 0;
        double de = 0;

        for (int r = 0; r < nranks; r++) {
            ie += ival(r, i);
            de += dval(r, i);
        }
        if (ir[i] != ie && ibad++ == 0) {
            fprintf(stderr, "rank %d: Allreduce int[%zu] = %d, expected %d\n",
                    rank, i, ir[i], ie);
        }
        if (dr[i] != de) {
            if (dbad++ == 0) {
                first = i;
            }
        }
    }
    if (dbad) {
        fprintf(stderr,
                "rank %d: Allreduce double: %zu wrong, first [%zu] = %.17g\n",
                rank, dbad, first, dr[first]);
    }
    ok = ibad == 0 && dbad == 0;
    report(ok, "Allreduce sum of %zu int and %zu double", count, count);
    free(is);
    free(ir);
    free(ds);
    free(dr);
}

static void test_bcast(size_t len)
{
    uint8_t *buf = xmalloc(len);
    int ok       = 1;

    /* Each rank is root once. */
    for (int root = 0; root < nranks; root++) {
        if (rank == root) {
            fill(buf, len, root, 0, 9);
        } else {
            memset(buf, 0, len);
        }
        MPI_Bcast(buf, (int)len, MPI_BYTE, root, MPI_COMM_WORLD);
        ok &= verify("Bcast", buf, len, root, 0, 9) == 0;
    }
    report(ok, "Bcast %zu bytes from every root", len);
    free(buf);
}

static void test_alltoall(size_t block)
{
    uint8_t *sbuf = xmalloc(block * nranks), *rbuf = xmalloc(block * nranks);
    int ok = 1;

    for (int r = 0; r < nranks; r++) {
        fill(sbuf + r * block, block, rank, r, 11);
    }
    memset(rbuf, 0, block * nranks);
    MPI_Alltoall(sbuf, (int)block, MPI_BYTE, rbuf, (int)block, MPI_BYTE,
                 MPI_COMM_WORLD);
    for (int r = 0; r < nranks; r++) {
        ok &= verify("Alltoall", rbuf + r * block, block, r, rank, 11) == 0;
    }
    report(ok, "Alltoall %zu bytes per pair", block);
    free(sbuf);
    free(rbuf);
}

static void test_allgather(size_t block)
{
    uint8_t *sbuf = xmalloc(block), *rbuf = xmalloc(block * nranks);
    int ok = 1;

    fill(sbuf, block, rank, 0, 13);
    memset(rbuf, 0, block * nranks);
    MPI_Allgather(sbuf, (int)block, MPI_BYTE, rbuf, (int)block, MPI_BYTE,
                  MPI_COMM_WORLD);
    for (int r = 0; r < nranks; r++) {
        ok &= verify("Allgather", rbuf + r * block, block, r, 0, 13) == 0;
    }
    report(ok, "Allgather %zu bytes per rank", block);
    free(sbuf);
    free(rbuf);
}

/* One-sided, active target: every rank puts into its right neighbour's
 * window, gets from its left neighbour's, and all ranks accumulate into
 * every window. The window's first len bytes take the put; the next len
 * bytes hold the owner's own pattern for gets; then one int per element for
 * the accumulate. */
static void test_rma_fence(size_t len)
{
    const size_t nacc = 1024;
    size_t wsize      = 2 * len + nacc * sizeof(int);
    uint8_t *base, *gbuf = xmalloc(len), *pbuf = xmalloc(len);
    int *acc, *contrib = xmalloc(nacc * sizeof(int));
    MPI_Win win;
    int ok = 1;

    MPI_Alloc_mem((MPI_Aint)wsize, MPI_INFO_NULL, &base);
    memset(base, 0, len);
    fill(base + len, len, rank, 0, 21);
    acc = (int *)(base + 2 * len);
    for (size_t i = 0; i < nacc; i++) {
        acc[i]     = 1000 * rank;
        contrib[i] = ival(rank, i);
    }
    fill(pbuf, len, rank, right(), 20);
    memset(gbuf, 0, len);
    MPI_Win_create(base, (MPI_Aint)wsize, 1, MPI_INFO_NULL, MPI_COMM_WORLD,
                   &win);

    MPI_Win_fence(0, win);
    MPI_Put(pbuf, (int)len, MPI_BYTE, right(), 0, (int)len, MPI_BYTE, win);
    MPI_Get(gbuf, (int)len, MPI_BYTE, left(), (MPI_Aint)len, (int)len, MPI_BYTE,
            win);
    MPI_Win_fence(0, win);
    if (verify("Put+fence", base, len, left(), rank, 20) != 0) {
        ok = 0;
        if (!corrupt) { /* damage done on purpose arrives never */
            late_arrival("Put+fence", base, len, left(), rank, 20);
        }
    }
    ok &= verify("Get+fence", gbuf, len, left(), 0, 21) == 0;
    report(ok, "Put and Get %zu bytes with MPI_Win_fence", len);

    ok = 1;
    for (int r = 0; r < nranks; r++) {
        MPI_Accumulate(contrib, (int)nacc, MPI_INT, r, (MPI_Aint)(2 * len),
                       (int)nacc, MPI_INT, MPI_SUM, win);
    }
    MPI_Win_fence(0, win);
    for (size_t i = 0; i < nacc; i++) {
        int e = 1000 * rank;

        for (int r = 0; r < nranks; r++) {
            e += ival(r, i);
        }
        if (acc[i] != e) {
            fprintf(stderr,
                    "rank %d: Accumulate+fence [%zu] = %d, expected %d\n", rank,
                    i, acc[i], e);
            ok = 0;
            break;
        }
    }
    report(ok,
           "Accumulate (sum) of %zu int from every rank into every %zu-byte "
           "window with "
           "MPI_Win_fence",
           nacc, wsize);

    MPI_Win_free(&win);
    MPI_Free_mem(base);
    free(gbuf);
    free(pbuf);
    free(contrib);
}

/* One-sided, passive target: under an exclusive lock, put into the right
 * neighbour's window, flush, read it back with get, unlock; then every rank
 * accumulates into rank 0's counters under shared locks. */
static void test_rma_lock(size_t len)
{
    const size_t nacc = 256;
    size_t wsize      = len + nacc * sizeof(int);
    uint8_t *base, *pbuf = xmalloc(len), *gbuf = xmalloc(len);
    int *acc, *contrib = xmalloc(nacc * sizeof(int));
    MPI_Win win;
    int ok = 1;

    MPI_Alloc_mem((MPI_Aint)wsize, MPI_INFO_NULL, &base);
    memset(base, 0, wsize);
    acc = (int *)(base + len);
    for (size_t i = 0; i < nacc; i++) {
        contrib[i] = ival(rank, i + 7);
    }
    MPI_Win_create(base, (MPI_Aint)wsize, 1, MPI_INFO_NULL, MPI_COMM_WORLD,
                   &win);
    fill(pbuf, len, rank, right(), 30);
    memset(gbuf, 0, len);

    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, right(), 0, win);
    MPI_Put(pbuf, (int)len, MPI_BYTE, right(), 0, (int)len, MPI_BYTE, win);
    MPI_Win_flush(right(), win);
    MPI_Get(gbuf, (int)len, MPI_BYTE, right(), 0, (int)len, MPI_BYTE, win);
    MPI_Win_unlock(right(), win);
    ok &= verify("Get after Put+flush", gbuf, len, rank, right(), 30) == 0;
    /* The unlocks are complete at the target once every rank passed here. */
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
    ok &=
        verify("Put+flush+unlock at target", base, len, left(), rank, 30) == 0;
    MPI_Win_unlock(rank, win);
    report(
        ok,
        "Put, flush, Get back %zu bytes under MPI_Win_lock, seen by the target",
        len);

    ok = 1;
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
    MPI_Accumulate(contrib, (int)nacc, MPI_INT, 0, (MPI_Aint)len, (int)nacc,
                   MPI_INT, MPI_SUM, win);
    MPI_Win_flush(0, win);
    MPI_Win_unlock(0, win);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        for (size_t i = 0; i < nacc; i++) {
            int e = 0;

            for (int r = 0; r < nranks; r++) {
                e += ival(r, i + 7);
            }
            if (acc[i] != e) {
                fprintf(stderr,
                        "rank 0: Accumulate+lock [%zu] = %d, expected %d\n", i,
                        acc[i], e);
                ok = 0;
                break;
            }
        }
        MPI_Win_unlock(0, win);
    }
    report(ok,
           "Accumulate (sum) of %zu int from every rank into rank 0's %zu-byte "
           "window under "
           "shared locks",
           nacc, wsize);

    MPI_Win_free(&win);
    MPI_Free_mem(base);
    free(pbuf);
    free(gbuf);
    free(contrib);
}

int main(int argc, char **argv)
{
    int full = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--full") == 0) {
            full = 1;
        } else if (strcmp(argv[i], "--corrupt") == 0) {
            corrupt = 1;
        } else {
            if (rank == 0) {
                fprintf(stderr, "usage: %s [--full] [--corrupt]\n", argv[0]);
            }
            MPI_Finalize();
            return 2;
        }
    }
    if (nranks < 2) {
        if (rank == 0) {
            fprintf(stderr, "test_mpi needs at least 2 ranks (got %d)\n",
                    nranks);
        }
        MPI_Finalize();
        return 2;
    }

    const size_t sizes[] = {0,        1,           7,        8 * KiB - 1,
                            8 * KiB,  8 * KiB + 1, 64 * KiB, MiB + 3,
                            16 * MiB, 64 * MiB};
    size_t nsizes        = sizeof(sizes) / sizeof(sizes[0]) - (full ? 0 : 1);
    for (size_t k = 0; k < nsizes; k++) {
        test_send_recv(sizes[k], 100 + (int)k);
    }
    for (size_t k = 0; k < nsizes; k++) {
        test_isend_irecv(sizes[k], 200 + 2 * (int)k, 1);
        test_isend_irecv(sizes[k], 300 + 2 * (int)k, 0);
    }
    test_order();
    test_sendrecv_ring(KiB);
    test_sendrecv_ring(MiB + 3);
    test_allreduce(1);
    test_allreduce(1000);
    test_allreduce(full ? 4 * MiB : 256 * KiB);
    test_bcast(1);
    test_bcast(64 * KiB);
    test_bcast(4 * MiB + 1);
    test_alltoall(4);
    test_alltoall(64 * KiB + 1);
    test_allgather(8);
    test_allgather(MiB + 5);
    test_rma_fence(8);
    test_rma_fence(64 * KiB + 5);
    test_rma_fence(full ? 16 * MiB + 1 : 4 * MiB + 1);
    test_rma_lock(8);
    test_rma_lock(64 * KiB + 5);
    test_rma_lock(full ? 16 * MiB + 1 : 4 * MiB + 1);

    int total = 0;
    MPI_Allreduce(&failed_checks, &total, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("%s: %d checks failed\n", total ? "FAIL" : "PASS", total);
    }
    MPI_Finalize();
    return total ? 1 : 0;
}
