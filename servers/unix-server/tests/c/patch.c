/* Call sites the library patches (`mov eax, NR; syscall`), checked from the program's
 * side: every register but rax/rcx/r11, the flags, the red zone, the SSE state and
 * MXCSR come back as they went in, through the trap that patches and through the
 * patched path after it; many threads run many sites while they are being patched;
 * the pid answered from the state page is right after fork, in a vfork child, and
 * after posix_spawn; a signal handler makes patched calls. Prints one line per check;
 * "ok" or what went wrong. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* check_regs_NAME(rdi, rsi): makes the call NR from one fixed site with every other
 * register, the flags (CF, DF), xmm0-15, MXCSR and the 128-byte red zone set to
 * patterns; returns a bit per thing that changed. */
#define CHECK_REGS(NAME, NR)                                                          \
    extern long check_regs_##NAME(long rdi, long rsi);                                \
    __asm__(".text\n.globl check_regs_" #NAME "\ncheck_regs_" #NAME ":\n"             \
            "push %rbx\npush %rbp\npush %r12\npush %r13\npush %r14\npush %r15\n"      \
            "sub $8, %rsp\n"                                                          \
            "stmxcsr (%rsp)\n"                                                        \
            "movl $0x7f80, 4(%rsp)\n" /* round toward zero, all masked */             \
            "ldmxcsr 4(%rsp)\n"                                                       \
            "mov $0x1111111111111111, %rbx\n"                                         \
            "mov $0x2222222222222222, %rbp\n"                                         \
            "mov $0x3333333333333333, %r12\n"                                         \
            "mov $0x4444444444444444, %r13\n"                                         \
            "mov $0x5555555555555555, %r14\n"                                         \
            "mov $0x6666666666666666, %r15\n"                                         \
            "mov $0x7777777777777777, %rdx\n"                                         \
            "mov $0x8888888888888888, %r10\n"                                         \
            "mov $0x9999999999999999, %r8\n"                                          \
            "mov $0xaaaaaaaaaaaaaaaa, %r9\n"                                          \
            "movq %rbx, %xmm0\nmovq %rbp, %xmm1\nmovq %r12, %xmm2\nmovq %r13, %xmm3\n" \
            "movq %r14, %xmm4\nmovq %r15, %xmm5\nmovq %rdx, %xmm6\nmovq %r10, %xmm7\n" \
            "movq %r8, %xmm8\nmovq %r9, %xmm9\nmovq %rbx, %xmm10\nmovq %rbp, %xmm11\n" \
            "movq %r12, %xmm12\nmovq %r13, %xmm13\nmovq %r14, %xmm14\nmovq %r15, %xmm15\n" \
            "mov $-128, %rax\n"                                                       \
            "1: mov %rax, (%rsp,%rax)\nadd $8, %rax\njnz 1b\n"                        \
            "stc\nstd\n"                                                              \
            "mov $" #NR ", %eax\nsyscall\n"                                           \
            "lea -256(%rsp), %rsp\npushf\npop %rcx\nlea 256(%rsp), %rsp\ncld\n"                                                  \
            "xor %eax, %eax\n"                                                        \
            "test $1, %ecx\njnz 2f\nor $1, %eax\n2:\n"                                \
            "test $0x400, %ecx\njnz 2f\nor $2, %eax\n2:\n"                            \
            "mov $0x1111111111111111, %rcx\ncmp %rcx, %rbx\nje 2f\nor $4, %eax\n2:\n"  \
            "mov $0x2222222222222222, %rcx\ncmp %rcx, %rbp\nje 2f\nor $8, %eax\n2:\n"  \
            "mov $0x3333333333333333, %rcx\ncmp %rcx, %r12\nje 2f\nor $16, %eax\n2:\n" \
            "mov $0x4444444444444444, %rcx\ncmp %rcx, %r13\nje 2f\nor $32, %eax\n2:\n" \
            "mov $0x5555555555555555, %rcx\ncmp %rcx, %r14\nje 2f\nor $64, %eax\n2:\n" \
            "mov $0x6666666666666666, %rcx\ncmp %rcx, %r15\nje 2f\nor $128, %eax\n2:\n" \
            "mov $0x7777777777777777, %rcx\ncmp %rcx, %rdx\nje 2f\nor $256, %eax\n2:\n" \
            "mov $0x8888888888888888, %rcx\ncmp %rcx, %r10\nje 2f\nor $512, %eax\n2:\n" \
            "mov $0x9999999999999999, %rcx\ncmp %rcx, %r8\nje 2f\nor $1024, %eax\n2:\n" \
            "mov $0xaaaaaaaaaaaaaaaa, %rcx\ncmp %rcx, %r9\nje 2f\nor $2048, %eax\n2:\n" \
            "movq %xmm0, %rcx\ncmp %rcx, %rbx\nje 2f\nor $4096, %eax\n2:\n"            \
            "movq %xmm5, %rcx\ncmp %rcx, %r15\nje 2f\nor $4096, %eax\n2:\n"            \
            "movq %xmm9, %rcx\ncmp %rcx, %r9\nje 2f\nor $4096, %eax\n2:\n"             \
            "movq %xmm15, %rcx\ncmp %rcx, %r15\nje 2f\nor $4096, %eax\n2:\n"           \
            "stmxcsr 4(%rsp)\ncmpl $0x7f80, 4(%rsp)\nje 2f\nor $8192, %eax\n2:\n"      \
            "mov $-128, %rcx\n"                                                       \
            "3: cmp %rcx, (%rsp,%rcx)\nje 4f\nor $16384, %eax\n4: add $8, %rcx\njnz 3b\n" \
            "ldmxcsr (%rsp)\n"                                                        \
            "add $8, %rsp\n"                                                          \
            "pop %r15\npop %r14\npop %r13\npop %r12\npop %rbp\npop %rbx\nret\n");

/* The red-zone check compares each word with its own offset from rsp: the call must
 * keep rdi and rsi (the call's arguments) and the words below rsp. */
CHECK_REGS(getpid, 39)
CHECK_REGS(getuid, 102)
CHECK_REGS(stat, 4)

/* 64 distinct getpid sites and 16 distinct stat sites, for the threads. */
#define PID_SITE(n)                                                                  \
    static long pid_site##n(void) {                                                  \
        long r;                                                                      \
        __asm__ volatile("mov $39, %%eax\n\tsyscall" : "=a"(r) : : "rcx", "r11", "memory"); \
        return r;                                                                    \
    }
#define STAT_SITE(n)                                                                 \
    static long stat_site##n(const char *p, struct stat *st) {                       \
        long r;                                                                      \
        __asm__ volatile("mov $4, %%eax\n\tsyscall" : "=a"(r) : "D"(p), "S"(st) : "rcx", "r11", "memory"); \
        return r;                                                                    \
    }
#define X8(M, b) M(b##0) M(b##1) M(b##2) M(b##3) M(b##4) M(b##5) M(b##6) M(b##7)
X8(PID_SITE, 0) X8(PID_SITE, 1) X8(PID_SITE, 2) X8(PID_SITE, 3)
X8(PID_SITE, 4) X8(PID_SITE, 5) X8(PID_SITE, 6) X8(PID_SITE, 7)
X8(STAT_SITE, 0) X8(STAT_SITE, 1)
#define P8(b) pid_site##b##0, pid_site##b##1, pid_site##b##2, pid_site##b##3, \
              pid_site##b##4, pid_site##b##5, pid_site##b##6, pid_site##b##7
static long (*pid_sites[64])(void) = {P8(0), P8(1), P8(2), P8(3), P8(4), P8(5), P8(6), P8(7)};
#define S8(b) stat_site##b##0, stat_site##b##1, stat_site##b##2, stat_site##b##3, \
              stat_site##b##4, stat_site##b##5, stat_site##b##6, stat_site##b##7
static long (*stat_sites[16])(const char *, struct stat *) = {S8(0), S8(1)};

static pid_t real_pid;
static volatile int go;
static const char *missing = "/nonexistent/ictus-patch-test";

static void *hammer(void *arg) {
    long bad = 0;
    long id = (long)arg;
    while (!go) {
    }
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 64; i++) {
            long r = pid_sites[i]();
            if (r != real_pid) bad++;
        }
        struct stat st;
        for (int i = 0; i < 16; i++) {
            long r = stat_sites[i](i % 2 ? missing : "/etc/hostname", &st);
            if (r != (i % 2 ? -ENOENT : 0)) bad++;
        }
    }
    return (void *)bad;
}

static volatile int traps;
static void on_trap(int s) {
    (void)s;
    traps++;
}

/* The state a thread sees while a site is being patched: the int3 over its first
 * byte. Made here by hand on a site the library has patched (found by its jump). */
static const char *mid_patch(void) {
    unsigned char *f = (unsigned char *)pid_sites[63];
    if (pid_sites[63]() != real_pid) return "WRONG before";
    unsigned char *site = 0;
    for (int i = 0; i < 16; i++)
        if (f[i] == 0xff && f[i + 1] == 0x24 && f[i + 2] == 0x25 && f[i + 5] == 0x0f && f[i + 6] == 0x05) site = f + i;
    if (!site) return "NOT PATCHED";
    unsigned long page = (unsigned long)site & ~4095UL;
    if (mprotect((void *)page, 8192, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return "mprotect failed";
    site[0] = 0xcc;
    long r = pid_sites[63]();
    site[0] = 0xff;
    mprotect((void *)page, 8192, PROT_READ | PROT_EXEC);
    return r == real_pid ? "ok" : "WRONG";
}

static volatile long handler_pid;
static void on_usr1(int s) {
    (void)s;
    handler_pid = getpid();
    struct stat st;
    if (stat(missing, &st) == 0) handler_pid = -1;
}

/* The pid as the kernel knows it, not through getpid: /proc/self's target. */
static pid_t proc_self(void) {
    char b[32];
    ssize_t n = readlink("/proc/self", b, sizeof b - 1);
    if (n <= 0) return -1;
    b[n] = 0;
    return atoi(b);
}

int main(void) {
    real_pid = proc_self();
    struct stat st;
    for (int i = 0; i < 3; i++) {
        long g = check_regs_getpid(0, 0);
        long u = check_regs_getuid(0, 0);
        /* rdi/rsi are stat's arguments: a missing path (the cache) and a buffer. */
        long s1 = check_regs_stat((long)missing, (long)&st);
        long s2 = check_regs_stat((long)"/etc/hostname", (long)&st);
        printf("registers %d: %s (getpid %lx getuid %lx stat %lx %lx)\n", i, g | u | s1 | s2 ? "CHANGED" : "ok", g, u, s1,
               s2);
    }
    printf("getpid %s\n", getpid() == real_pid && syscall(SYS_getpid) == real_pid ? "ok" : "WRONG");
    printf("getuid %s\n", getuid() == (uid_t)syscall(SYS_getuid) && geteuid() == (uid_t)syscall(SYS_geteuid) &&
                                  getgid() == (gid_t)syscall(SYS_getgid) && getegid() == (gid_t)syscall(SYS_getegid)
                              ? "ok"
                              : "WRONG");

    pthread_t th[6];
    for (long i = 0; i < 6; i++) pthread_create(&th[i], 0, hammer, (void *)i);
    go = 1;
    long bad = 0;
    for (int i = 0; i < 6; i++) {
        void *r;
        pthread_join(th[i], &r);
        bad += (long)r;
    }
    printf("threads while patching: %s (%ld wrong)\n", bad ? "WRONG" : "ok", bad);

    int fds[2];
    if (pipe(fds) != 0) return 1;
    pid_t c = fork();
    if (c == 0) {
        pid_t mine[3] = {getpid(), pid_sites[0](), proc_self()};
        write(fds[1], mine, sizeof mine);
        _exit(0);
    }
    pid_t got[3];
    read(fds[0], got, sizeof got);
    waitpid(c, 0, 0);
    printf("fork child pid %s\n", got[0] == c && got[1] == c && got[2] == c ? "ok" : "WRONG");

    static volatile pid_t vchild[2];
    c = vfork();
    if (c == 0) {
        vchild[0] = getpid();
        vchild[1] = pid_sites[1]();
        _exit(0);
    }
    waitpid(c, 0, 0);
    printf("vfork child pid %s\n", vchild[0] == c && vchild[1] == c ? "ok" : "WRONG");
    printf("parent pid after vfork %s\n", getpid() == real_pid && pid_sites[2]() == real_pid ? "ok" : "WRONG");

    char *argv[] = {"true", NULL};
    pid_t sp;
    int e = posix_spawn(&sp, "/bin/true", NULL, NULL, argv, environ);
    int status = -1;
    if (e == 0) waitpid(sp, &status, 0);
    printf("posix_spawn %s\n", e == 0 && status == 0 ? "ok" : "WRONG");
    e = posix_spawn(&sp, "/nonexistent/ictus-program", NULL, NULL, argv, environ);
    printf("posix_spawn of a missing program %s\n", e == ENOENT ? "ENOENT" : strerror(e));
    printf("parent pid after posix_spawn %s\n", getpid() == real_pid ? "ok" : "WRONG");

    signal(SIGUSR1, on_usr1);
    for (int i = 0; i < 100; i++) {
        raise(SIGUSR1);
        if (handler_pid != real_pid) break;
        stat_sites[i % 16](missing, &st);
    }
    printf("handler %s\n", handler_pid == real_pid ? "ok" : "WRONG");

    printf("a site met mid-patch %s\n", mid_patch());
    /* SIGTRAP stays the program's for everything else. */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_trap;
    sigaction(SIGTRAP, &sa, 0);
    raise(SIGTRAP);
    __asm__ volatile("int3");
    sigaction(SIGTRAP, 0, &old);
    printf("own SIGTRAP handler %s (%d)\n", traps == 2 && old.sa_handler == on_trap ? "ok" : "WRONG", traps);
    return 0;
}
