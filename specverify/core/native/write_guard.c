/* The worker's write guard: the pages of a call's inputs are read-only while the function runs.

   sv_guard_cover(start, length) makes the page-aligned span [start, start + length) of the
   worker's mapping of the shared buffer read-only and installs a SIGSEGV handler; the span stays
   read-only across calls until another span is covered or sv_guard_release.  A write into the
   span by any thread faults; the handler records it, makes the whole span writable again and
   returns, so the write is retried and succeeds: the function runs exactly as it would unguarded,
   and the audit learns that it wrote (sv_guard_written) and compares the inputs byte for byte.
   A fault outside the span is not the guard's: the handler puts back the disposition that was
   there before it and returns, and the retried access faults into that one.

   While covered and not written, no write reached the span through this mapping: the inputs are
   bit for bit as presented, without reading them again. */

#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

static volatile uintptr_t guard_start, guard_end;
static volatile sig_atomic_t guard_written;
static struct sigaction previous_action;
static int installed;

int sv_guard_release(void);

static void on_fault(int number, siginfo_t *info, void *context) {
    uintptr_t address = (uintptr_t)info->si_addr;
    (void)context;
    if (guard_end > guard_start && address >= guard_start && address < guard_end) {
        guard_written = 1;
        mprotect((void *)guard_start, guard_end - guard_start, PROT_READ | PROT_WRITE);
        return;
    }
    sigaction(number, &previous_action, NULL);
    installed = 0;
}

static int install(void) {
    struct sigaction action;
    if (installed) return 0;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, &previous_action) != 0) return -1;
    installed = 1;
    return 0;
}

/* Make [start, start + length) read-only (the span kept as it is when it is already the one
   guarded and no write has opened it); 0 when it is, -1 when it could not be guarded (nothing is
   guarded then).  Clears the record of writes. */
int sv_guard_cover(void *start, int64_t length) {
    uintptr_t begin = (uintptr_t)start, end = begin + (uintptr_t)length;
    if (length <= 0 || install() != 0) return -1;
    if (begin == guard_start && end == guard_end && !guard_written) return 0;
    if (sv_guard_release() != 0) return -1;
    guard_written = 0;
    if (mprotect(start, (size_t)length, PROT_READ) != 0) return -1;
    guard_start = begin;
    guard_end = end;
    return 0;
}

/* The guarded span writable again and nothing guarded; 0, or -1 when mprotect failed. */
int sv_guard_release(void) {
    uintptr_t start = guard_start, end = guard_end;
    int failed = end > start && mprotect((void *)start, end - start, PROT_READ | PROT_WRITE) != 0;
    guard_start = guard_end = 0;
    return failed ? -1 : 0;
}

/* 1 when a write reached the guarded span since sv_guard_cover last cleared the record, else 0. */
int sv_guard_written(void) {
    return guard_written;
}
