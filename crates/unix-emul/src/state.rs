//! The process-state page (004 §4.3): what `getpid`, `getuid`, `geteuid`, `getgid` and
//! `getegid` answer, kept in the program so that these calls never leave it once
//! their call sites are patched ([`crate::patch`]).
//!
//! The page is the library's own, at [`STATE_ADDR`] in every process, filled from the
//! kernel on first use and **wiped by the kernel on `fork`** (`MADV_WIPEONFORK`), so a
//! fork child starts with nothing cached and asks the kernel once. Nothing on it is
//! policy: it caches what the kernel says, for the program's own use; a program that
//! scribbles on it can only lie to itself.
//!
//! The one case the wipe does not cover is a child that shares the parent's memory
//! (`vfork`, `clone` or `clone3` with `CLONE_VM` but not `CLONE_THREAD`): it would read
//! its parent's pid. Those calls go through the library, which counts the children
//! in flight in the high half of the pid word and clears the pid; the cached pid is
//! used only while the count is zero, and the parent takes the count back down when
//! its `vfork` returns. A `CLONE_VM` child without `CLONE_VFORK` may share the memory
//! for ever: its count is never taken back, and the pid is never cached again in
//! that memory.
//!
//! The uid and gid answers cannot change during a session: the server refuses every
//! identity change, and `no_new_privs` keeps set-id programs from granting one.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sys::{self, syscall6};
use crate::sysno as nr;
use crate::wire::STATE_ADDR;

/// The pid word: the pid in the low half (0: not known), the count of
/// memory-sharing children in flight in the high half.
pub const PID_WORD: u64 = STATE_ADDR;
/// `getuid() + 1` (0: not known); then euid, gid, egid, a word each.
pub const UID_WORD: u64 = STATE_ADDR + 8;

static MAPPED: AtomicBool = AtomicBool::new(false);

const MADV_WIPEONFORK: u64 = 18;

/// Map the page (the loader, in each new image). Without it nothing is cached.
pub fn map() {
    // SAFETY: an anonymous private page at a fixed address nobody else uses in this
    // fresh image (MAP_FIXED_NOREPLACE fails rather than replace), then an advice on
    // it (mmap(2), madvise(2)).
    unsafe {
        let p = syscall6(sys::SYS_MMAP, STATE_ADDR, 4096, 3, 0x22 | 0x10_0000, u64::MAX, 0);
        if p as u64 != STATE_ADDR {
            return;
        }
        if syscall6(sys::SYS_MADVISE, STATE_ADDR, 4096, MADV_WIPEONFORK, 0, 0, 0) != 0 {
            syscall6(sys::SYS_MUNMAP, STATE_ADDR, 4096, 0, 0, 0, 0);
            return;
        }
    }
    MAPPED.store(true, Ordering::Release);
}

/// Whether the page is there (the patched fast paths read it unconditionally).
pub fn mapped() -> bool {
    MAPPED.load(Ordering::Acquire)
}

fn word(at: u64) -> Option<&'static AtomicU64> {
    // SAFETY: a page mapped for the life of the image, aligned words.
    mapped().then(|| unsafe { &*(at as *const AtomicU64) })
}

/// The word that caches `nr`'s answer, for the uid and gid calls.
pub fn field(n: u32) -> Option<u64> {
    let i = match n {
        nr::GETUID => 0,
        nr::GETEUID => 1,
        nr::GETGID => 2,
        nr::GETEGID => 3,
        _ => return None,
    };
    Some(UID_WORD + 8 * i)
}

/// Whether `n` is answered from the page.
pub fn is_state_call(n: u32) -> bool {
    n == nr::GETPID || field(n).is_some()
}

/// Answer a state call: from the page, or from the kernel (and remember it).
pub fn answer(n: u32) -> i64 {
    // SAFETY: the calls of this module take no arguments.
    let ask = || unsafe { syscall6(n, 0, 0, 0, 0, 0, 0) };
    if n == nr::GETPID {
        let Some(w) = word(PID_WORD) else { return ask() };
        let cur = w.load(Ordering::Acquire);
        if cur as u32 != 0 {
            return cur as u32 as i64;
        }
        let pid = ask();
        // Only with no memory-sharing child in flight (the whole word zero): a child
        // that appeared since makes the exchange fail.
        if cur == 0 && pid > 0 {
            let _ = w.compare_exchange(0, pid as u64, Ordering::AcqRel, Ordering::Relaxed);
        }
        return pid;
    }
    let Some(w) = field(n).and_then(word) else { return ask() };
    let v = w.load(Ordering::Acquire);
    if v != 0 {
        return (v - 1) as i64;
    }
    let r = ask();
    if r >= 0 {
        w.store(r as u64 + 1, Ordering::Release);
    }
    r
}

/// A child that shares this memory is about to be made: stop answering the pid from
/// the page until [`shared_child_done`].
pub fn shared_child_begin() {
    let Some(w) = word(PID_WORD) else { return };
    let mut cur = w.load(Ordering::Acquire);
    loop {
        let new = ((cur >> 32) + 1) << 32;
        match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(c) => cur = c,
        }
    }
}

/// The parent of a `vfork`-like child is running again (the child has exec'd or
/// exited).
pub fn shared_child_done() {
    if let Some(w) = word(PID_WORD) {
        w.fetch_sub(1 << 32, Ordering::AcqRel);
    }
}
