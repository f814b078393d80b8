//! Read-only lookups done by the library itself, with no round trip (004 §4.3–4.4:
//! calls that need no server never leave the program).
//!
//! When the policy's view confines nothing a read-only lookup could reveal — no
//! `hide`, no bind mount, no other root; `ro` lines restrict only writes — the server
//! says so on the generation page ([`GEN_FLAG_NATIVE_LOOKUPS`]) and the session's
//! filter allows, from the library's code only, `openat` without a write, create,
//! truncate or `O_TMPFILE` flag, `newfstatat`, `statx`, `faccessat2` without `W_OK`
//! (with it too where nothing is read-only: [`wire::GEN_FLAG_NATIVE_WRITE_ACCESS`]),
//! `readlinkat` and `getcwd`. The library then makes those calls itself, with the path it
//! copied, and answers from the kernel. Not a policy decision: a hostile program
//! that jumps to the library's `syscall` with arguments of its choosing gets what
//! this policy lets it see anyway, and a write, a create, a truncation, any other
//! view, any other call are still trapped from the library's code too.
//!
//! What stays served even then, for the program's own sake (what the server shows
//! differently from the kernel): anything with a `proc` component, a relative path
//! from a working directory or directory descriptor on a procfs, and a result that
//! turns out to be on a procfs or to be the loader (`/proc/self/exe` reached through
//! a link: the server names the program). A lookup that fails is answered by the
//! kernel's failure too, and asked of the server (which keeps and publishes it) only
//! when the same image meets it a second time: the failed-lookup cache (and the
//! session's shared table) only ever hold the server's answers, and a native answer
//! is never kept.
//!
//! Each native lookup is counted on the session's count page ([`COUNT_FD`]), so the
//! server's counts stay whole; without that page the library does none.

use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::sys::{self, syscall6};
use crate::sysno::{self as nr, errno};
use crate::wire::{
    self, COUNT_FD, COUNT_KINDS, COUNT_NATIVE_AT, COUNT_SIZE, NATIVE_ACCESS_WRITE_BIT, NATIVE_OPEN_WRITE_BITS,
};

const AT_FDCWD: i64 = -100;
const O_PATH_CLOEXEC: u64 = 0o10000000 | 0o2000000;
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYS_OPENAT: u32 = 257;
const SYS_NEWFSTATAT: u32 = 262;
const SYS_STATX: u32 = 332;
const SYS_FACCESSAT2: u32 = 439;
const SYS_READLINKAT: u32 = 267;
const SYS_FSTATFS: u32 = 138;
const SYS_GETCWD: u32 = 79;

static COUNTS: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());
/// What the kernel shows that the server shows differently, learned once per image:
/// bit 63 set when known; then the procfs's device and the loader's device and inode.
static KNOWN: AtomicU64 = AtomicU64::new(0);
static PROC_DEV: AtomicU64 = AtomicU64::new(0);
static LOADER_DEV: AtomicU64 = AtomicU64::new(0);
static LOADER_INO: AtomicU64 = AtomicU64::new(0);
/// Whether the working directory is on a procfs: `pid << 2 | 1` (no) or `| 2` (yes),
/// 0 when not known. Keyed by pid: a `vfork` child shares this memory, not the
/// working directory.
static CWD_ON_PROC: AtomicU64 = AtomicU64::new(0);

/// Map the count page (the loader, in each new image). Without it no lookup is
/// done natively.
pub fn map_counts() {
    let mut st = [0u64; 18];
    // SAFETY: a struct stat's 144 bytes (fstat(2)).
    let ok = unsafe { syscall6(sys::SYS_FSTAT, COUNT_FD as u64, st.as_mut_ptr() as u64, 0, 0, 0, 0) } == 0
        && st[6] >= COUNT_SIZE as u64;
    if !ok {
        return;
    }
    // SAFETY: a shared read-write mapping of the session's count memfd, whose size
    // the server sealed (mmap(2)).
    let p = unsafe { syscall6(sys::SYS_MMAP, 0, COUNT_SIZE as u64, 3, 0x01, COUNT_FD as u64, 0) };
    if p > 0 {
        COUNTS.store((p as usize + COUNT_NATIVE_AT) as *mut AtomicU64, Ordering::Release);
    }
}

/// The working directory changed (`chdir`, `fchdir`).
pub fn cwd_changed() {
    CWD_ON_PROC.store(0, Ordering::Release);
}

fn enabled() -> Option<*mut AtomicU64> {
    let c = COUNTS.load(Ordering::Acquire);
    (!c.is_null() && crate::cache::flags() & wire::GEN_FLAG_NATIVE_LOOKUPS != 0).then_some(c)
}

#[derive(Clone, Copy)]
enum Kind {
    Open = 0,
    Stat = 1,
    Statx = 2,
    Access = 3,
    Readlink = 4,
    Getcwd = 5,
}
const _: () = assert!(Kind::Getcwd as usize + 1 == COUNT_KINDS);

/// `st_dev` of a `struct stat` as (major, minor) folded into one word.
fn dev_of_stat(st_dev: u64) -> u64 {
    let major = ((st_dev >> 8) & 0xfff) | ((st_dev >> 32) & !0xfff);
    let minor = (st_dev & 0xff) | ((st_dev >> 12) & !0xff);
    (major << 32) | (minor & 0xffff_ffff)
}

fn stat_at(dirfd: i64, path: &[u8], flags: u64, st: &mut [u64; 18]) -> i64 {
    // SAFETY: a NUL-terminated path of ours and a struct stat's 144 bytes.
    unsafe { syscall6(SYS_NEWFSTATAT, dirfd as u64, path.as_ptr() as u64, st.as_mut_ptr() as u64, flags, 0, 0) }
}

/// Learn the procfs's device and the loader's identity (what `/proc/self/exe` is).
fn known() -> bool {
    if KNOWN.load(Ordering::Acquire) != 0 {
        return true;
    }
    let mut st = [0u64; 18];
    if stat_at(AT_FDCWD, c"/proc".to_bytes_with_nul(), 0, &mut st) != 0 {
        return false;
    }
    PROC_DEV.store(dev_of_stat(st[0]), Ordering::Relaxed);
    if stat_at(AT_FDCWD, c"/proc/self/exe".to_bytes_with_nul(), 0, &mut st) != 0 {
        return false;
    }
    LOADER_DEV.store(dev_of_stat(st[0]), Ordering::Relaxed);
    LOADER_INO.store(st[1], Ordering::Relaxed);
    KNOWN.store(1, Ordering::Release);
    true
}

/// Whether a looked-up object is one the server shows differently: on the procfs,
/// or the loader.
fn differs(dev: u64, ino: u64) -> bool {
    dev == PROC_DEV.load(Ordering::Relaxed)
        || (dev == LOADER_DEV.load(Ordering::Relaxed) && ino == LOADER_INO.load(Ordering::Relaxed))
}

/// Whether descriptor `fd` is on a procfs or is the loader (`None`: cannot tell).
fn fd_differs(fd: i64) -> Option<bool> {
    let mut st = [0u64; 18];
    // SAFETY: a struct stat's 144 bytes (fstat(2)).
    if unsafe { syscall6(sys::SYS_FSTAT, fd as u64, st.as_mut_ptr() as u64, 0, 0, 0, 0) } != 0 {
        return None;
    }
    let dev = dev_of_stat(st[0]);
    if differs(dev, st[1]) {
        return Some(true);
    }
    if dev >> 32 != 0 {
        // A block device's file system is no procfs.
        return Some(false);
    }
    // Another procfs mount (device major 0, like every file system without a block
    // device): fstatfs tells.
    let mut sf = [0i64; 15];
    // SAFETY: a struct statfs's 120 bytes (fstatfs(2)).
    if unsafe { syscall6(SYS_FSTATFS, fd as u64, sf.as_mut_ptr() as u64, 0, 0, 0, 0) } != 0 {
        return None;
    }
    Some(sf[0] == PROC_SUPER_MAGIC)
}

fn cwd_on_proc() -> Option<bool> {
    let pid = crate::state::answer(nr::GETPID) as u64;
    let w = CWD_ON_PROC.load(Ordering::Acquire);
    if w != 0 && w >> 2 == pid {
        return Some(w & 2 != 0);
    }
    // SAFETY: an O_PATH open of ".", closed below (open(2)).
    let fd = unsafe { syscall6(SYS_OPENAT, AT_FDCWD as u64, c".".as_ptr() as u64, O_PATH_CLOEXEC, 0, 0, 0) };
    if fd < 0 {
        return None;
    }
    let on = fd_differs(fd);
    sys::close(fd as i32);
    let on = on?;
    CWD_ON_PROC.store(pid << 2 | if on { 2 } else { 1 }, Ordering::Release);
    Some(on)
}

/// A lookup the server would answer as the kernel does, done here: `Some(result)`,
/// or `None` to serve it. `path_nul` is the library's copy of the path argument
/// (`a[1]`), with its NUL (the request's own copy: the path is copied from the
/// program once per call).
///
/// # Safety
/// `a` are the program's arguments to `n` (normalized to the `*at` form).
#[inline(never)]
pub unsafe fn try_native(n: u32, a: [u64; 6], path_nul: &[u8]) -> Option<i64> {
    let counts = enabled()?;
    if n == nr::GETCWD {
        // The view's root is the host's: the kernel's answer is the view's.
        // SAFETY: the program's buffer and size, which the kernel checks.
        let r = unsafe { syscall6(SYS_GETCWD, a[0], a[1], 0, 0, 0, 0) };
        // SAFETY: the count page is mapped for the life of the image.
        unsafe { (*counts.add(Kind::Getcwd as usize)).fetch_add(1, Ordering::Relaxed) };
        return Some(r);
    }
    let kind = match n {
        nr::OPENAT if a[2] & NATIVE_OPEN_WRITE_BITS == 0 => Kind::Open,
        nr::NEWFSTATAT => Kind::Stat,
        nr::STATX => Kind::Statx,
        nr::FACCESSAT2
            if a[2] & NATIVE_ACCESS_WRITE_BIT == 0
                || crate::cache::flags() & wire::GEN_FLAG_NATIVE_WRITE_ACCESS != 0 =>
        {
            Kind::Access
        }
        nr::READLINKAT if a[3] as i32 > 0 => Kind::Readlink,
        _ => return None,
    };
    let (&0, path) = path_nul.split_last()? else { return None };
    if path.split(|&b| b == b'/').any(|c| c == b"proc") || !known() {
        return None;
    }
    let dirfd = a[0] as i32 as i64;
    let absolute = path.first() == Some(&b'/');
    // A "not a link" answer is kept as the server's is, under the generation and
    // the unlink count read before the call (every rename, link, symlink, unlink
    // and rmdir is served and bumps them): the kernel's answer here is the one the
    // server would have given.
    let not_link = match kind {
        Kind::Readlink if absolute || dirfd == AT_FDCWD => {
            crate::cache::key(path, false).zip(crate::cache::not_link_generation())
        }
        _ => None,
    };
    if !absolute {
        let on_proc = if dirfd == AT_FDCWD { cwd_on_proc() } else { fd_differs(dirfd) };
        if on_proc != Some(false) {
            return None;
        }
    }
    let p = path_nul.as_ptr() as u64;
    let d = dirfd as u64;
    // SAFETY: our copy of the path, our buffers, the program's other arguments; the
    // filter lets exactly these read-only forms through from the library's code.
    let r = unsafe {
        match kind {
            Kind::Open => {
                let fd = syscall6(SYS_OPENAT, d, p, a[2], a[3], 0, 0);
                if fd >= 0 && fd_differs(fd) != Some(false) {
                    sys::close(fd as i32);
                    return None;
                }
                fd
            }
            // The kernel fills the program's buffer (EFAULT if it cannot), then the
            // device and inode are read back from it: memory the kernel just wrote
            // (another thread of the program may unmap it meanwhile: its own doing,
            // as under the kernel's copy). If the server must answer, its answer
            // overwrites the buffer.
            Kind::Stat => {
                let r = syscall6(SYS_NEWFSTATAT, d, p, a[2], a[3], 0, 0);
                if r == 0 {
                    let st = a[2] as *const u64;
                    let (dev, ino) = (core::ptr::read_unaligned(st), core::ptr::read_unaligned(st.add(1)));
                    if differs(dev_of_stat(dev), ino) {
                        return None;
                    }
                }
                r
            }
            Kind::Statx => {
                let r = syscall6(SYS_STATX, d, p, a[2], a[3], a[4], 0);
                if r == 0 {
                    // stx_ino at 32; stx_dev_major, stx_dev_minor (u32s) at 136, 140.
                    let stx = a[4] as *const u8;
                    let ino = core::ptr::read_unaligned(stx.add(32) as *const u64);
                    let major = core::ptr::read_unaligned(stx.add(136) as *const u32) as u64;
                    let minor = core::ptr::read_unaligned(stx.add(140) as *const u32) as u64;
                    if differs((major << 32) | minor, ino) {
                        return None;
                    }
                }
                r
            }
            Kind::Access => syscall6(SYS_FACCESSAT2, d, p, a[2], a[3], 0, 0),
            Kind::Getcwd => return None,
            Kind::Readlink => {
                let mut t = MaybeUninit::<[u8; wire::PATH_MAX + 1]>::uninit();
                let r = syscall6(SYS_READLINKAT, d, p, t.as_mut_ptr() as u64, (wire::PATH_MAX + 1) as u64, 0, 0);
                if r >= 0 {
                    // The kernel wrote the r bytes of the link's target (readlink(2)).
                    let t = core::slice::from_raw_parts(t.as_ptr() as *const u8, r as usize);
                    // A link read through a link to /proc names what the kernel sees
                    // (the loader for .../exe): the server's answer is the program's.
                    if loader_named(t) {
                        return None;
                    }
                    let k = (r as usize).min(a[3] as i32 as usize);
                    if sys::write_own(a[2], &t[..k]) != k as i64 {
                        return Some(-(errno::EFAULT as i64));
                    }
                    k as i64
                } else {
                    r
                }
            }
        }
    };
    if let (Some((key, generation)), true) = (not_link, r == -(errno::EINVAL as i64)) {
        crate::cache::remember_missing(crate::cache::not_link(key), generation);
    }
    // A failure is the kernel's answer too: it is not kept here (only the server's
    // failures are, since it knows whether the walk went through a link). Asked
    // again of the server to be kept only when this image meets it a second time:
    // asking cost a round trip and a walk with a watch per component for each
    // missing name (179 of a compile round's 242 served requests, nearly all asked
    // once per image), to spare later lookups a failing one of ~1 µs each.
    if r == -(errno::ENOENT as i64) && (absolute || dirfd == AT_FDCWD) {
        let once = crate::handler::cached_lookup(n, a)
            .and_then(|(_, _, follow)| crate::cache::key(path, follow))
            .zip(crate::cache::generation_for(path));
        if let Some((key, generation)) = once {
            let mark = crate::cache::failed_once(key);
            if crate::cache::known_missing(mark, generation) {
                return None;
            }
            crate::cache::remember_missing(mark, generation);
        }
    }
    // SAFETY: the count page is mapped for the life of the image; kind < COUNT_KINDS.
    unsafe { (*counts.add(kind as usize)).fetch_add(1, Ordering::Relaxed) };
    Some(r)
}

/// Whether `target` is the loader's own path (`/proc/self/exe` as the kernel has it).
fn loader_named(target: &[u8]) -> bool {
    if target.first() != Some(&b'/') || target.len() >= wire::PATH_MAX {
        return false;
    }
    let mut c = [0u8; wire::PATH_MAX + 1];
    c[..target.len()].copy_from_slice(target);
    let mut st = [0u64; 18];
    stat_at(AT_FDCWD, &c, 0, &mut st) == 0
        && dev_of_stat(st[0]) == LOADER_DEV.load(Ordering::Relaxed)
        && st[1] == LOADER_INO.load(Ordering::Relaxed)
}
