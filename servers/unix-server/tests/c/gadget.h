/* Shared by the hostile test programs: a gadget that makes any system call from a
 * page the program maps inside the emulation library's address range, so the filter
 * sees the call come from "the library's code". */
#ifndef ICTUS_TEST_GADGET_H
#define ICTUS_TEST_GADGET_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef long (*gadget_fn)(long, long, long, long, long, long, long);
static gadget_fn gadget;

static void make_gadget(void) {
    /* mov rax,rdi; mov rdi,rsi; mov rsi,rdx; mov rdx,rcx; mov r10,r8; mov r8,r9;
     * mov r9,[rsp+8]; syscall; ret */
    static const unsigned char code[] = {0x48, 0x89, 0xf8, 0x48, 0x89, 0xf7, 0x48, 0x89, 0xd6, 0x48, 0x89, 0xca,
                                         0x4d, 0x89, 0xc2, 0x4d, 0x89, 0xc8, 0x4c, 0x8b, 0x4c, 0x24, 0x08,
                                         0x0f, 0x05, 0xc3};
    /* Any free page of the library's range [0x5000000, 0x5100000). */
    void *p = MAP_FAILED;
    for (unsigned long a = 0x50ff000; a >= 0x5000000 && p == MAP_FAILED; a -= 0x1000) {
        p = mmap((void *)a, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (p != MAP_FAILED && p != (void *)a) { munmap(p, 4096); p = MAP_FAILED; }
    }
    if (p == MAP_FAILED) { printf("mmap in the library's range failed\n"); exit(2); }
    memcpy(p, code, sizeof code);
    gadget = (gadget_fn)p;
}

/* A raw result as the errno's name, or "ok". */
static const char *e(long r) { return r >= 0 ? "ok" : strerrorname_np((int)-r); }

#endif
