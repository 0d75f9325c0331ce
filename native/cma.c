/*
 * Cross-memory attach: single-copy transfers between processes on one host
 * with process_vm_readv / process_vm_writev.  Allowed when the caller may
 * ptrace the peer (same uid and Yama ptrace_scope permitting, or
 * CAP_SYS_PTRACE) and the syscalls are not filtered by seccomp.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "ucxpy_native.h"

#define PROBE_MAGIC 0x65626f72702d616dULL /* "ma-probe" */

/* A word with a known value: a peer reads it to check that CMA works. */
static volatile const uint64_t probe_word = PROBE_MAGIC;

/* The kernel may move fewer bytes than asked (e.g. a fault part-way); loop
 * until done, an error, or no progress. */
static int64_t cma_rw(int pid, void *local, uint64_t remote_addr, size_t len,
                      int write)
{
    size_t done = 0;

    while (done < len) {
        struct iovec l = { (char *)local + done, len - done };
        struct iovec r = { (void *)(uintptr_t)(remote_addr + done), len - done };
        ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return done ? (int64_t)done : -(int64_t)errno;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (int64_t)done;
}

/* Read ``len`` bytes at ``remote_addr`` in process ``pid`` into ``local``.
 * Returns bytes moved (less than len only on a partial fault) or -errno. */
int64_t ucxpy_cma_read(int pid, void *local, uint64_t remote_addr, size_t len)
{
    return cma_rw(pid, local, remote_addr, len, 0);
}

/* Write ``len`` bytes from ``local`` to ``remote_addr`` in process ``pid``. */
int64_t ucxpy_cma_write(int pid, const void *local, uint64_t remote_addr, size_t len)
{
    return cma_rw(pid, (void *)local, remote_addr, len, 1);
}

/* Address of this process's probe word, to publish to peers. */
uint64_t ucxpy_cma_probe_addr(void)
{
    return (uint64_t)(uintptr_t)&probe_word;
}

/* 1 when CMA from this process to ``pid`` works (reading the peer's probe
 * word at ``remote_probe_addr`` returns the magic), 0 when the read worked
 * but the value is wrong, -errno (EPERM, ESRCH, ENOSYS, EFAULT...) when not. */
int ucxpy_cma_probe(int pid, uint64_t remote_probe_addr)
{
    uint64_t v = 0;
    int64_t n = cma_rw(pid, &v, remote_probe_addr, sizeof v, 0);
    if (n < 0)
        return (int)n;
    if (n != (int64_t)sizeof v)
        return -EFAULT;
    return v == PROBE_MAGIC;
}

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY ((unsigned long)-1)
#endif

/* Under Yama ptrace_scope=1 only ancestors may CMA into us; let any process
 * of the same user do it (what MPI libraries do for single-copy transfers).
 * Returns 0 or -errno (EINVAL without Yama, which then needs nothing). */
int ucxpy_cma_allow_any_peer(void)
{
    if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) < 0)
        return -errno;
    return 0;
}
