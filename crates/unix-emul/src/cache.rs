//! The cache of failed path lookups (004 §4.3's shared state, for the case a compile
//! hits thousands of times: a header that is not in this directory of the search
//! path). A lookup the server answered `ENOENT` is remembered under the session's
//! namespace *generation*, a counter the server bumps whenever a name may have
//! appeared (a create, mkdir, rename, link, symlink, bind; and every second, for names
//! made outside the session) on a page every process maps read-only
//! ([`GEN_FD`](crate::wire::GEN_FD)); a later lookup of the same path under the same
//! generation fails in the library without a trap's round trip to the server.
//!
//! Relative paths are keyed with the working directory's identity (device and inode,
//! [`cwd_id`]) where the library may do lookups itself, so the server publishes them
//! to the session's other processes in that directory too (`gcc -Id0` looks for
//! every header in `d0/` first, in every compile); elsewhere with the process's own
//! working-directory count, bumped here whenever the process changes directory
//! (`chdir` through the server, `fchdir`, which the filter sends here). Paths under
//! `/proc` and `/dev` are never cached.
//!
//! The same table keeps `readlink`'s "not a link" (`EINVAL`) answers, under
//! [`not_link`] of the path's key: glibc's `realpath` reads every component of a
//! path as a link, and gcc's `cc1` does it a thousand times per compile for a few
//! dozen directories. A path that is not a link can become one, or disappear, only
//! by a rename, a link, a symlink, an unlink or a rmdir, after each of which the
//! server bumps the generation (and every second, for changes made outside).
//!
//! **What invalidates what.** A failed lookup of a path is kept under the generation
//! *and* the sum of the name buckets of its components (counters on the memfd after
//! the page, [`GEN_BUCKETS_AT`]): where the view is the host's tree, the server bumps
//! only the bucket of a new file's name when it creates one (`O_CREAT`; through a
//! final link, the real name's too), not the generation — a file create can only make
//! lookups succeed (or fail otherwise) whose path has a component of that name. It
//! tells the library not to keep a failure whose walk went through a symbolic link
//! (the link's target is not among the path's names). Unlinks never make a lookup
//! succeed: they bump only the unlink count ([`GEN_UNLINKS_AT`]), which the "not a
//! link" answers are kept under. A mkdir, mknod, rename, link or symlink bumps the
//! buckets of the names it makes (and the unlink count); everything else (rmdir,
//! bind, the tick; every change in a confining view) bumps the generation.
//! So a compile's temporary files no longer empty every cache of the session.
//!
//! The cache is the library's, in the program's memory: a program that corrupts it
//! makes only its own lookups fail.

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::sys::{self, syscall6};
use crate::wire::{
    GEN_BUCKETS, GEN_BUCKETS_AT, GEN_FD, GEN_MISSING_AT, GEN_MISSING_SLOTS, GEN_MISSING_WAYS, GEN_SIZE, GEN_UNLINKS_AT,
};

const ENTRIES: usize = 1024;

struct Entry {
    key: AtomicU64,
    generation: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry { key: AtomicU64::new(0), generation: AtomicU64::new(u64::MAX) };
static TABLE: [Entry; ENTRIES] = [EMPTY; ENTRIES];
static PAGE: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());
/// The name buckets, if the memfd has them.
static BUCKETS: AtomicPtr<AtomicU32> = AtomicPtr::new(core::ptr::null_mut());
/// The server's shared table of failed lookups, with the buckets.
static SHARED: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());
static CWD: AtomicU64 = AtomicU64::new(0);

/// Map the generation page (the loader, in each new image). Without it the cache
/// stays off.
pub fn map_generation() {
    // The buckets only if the memfd has room for them (mapping past its end would
    // fault on access); its size is sealed. Without them nothing is cached (the
    // page's refusals still apply).
    let mut st = [0u64; 18];
    // SAFETY: a struct stat's 144 bytes (fstat(2)).
    let ok = unsafe { syscall6(sys::SYS_FSTAT, GEN_FD as u64, st.as_mut_ptr() as u64, 0, 0, 0, 0) } == 0
        && st[6] >= GEN_SIZE as u64;
    let len = if ok { GEN_SIZE } else { 4096 };
    // SAFETY: a read-only shared mapping of the memfd the server sealed (mmap(2)).
    let p = unsafe { syscall6(sys::SYS_MMAP, 0, len as u64, 1, 0x01, GEN_FD as u64, 0) };
    if p > 0 {
        if ok {
            BUCKETS.store((p as usize + GEN_BUCKETS_AT) as *mut AtomicU32, Ordering::Release);
            SHARED.store((p as usize + GEN_MISSING_AT) as *mut AtomicU64, Ordering::Release);
        }
        PAGE.store(p as *mut AtomicU64, Ordering::Release);
    }
}

/// The name bucket of one path component.
pub fn bucket_of(name: &[u8]) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for &b in name {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h as usize % GEN_BUCKETS
}

/// The sum of the buckets of `path`'s components, read through `bucket`.
pub fn bucket_sum(path: &[u8], bucket: impl Fn(usize) -> u32) -> u32 {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b"." && *c != b"..")
        .fold(0u32, |s, c| s.wrapping_add(bucket(bucket_of(c))))
}

/// What a failed lookup of `path` is kept under: the generation and the sum of its
/// names' buckets, read before asking. `None` without the page.
pub fn generation_for(path: &[u8]) -> Option<u64> {
    let g = generation()?;
    let b = BUCKETS.load(Ordering::Acquire);
    if b.is_null() {
        return None;
    }
    // SAFETY: the buckets are mapped read-only for the life of the image, inside the
    // memfd (its size checked when mapped); bucket_of is below GEN_BUCKETS.
    let sum = bucket_sum(path, |i| unsafe { (*b.add(i)).load(Ordering::Acquire) });
    Some((g << 32) | sum as u64)
}

/// What a "not a link" answer is kept under: the generation and the unlink count.
pub fn not_link_generation() -> Option<u64> {
    let p = PAGE.load(Ordering::Acquire);
    let g = generation()?;
    // SAFETY: the page is mapped for the life of the image; an aligned u64 inside it.
    let u = unsafe { (*p.add(GEN_UNLINKS_AT / 8)).load(Ordering::Acquire) };
    Some((g << 32) | (u & 0xffff_ffff))
}

/// The namespace generation now, if the page is mapped.
pub fn generation() -> Option<u64> {
    let p = PAGE.load(Ordering::Acquire);
    // SAFETY: a page mapped read-only for the life of the image; the counter is an
    // aligned u64 at its start.
    (!p.is_null()).then(|| unsafe { (*p).load(Ordering::Acquire) })
}

/// The session's flags on the page ([`crate::wire::GEN_FLAGS_AT`]); 0 without it.
pub fn flags() -> u64 {
    let p = PAGE.load(Ordering::Acquire);
    if p.is_null() {
        return 0;
    }
    // SAFETY: the page is mapped read-only for the life of the image; an aligned u64
    // inside it (checked in wire).
    unsafe { (*p.add(crate::wire::GEN_FLAGS_AT / 8)).load(Ordering::Acquire) }
}

/// Whether the policy refuses call `n` (the server's bitmap on the page).
pub fn refused(n: u32) -> bool {
    let p = PAGE.load(Ordering::Acquire);
    if p.is_null() || n >= crate::sysno::MAX_KNOWN {
        return false;
    }
    // SAFETY: the page is mapped read-only for the life of the image; the bitmap is
    // inside it (checked in wire).
    let byte = unsafe { core::ptr::read_volatile((p as *const u8).add(crate::wire::GEN_REFUSED_AT + n as usize / 8)) };
    byte & (1 << (n % 8)) != 0
}

/// The working directory's generation (sent with every request, see
/// [`crate::wire::RequestHeader::cwd`]).
pub fn cwd_generation() -> u64 {
    CWD.load(Ordering::Acquire)
}

/// The working directory changed: relative entries no longer apply.
pub fn cwd_changed() {
    CWD.fetch_add(1, Ordering::AcqRel);
    crate::lookup::cwd_changed();
}

/// The key of a lookup, or `None` if it must not be cached.
pub fn key(path: &[u8], follow: bool) -> Option<u64> {
    key_in(path, follow, if path.first() == Some(&b'/') { None } else { cwd_identity() })
}

/// The key of a lookup of `path`; a relative one is keyed with `cwd`, the working
/// directory's [`cwd_id`] if known, else with this process's working directory
/// count (then it is this process's alone). The server keys the failures it
/// publishes with the `cwd` it finds, so a relative header path that one compile
/// found missing (`-Id0` then `d0/stdio.h`) costs the next one no round trip.
pub fn key_in(path: &[u8], follow: bool, cwd: Option<u64>) -> Option<u64> {
    if path.is_empty() || path.starts_with(b"/proc") || path.starts_with(b"/dev") {
        return None;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |b: u8| h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    for &b in path {
        mix(b);
    }
    mix(follow as u8);
    if path[0] != b'/' {
        match cwd {
            Some(id) => {
                for b in id.to_le_bytes() {
                    mix(b);
                }
                mix(0xfd);
            }
            None => {
                for b in CWD.load(Ordering::Acquire).to_le_bytes() {
                    mix(b);
                }
                mix(0xfe);
            }
        }
    }
    Some(h | 1)
}

/// A directory's identity for keys (its device and inode, hashed to
/// [`CWD_ID_BITS`] bits): a relative lookup's answer depends on the directory,
/// not on its path. (A directory removed and another made with its inode number:
/// the server bumps the generation when a watched directory goes.)
pub fn cwd_id(dev: u64, ino: u64) -> u64 {
    let h = (dev.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ino).wrapping_mul(0xff51_afd7_ed55_8ccd);
    (h >> (64 - CWD_ID_BITS)) | 1
}

/// Bits of a [`cwd_id`]; the rest of [`CWD_ID`]'s word holds the low bits of the
/// working directory count it was read at.
const CWD_ID_BITS: u32 = 40;

/// The working directory's [`cwd_id`] and the working directory count it was read
/// at (one word, so that no reader pairs one directory's id with another's count).
static CWD_ID: AtomicU64 = AtomicU64::new(0);

/// The working directory's [`cwd_id`], read once per working directory with a
/// `stat(".")` of the library's own — only where the session lets the library do
/// read-only lookups itself ([`crate::wire::GEN_FLAG_NATIVE_LOOKUPS`]); else
/// `None` (relative failures stay this process's).
fn cwd_identity() -> Option<u64> {
    if flags() & crate::wire::GEN_FLAG_NATIVE_LOOKUPS == 0 {
        return None;
    }
    let count = CWD.load(Ordering::Acquire) & ((1 << (64 - CWD_ID_BITS)) - 1);
    let v = CWD_ID.load(Ordering::Acquire);
    if v != 0 && v >> CWD_ID_BITS == count {
        return Some(v & ((1 << CWD_ID_BITS) - 1));
    }
    let mut st = [0u64; 18];
    const AT_FDCWD: i64 = -100;
    const SYS_NEWFSTATAT: u32 = 262;
    // SAFETY: a NUL-terminated path and a struct stat's 144 bytes (fstatat(2)).
    let r = unsafe { syscall6(SYS_NEWFSTATAT, AT_FDCWD as u64, c".".as_ptr() as u64, st.as_mut_ptr() as u64, 0, 0, 0) };
    if r != 0 {
        return None;
    }
    let id = cwd_id(st[0], st[1]);
    // Only if the working directory did not change meanwhile (else the next lookup
    // reads it again).
    if CWD.load(Ordering::Acquire) & ((1 << (64 - CWD_ID_BITS)) - 1) == count {
        CWD_ID.store(count << CWD_ID_BITS | id, Ordering::Release);
    }
    Some(id)
}

/// Spread a key over `bits` bits (Fibonacci hashing: the high bits of a multiply).
/// The keys of one path looked up with and without following (`readlink` and
/// `open` of the same header, as cc1 does for each) differ by a multiple of FNV's
/// prime, 2^40 + 435: plain shifts of the key put both in one slot most of the
/// time, where each pushed the other out and every compile asked again.
fn spread(key: u64, bits: u32) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
}

fn slot(key: u64) -> &'static Entry {
    const _: () = assert!(ENTRIES.is_power_of_two());
    &TABLE[spread(key, ENTRIES.trailing_zeros())]
}

/// Whether `key` is known to be missing under `generation`: in this process's table,
/// or in the server's shared one.
pub fn known_missing(key: u64, generation: u64) -> bool {
    let e = slot(key);
    if e.key.load(Ordering::Acquire) == key && e.generation.load(Ordering::Acquire) == generation {
        return true;
    }
    let t = SHARED.load(Ordering::Acquire);
    if t.is_null() {
        return false;
    }
    (shared_set(key)..shared_set(key) + GEN_MISSING_WAYS).any(|i| {
        // SAFETY: the table is mapped read-only for the life of the image, inside the
        // memfd (its size checked when mapped); entries are aligned word pairs, and a
        // set's entries are below GEN_MISSING_SLOTS.
        let (k, g) = unsafe { (&*t.add(2 * i), &*t.add(2 * i + 1)) };
        // The server writes generation = MAX, then the key, then the generation (one
        // writer at a time): a key read between two equal generations is theirs.
        let g1 = g.load(Ordering::Acquire);
        let k1 = k.load(Ordering::Acquire);
        let g2 = g.load(Ordering::Acquire);
        k1 == key && g1 == generation && g2 == generation
    })
}

/// The first entry of `key`'s set in the shared table (its
/// [`GEN_MISSING_WAYS`] entries follow).
pub fn shared_set(key: u64) -> usize {
    const SETS: usize = GEN_MISSING_SLOTS / GEN_MISSING_WAYS;
    const _: () = assert!(SETS.is_power_of_two());
    spread(key ^ 0x5348_4152_4544, SETS.trailing_zeros()) * GEN_MISSING_WAYS
}

/// The key under which a path's "not a link" answer (`readlink`'s `EINVAL`) is kept,
/// derived from its lookup key (`follow` false).
pub fn not_link(key: u64) -> u64 {
    (key ^ 0x6e6f_745f_6c69_6e6b).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// The key under which this image marks a path that failed once natively (the
/// next failure of it in the image is asked of the server, to be kept), derived
/// from its lookup key. Only ever decides whether to ask: it answers nothing.
pub fn failed_once(key: u64) -> u64 {
    (key ^ 0x6f6e_6365_5f66_6169).wrapping_mul(0xc2b2_ae3d_27d4_eb4f) | 1
}

/// Remember that `key` was missing under `generation` (read before asking).
pub fn remember_missing(key: u64, generation: u64) {
    let e = slot(key);
    // Invalidate first, so a reader never pairs the new key with an old generation.
    e.generation.store(u64::MAX, Ordering::Release);
    e.key.store(key, Ordering::Release);
    e.generation.store(generation, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_link_answers_are_kept_apart_from_missing_ones() {
        let k = key(b"/usr/include", false).unwrap();
        assert_ne!(not_link(k), k);
        assert_eq!(not_link(k) & 1, 1);
        remember_missing(not_link(k), 7);
        assert!(known_missing(not_link(k), 7));
        assert!(!known_missing(not_link(k), 8), "a new generation forgets it");
        assert!(!known_missing(k, 7), "not a link is not missing");
        assert_ne!(key(b"/usr/include", true), Some(k));
        assert_eq!(key(b"/proc/self/exe", false), None);
    }

    #[test]
    fn a_paths_lookups_with_and_without_following_do_not_share_a_slot() {
        // cc1 reads every header candidate as a link, then opens it: both failures
        // must stay in the tables together.
        let (mut shared, mut local) = (0, 0);
        for i in 0..1000 {
            let p = format!("/usr/local/include/h{i}.h");
            let (a, b) = (key(p.as_bytes(), true).unwrap(), key(p.as_bytes(), false).unwrap());
            shared += (shared_set(a) == shared_set(b)) as u32;
            local += core::ptr::eq(slot(a), slot(b)) as u32;
        }
        // By chance: about 1000/1024 each.
        assert!(shared < 10 && local < 10, "{shared} {local} of 1000 share a slot");
    }
}
