/*
 * Open MPI 4.1's osc ucx creates its own UCP context and worker with the
 * first window of a process and connects endpoints to every peer at once
 * (through rc_vqp's connection manager). This program does only that: one
 * window, a fence, a put to the right neighbour and a get from the left one,
 * a fence, and checks both. Run by contrib/mpi-first-window.sh, many times;
 * with an argument, a 1 MiB allgather runs first.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN 8

static uint8_t pattern(int src, int dst, int tag, size_t i)
{
    return (uint8_t)(src * 31 + dst * 7 + tag * 13 + i * 3 + 1);
}

static int check(const char *what, const uint8_t *buf, int rank, int src,
                 int dst, int tag)
{
    size_t i;

    for (i = 0; i < LEN; i++) {
        if (buf[i] != pattern(src, dst, tag, i)) {
            fprintf(stderr, "rank %d: %s from %d: byte %zu is 0x%02x\n", rank,
                    what, src, i, buf[i]);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    uint8_t *base, pbuf[LEN], gbuf[LEN];
    int rank, n, right, left, bad = 0, total = 0;
    size_t i;
    MPI_Win win;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    right = (rank + 1) % n;
    left  = (rank + n - 1) % n;
    if (argc > 1) {
        size_t big = 1u << 20;
        char *s = malloc(big), *r = malloc(big * (size_t)n);

        memset(s, rank, big);
        MPI_Allgather(s, (int)big, MPI_BYTE, r, (int)big, MPI_BYTE,
                      MPI_COMM_WORLD);
        free(s);
        free(r);
    }
    MPI_Alloc_mem(2 * LEN + 4096, MPI_INFO_NULL, &base);
    memset(base, 0, LEN);
    for (i = 0; i < LEN; i++) {
        base[LEN + i] = pattern(rank, 0, 21, i);
        pbuf[i]       = pattern(rank, right, 20, i);
    }
    memset(gbuf, 0, LEN);
    MPI_Win_create(base, 2 * LEN + 4096, 1, MPI_INFO_NULL, MPI_COMM_WORLD,
                   &win);
    MPI_Win_fence(0, win);
    MPI_Put(pbuf, LEN, MPI_BYTE, right, 0, LEN, MPI_BYTE, win);
    MPI_Get(gbuf, LEN, MPI_BYTE, left, LEN, LEN, MPI_BYTE, win);
    MPI_Win_fence(0, win);
    bad |= check("put", base, rank, left, rank, 20);
    bad |= check("get", gbuf, rank, left, 0, 21);
    MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("%s: %d ranks saw wrong data\n", total ? "FAIL" : "PASS", total);
    }
    MPI_Win_free(&win);
    MPI_Free_mem(base);
    MPI_Finalize();
    return total ? 1 : 0;
}
