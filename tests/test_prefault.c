/* test_prefault.c - kvs_prefault (src/util/prefault.h): the whole pages of
 * a fresh mapping are resident after it, the bytes are unchanged, and the
 * partial pages at either end are left alone. Residency is read with
 * mincore(2). On a kernel without MADV_POPULATE_WRITE (before Linux 5.14)
 * the call does nothing and the residency test says it is skipped. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvs_test.h"
#include "util/prefault.h"

/* Resident pages among the n pages at p. */
static size_t resident(void *p, size_t npages, size_t page)
{
    unsigned char v[64];
    if (npages > sizeof v || mincore(p, npages * page, v) != 0) return (size_t)-1;
    size_t r = 0;
    for (size_t i = 0; i < npages; i++) r += v[i] & 1;
    return r;
}

static int populate_supported(void *p, size_t page)
{
#ifdef MADV_POPULATE_WRITE
    return madvise(p, page, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
#else
    (void)p;
    (void)page;
    return 0;
#endif
}

static void test_whole_pages_mapped(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    enum { NP = 16 };
    uint8_t *m = mmap(NULL, NP * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    REQUIRE(m != MAP_FAILED);
    CHECK_EQ_U64(resident(m, NP, page), 0); /* nothing touched yet */
    /* [page/2, 14.5 pages): whole pages 1 .. 13 inside, pages 0 and 14 only in part */
    uint8_t *p = m + page / 2;
    size_t n = 14 * page;
    kvs_prefault(p, n);
    if (!populate_supported(m + 15 * page, page)) {
        printf("test_whole_pages_mapped skipped (no MADV_POPULATE_WRITE)\n");
        munmap(m, NP * page);
        return;
    }
    /* page 15 was populated by the probe just above */
    CHECK_EQ_U64(resident(m, 1, page), 0);
    CHECK_EQ_U64(resident(m + page, 13, page), 13);
    CHECK_EQ_U64(resident(m + 14 * page, 1, page), 0);
    for (size_t i = 0; i < NP * page; i++)
        if (m[i] != 0) {
            CHECK(m[i] == 0);
            break;
        }
    munmap(m, NP * page);
}

static void test_contents_kept_and_small_ranges(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    REQUIRE(m != MAP_FAILED);
    memset(m, 0xa5, 4 * page);
    kvs_prefault(m, 4 * page);
    for (size_t i = 0; i < 4 * page; i++)
        if (m[i] != 0xa5) {
            CHECK(m[i] == 0xa5);
            break;
        }
    kvs_prefault(m + 1, page - 2); /* no whole page inside: nothing to do */
    kvs_prefault(NULL, 100);
    kvs_prefault(m, 0);
    munmap(m, 4 * page);
}

int main(void)
{
    RUN(test_whole_pages_mapped);
    RUN(test_contents_kept_and_small_ranges);
    return TEST_SUMMARY();
}
