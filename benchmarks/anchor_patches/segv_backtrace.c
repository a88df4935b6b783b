/* LD_PRELOAD helper for the GPU machine, which has no gdb (benchmarks/anchor_diag.sh builds it with cc):
 * on SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT it flushes stdio, writes the signal, the fault address,
 * the instruction pointer, a native backtrace (glibc's backtrace_symbols_fd) and the process's executable
 * mappings to stderr, then re-raises the signal with its default action (same exit status as before).
 * Python's faulthandler, where enabled, replaces these handlers; the diagnosis runs without it. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static char maps[1 << 20];

static void put(const char *s) { ssize_t r = write(2, s, strlen(s)); (void)r; }

static void put_hex(const char *label, unsigned long v) {
    char buf[64], *p = buf + sizeof buf;
    *--p = '\0'; *--p = '\n';
    do { *--p = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    *--p = 'x'; *--p = '0';
    put(label); put(p);
}

static void on_signal(int sig, siginfo_t *info, void *ctx) {
    fflush(NULL);
    put("\n[segv_backtrace] signal "); put(strsignal(sig)); put("\n");
    put_hex("[segv_backtrace] fault address ", (unsigned long)info->si_addr);
#if defined(__x86_64__)
    put_hex("[segv_backtrace] instruction pointer ", (unsigned long)((ucontext_t *)ctx)->uc_mcontext.gregs[REG_RIP]);
#endif
    void *frames[128];
    const int n = backtrace(frames, 128);
    put("[segv_backtrace] backtrace:\n");
    backtrace_symbols_fd(frames, n, 2);
    put("[segv_backtrace] executable mappings:\n");
    const int fd = open("/proc/self/maps", O_RDONLY);
    if (fd >= 0) {
        ssize_t len = 0, r;
        while (len < (ssize_t)sizeof maps - 1 && (r = read(fd, maps + len, sizeof maps - 1 - len)) > 0)
            len += r;
        close(fd);
        maps[len] = '\0';
        for (char *line = maps, *end; line && *line; line = end ? end + 1 : NULL) {
            end = strchr(line, '\n');
            if (end) *end = '\0';
            if (strstr(line, " r-xp ")) { put(line); put("\n"); }
        }
    }
    put("[segv_backtrace] end\n");
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1);  /* loads libgcc_s now, not inside the handler */
    static char stack[1 << 16];
    stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; ++i)
        sigaction(sigs[i], &sa, NULL);
}
