//! Raw system calls. Every `syscall` instruction of the library is in this image,
//! which is linked at [`crate::wire::LIB_LO`]: the seccomp filter recognises these
//! call sites by address and lets through the few calls only the library makes
//! (`Class::Library` and the library's side of the argument checks).

use core::arch::asm;

/// `syscall(nr, a0..a5)`: the raw result (`-errno` on failure).
///
/// # Safety
/// The call must be sound for its arguments (pointers valid for what the kernel does
/// with them), as for any system call.
#[inline(always)]
pub unsafe fn syscall6(nr: u32, a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64 {
    let ret: i64;
    // SAFETY: the x86_64 Linux system-call convention (syscall(2)): number in rax,
    // arguments in rdi rsi rdx r10 r8 r9, rcx and r11 clobbered; the caller vouches
    // for the arguments.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") nr as i64 => ret,
            in("rdi") a0, in("rsi") a1, in("rdx") a2, in("r10") a3, in("r8") a4, in("r9") a5,
            lateout("rcx") _, lateout("r11") _,
            options(nostack)
        );
    }
    ret
}

/// Shorthands with fewer arguments.
///
/// # Safety
/// As [`syscall6`].
#[inline(always)]
pub unsafe fn syscall3(nr: u32, a0: u64, a1: u64, a2: u64) -> i64 {
    // SAFETY: as the caller's.
    unsafe { syscall6(nr, a0, a1, a2, 0, 0, 0) }
}

pub const SYS_READ: u32 = 0;
pub const SYS_WRITE: u32 = 1;
pub const SYS_CLOSE: u32 = 3;
pub const SYS_FSTAT: u32 = 5;
pub const SYS_MMAP: u32 = 9;
pub const SYS_MPROTECT: u32 = 10;
pub const SYS_MUNMAP: u32 = 11;
pub const SYS_RT_SIGACTION: u32 = 13;
pub const SYS_RT_SIGPROCMASK: u32 = 14;
pub const SYS_PREAD64: u32 = 17;
pub const SYS_MADVISE: u32 = 28;
pub const SYS_DUP2: u32 = 33;
pub const SYS_GETPID: u32 = 39;
pub const SYS_POLL: u32 = 7;
pub const SYS_SENDTO: u32 = 44;
pub const SYS_SENDMSG: u32 = 46;
pub const SYS_RECVMSG: u32 = 47;
pub const SYS_SOCKETPAIR: u32 = 53;
pub const SYS_GETSOCKOPT: u32 = 55;
pub const SYS_FCNTL: u32 = 72;
pub const SYS_FCHDIR: u32 = 81;
pub const SYS_GETPPID: u32 = 110;
pub const SYS_PRCTL: u32 = 157;
pub const SYS_GETTID: u32 = 186;
pub const SYS_EXIT_GROUP: u32 = 231;
pub const SYS_TGKILL: u32 = 234;
pub const SYS_KCMP: u32 = 312;
pub const SYS_SECCOMP: u32 = 317;
pub const SYS_MEMBARRIER: u32 = 324;
pub const SYS_EXECVEAT: u32 = 322;
pub const SYS_CLOSE_RANGE: u32 = 436;

/// `getpid()`.
pub fn getpid() -> i32 {
    // SAFETY: no pointers.
    unsafe { syscall3(SYS_GETPID, 0, 0, 0) as i32 }
}

/// `gettid()`.
pub fn gettid() -> i32 {
    // SAFETY: no pointers.
    unsafe { syscall3(SYS_GETTID, 0, 0, 0) as i32 }
}

/// `close(fd)`.
pub fn close(fd: i32) -> i64 {
    // SAFETY: no pointers.
    unsafe { syscall3(SYS_CLOSE, fd as u64, 0, 0) }
}

/// `write(fd, buf)`, the whole buffer or an error.
pub fn write_all(fd: i32, mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: buf is a valid slice.
        let n = unsafe { syscall3(SYS_WRITE, fd as u64, buf.as_ptr() as u64, buf.len() as u64) };
        if n == -4 {
            continue;
        }
        if n <= 0 {
            return;
        }
        buf = &buf[n as usize..];
    }
}

/// Say something on standard error and end the whole process with `code`: for
/// failures the library cannot hand back to the program (the server is gone, the
/// loader cannot map the program).
pub fn fatal(what: &[&[u8]], code: i32) -> ! {
    write_all(2, b"ictus unix: ");
    for w in what {
        write_all(2, w);
    }
    write_all(2, b"\n");
    loop {
        // SAFETY: no pointers.
        unsafe { syscall3(SYS_EXIT_GROUP, code as u64, 0, 0) };
    }
}

/// A decimal rendering of `v` into `buf`, for messages.
pub fn decimal(v: i64, buf: &mut [u8; 24]) -> &[u8] {
    let neg = v < 0;
    let mut u = v.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if neg {
        i -= 1;
        buf[i] = b'-';
    }
    &buf[i..]
}

const SYS_PROCESS_VM_READV: u32 = 310;
const SYS_PROCESS_VM_WRITEV: u32 = 311;

/// Whether the page holding `addr` can be read: `rt_sigprocmask` with an invalid
/// `how` copies its 8-byte set from the program first (`EFAULT` if it cannot) and
/// then refuses the `how` (`EINVAL`) without changing anything — one system call,
/// where `process_vm_readv` costs several times more.
/// The probe is never at address 0 (a NULL set is no set: the kernel would read
/// nothing and answer success for page 0).
pub fn page_readable(addr: u64) -> bool {
    let at = match addr & !7 {
        0 => 8,
        a => a,
    };
    // SAFETY: the kernel reads 8 bytes at an aligned address inside addr's page and
    // checks them itself; no oldset.
    unsafe { syscall6(SYS_RT_SIGPROCMASK, 99, at, 0, 8, 0, 0) != -14 }
}

/// Copy a NUL-terminated string from this process's memory at `src` into `dst`, as
/// the kernel's `strncpy_from_user` would: its length, `-EFAULT` if memory before its
/// end cannot be read, `-ENAMETOOLONG` if it does not fit. Each page is checked with
/// [`page_readable`] before it is read directly.
pub fn copy_str(dst: &mut [u8], src: u64) -> Result<usize, i64> {
    // SAFETY: dst is valid for writing dst.len() bytes.
    unsafe { copy_str_raw(dst.as_mut_ptr(), dst.len(), src) }
}

/// [`copy_str`] into memory that need not be initialized (a path buffer on the stack
/// is 4 KiB: zeroing it cost more than the copy): the first `len` bytes of `dst` are
/// written, nothing after them (no NUL either).
///
/// # Safety
/// `dst` is valid for writing `cap` bytes.
pub unsafe fn copy_str_raw(dst: *mut u8, cap: usize, src: u64) -> Result<usize, i64> {
    let mut at = 0usize;
    let mut p = src;
    if p == 0 {
        return Err(-14);
    }
    loop {
        if !page_readable(p) {
            return Err(-14);
        }
        let page_end = (p | 4095).wrapping_add(1);
        while p != page_end {
            if at == cap {
                return Err(-36);
            }
            // SAFETY: p is in a page the kernel just found readable; the program may
            // unmap it meanwhile from another thread, as it may under the kernel's
            // own copy (a fault there is the program's doing).
            let b = unsafe { core::ptr::read_volatile(p as *const u8) };
            if b == 0 {
                return Ok(at);
            }
            // SAFETY: at < cap, inside the caller's buffer.
            unsafe { dst.add(at).write(b) };
            at += 1;
            p += 1;
        }
    }
}

/// Copy from this process's own memory at `src` into `dst`, as the kernel would
/// from a system call's pointer: the bytes up to the first unreadable page, or
/// `-EFAULT` (process_vm_readv(2) on ourselves; never a fault in the library).
pub fn read_own(dst: &mut [u8], src: u64) -> i64 {
    // SAFETY: dst is valid for writing dst.len() bytes.
    unsafe { read_own_raw(dst.as_mut_ptr(), dst.len(), src) }
}

/// [`read_own`] into memory that need not be initialized: the bytes read are written.
///
/// # Safety
/// `dst` is valid for writing `len` bytes.
pub unsafe fn read_own_raw(dst: *mut u8, len: usize, src: u64) -> i64 {
    let local = [dst as u64, len as u64];
    let remote = [src, len as u64];
    // SAFETY: both iovecs describe memory: ours writable, the program's only read by
    // the kernel, which checks it.
    unsafe { syscall6(SYS_PROCESS_VM_READV, own_pid(), local.as_ptr() as u64, 1, remote.as_ptr() as u64, 1, 0) }
}

/// Copy `src` into this process's memory at `dst`: the byte count or `-EFAULT`.
pub fn write_own(dst: u64, src: &[u8]) -> i64 {
    let local = [src.as_ptr() as u64, src.len() as u64];
    let remote = [dst, src.len() as u64];
    // SAFETY: as read_own; the kernel checks the program's pointer for writing.
    unsafe { syscall6(SYS_PROCESS_VM_WRITEV, own_pid(), local.as_ptr() as u64, 1, remote.as_ptr() as u64, 1, 0) }
}

/// This process's pid for [`read_own`] and [`write_own`]: the state page's word
/// when it holds one (no system call), else `getpid`. A program that scribbles on
/// the word names another process, which `process_vm_readv` lets it read only with
/// the ptrace access it has anyway.
fn own_pid() -> u64 {
    crate::state::answer(SYS_GETPID) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two pages, the second inaccessible (PROT_NONE, so that no other mapping can
    /// land there meanwhile); `s` is written to end at the first's end.
    fn at_page_end(s: &[u8]) -> (u64, u64) {
        // SAFETY: a fresh private anonymous mapping (mmap(2)), its second page made
        // inaccessible (mprotect(2)).
        let base = unsafe { syscall6(SYS_MMAP, 0, 8192, 3, 0x22, u64::MAX, 0) };
        assert!(base > 0);
        let base = base as u64;
        // SAFETY: as above.
        assert_eq!(unsafe { syscall6(SYS_MPROTECT, base + 4096, 4096, 0, 0, 0, 0) }, 0);
        let at = base + 4096 - s.len() as u64;
        // SAFETY: inside the first page, which is mapped writable.
        unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), at as *mut u8, s.len()) };
        (base, at)
    }

    #[test]
    fn strings_are_copied_as_the_kernel_would() {
        let mut dst = [0u8; 16];
        let s = b"/etc/passwd\0";
        assert_eq!(copy_str(&mut dst, s.as_ptr() as u64), Ok(11));
        assert_eq!(&dst[..11], b"/etc/passwd");
        // Too long for the room: ENAMETOOLONG, as the kernel's PATH_MAX check.
        assert_eq!(copy_str(&mut dst[..4], s.as_ptr() as u64), Err(-36));
        // NULL, the first bytes of page 0 (a probe there would be a NULL set) and the
        // kernel's half: EFAULT.
        for bad in [0u64, 1, 7, 4095, 0xffff_ffff_ff60_0000, u64::MAX - 3] {
            assert_eq!(copy_str(&mut dst, bad), Err(-14), "{bad:#x}");
        }
        // A string that ends exactly at its page's end is whole.
        let (base, at) = at_page_end(b"abc\0");
        assert_eq!(copy_str(&mut dst, at), Ok(3));
        // One whose NUL would be on the next, inaccessible, page: EFAULT, no fault here.
        let (base2, at2) = at_page_end(b"abcd");
        assert_eq!(copy_str(&mut dst, at2), Err(-14));
        for b in [base, base2] {
            // SAFETY: the mappings made above.
            unsafe { syscall6(SYS_MUNMAP, b, 8192, 0, 0, 0, 0) };
        }
    }
}
