//! Kept failures invalidated by namespace changes, not by time.
//!
//! The libraries keep a failed lookup (`ENOENT`) under the session's generation and
//! the buckets of its path's names (see `ictus_unix_emul::cache`); the server bumps
//! them for every change it makes. Changes made *outside* the session (another
//! program, a build tool running beside it) used to be caught by a timer that
//! dropped every kept failure once a second — on a loaded machine a compile
//! re-asked ~300 of them per second. Now, where the view is the host's tree, a
//! failure is kept only after the server has walked its path as the kernel does,
//! **watching every directory the walk reads before reading it** (inotify), so that
//! any later change there reaches the generation page:
//!
//! - a name made in a watched directory (`IN_CREATE`, `IN_MOVED_TO`) bumps that
//!   name's bucket, as a create by the server does: failures of paths with a
//!   component of that name go;
//! - a watched directory's own attributes changing (search permission) bumps the
//!   generation; a child directory's, its name's bucket;
//! - a lost queue (`IN_Q_OVERFLOW`) or an unmount bumps the generation.
//!
//! **Links.** A walk through a symbolic link depends on the names in the link's
//! target too, which are not in the path the libraries key it with. The walk marks
//! their buckets on the page ([`GenerationPage::mark_link_name`]); making a name of
//! a marked bucket anywhere then drops every kept failure. So `/lib/…` on a merged
//! `/usr` is kept like any other failure (it used to be asked again every time).
//!
//! **Order.** A directory is watched before the walk looks into it, and the
//! libraries read the generation before asking: a name made after the watch
//! reaches the page after, and the failure kept under the older generation is
//! stale; a name made before it is found by the walk, and nothing is kept. Events
//! are read by a worker of the server as they arrive (the inotify descriptor is in
//! its epoll), so a change made outside is seen by the session's caches once that
//! worker has run — no longer up to a second later. Mounts and unmounts anywhere
//! (`/proc/self/mountinfo` polled by the server) drop every kept failure.
//!
//! Watches are kept on inodes for the server's life (the kernel merges repeated
//! watches of one directory); the set of directories known to be watched, by path,
//! is emptied on every change that could move a directory, so a path names the
//! directory watched under it. If the kernel refuses a watch (the user's limit),
//! the failure is not kept.

use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use crate::sys::{self, GenerationPage};

const PROC_SUPER_MAGIC: i64 = 0x9fa0;
/// Links followed in one walk before giving up (the kernel's `ELOOP` limit).
const MAX_LINKS: usize = 40;

/// What a watched directory reports.
const MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// The watch of one generation page.
#[derive(Debug)]
pub struct Watch {
    fd: OwnedFd,
    /// Absolute directories watched since the last change that could move one, and
    /// how many times the set was emptied (a walk that began before it was emptied
    /// adds nothing: the directory it opened may no longer be the one at its path).
    known: Mutex<(u64, HashSet<Vec<u8>>)>,
}

impl Watch {
    /// A new inotify instance.
    pub fn new() -> Result<Watch, i32> {
        Ok(Watch { fd: sys::inotify()?, known: Mutex::new((0, HashSet::new())) })
    }

    /// Hand this instance's last close to a detached process ([`sys::keep_until_dropped`]):
    /// drop the returned descriptor after the watch is dropped, and the close's wait
    /// for the kernel happens there.
    pub fn release_elsewhere(&self) -> Option<OwnedFd> {
        sys::keep_until_dropped(self.fd.as_fd())
    }

    /// The inotify descriptor (in the server's epoll).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Watch `dir`, found at `path` by a walk that began when the set had been
    /// emptied `epoch` times.
    fn watch(&self, dir: BorrowedFd<'_>, path: Option<&[u8]>, epoch: u64) -> bool {
        if let Some(p) = path {
            if self.known.lock().unwrap_or_else(|e| e.into_inner()).1.contains(p) {
                return true;
            }
        }
        if sys::inotify_watch(self.fd.as_fd(), dir, MASK).is_err() {
            return false;
        }
        if let Some(p) = path {
            let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            if known.0 == epoch {
                known.1.insert(p.to_vec());
            }
        }
        true
    }

    fn epoch(&self) -> u64 {
        self.known.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Forget which paths name watched directories (a mount moved them all).
    pub fn forget_paths(&self) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.0 += 1;
        known.1.clear();
    }

    /// Walk `path` — absolute, or relative to `dir` — as the kernel would, following
    /// a final link if `follow`, watching every directory before looking into it.
    /// Whether the walk ends at a missing name: then the failure may be kept, and
    /// `page` hears of every change that could end it. Anything else (the path
    /// exists now, a component is no directory, `/proc` or `/dev`, too many links,
    /// a watch refused) keeps nothing.
    pub fn failure_walk(&self, page: &GenerationPage, dir: Option<BorrowedFd<'_>>, path: &[u8], follow: bool) -> bool {
        let dir_flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64;
        let open = |at: Option<BorrowedFd<'_>>, name: &[u8]| -> Option<OwnedFd> {
            let c = CString::new(name).ok()?;
            sys::openat2(at, &c, dir_flags, 0, 0).ok()
        };
        let root = || open(None, b"/");
        page.counts().walks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let epoch = self.epoch();
        let absolute = path.first() == Some(&b'/');
        let (mut cur, mut at) = match (absolute, dir) {
            (true, _) => match root() {
                Some(r) => (r, Some(b"/".to_vec())),
                None => return false,
            },
            (false, Some(d)) => match open(Some(d), b".") {
                // A working directory on a procfs answers per process.
                Some(c) if sys::fs_type(c.as_fd()) != Ok(PROC_SUPER_MAGIC) => (c, None),
                _ => return false,
            },
            // Relative to the server's own directory: not the program's.
            (false, None) => return false,
        };
        if !self.watch(cur.as_fd(), at.as_deref(), epoch) {
            return false;
        }
        let mut todo: Vec<Vec<u8>> = components(path).rev().map(<[u8]>::to_vec).collect();
        let mut links = 0;
        while let Some(name) = todo.pop() {
            if name == b"proc" || name == b"dev" {
                return false;
            }
            if name == b".." {
                let Some(up) = open(Some(cur.as_fd()), b"..") else { return false };
                cur = up;
                if let Some(p) = at.as_mut() {
                    let cut = p.iter().rposition(|&b| b == b'/').unwrap_or(0);
                    p.truncate(cut.max(1));
                }
                if !self.watch(cur.as_fd(), at.as_deref(), epoch) {
                    return false;
                }
                continue;
            }
            let Ok(c) = CString::new(name.as_slice()) else { return false };
            let kind = match sys::lstat_type_at(cur.as_fd(), &c) {
                Err(libc::ENOENT) => return true,
                Err(_) => return false,
                Ok(k) => k,
            };
            let last = todo.is_empty();
            if kind == libc::S_IFLNK && (follow || !last) {
                links += 1;
                let Ok(target) = sys::readlinkat(Some(cur.as_fd()), &c) else { return false };
                if links > MAX_LINKS || target.is_empty() {
                    return false;
                }
                for n in components(&target) {
                    page.mark_link_name(n);
                }
                if target[0] == b'/' {
                    let Some(r) = root() else { return false };
                    cur = r;
                    at = Some(b"/".to_vec());
                    if !self.watch(cur.as_fd(), at.as_deref(), epoch) {
                        return false;
                    }
                }
                todo.extend(components(&target).rev().map(<[u8]>::to_vec));
                continue;
            }
            if kind != libc::S_IFDIR || last {
                // It exists (or is no directory: ENOTDIR, never kept).
                return false;
            }
            let Some(next) = open(Some(cur.as_fd()), &name) else { return false };
            cur = next;
            if let Some(p) = at.as_mut() {
                if p.len() > 1 {
                    p.push(b'/');
                }
                p.extend_from_slice(&name);
            }
            if !self.watch(cur.as_fd(), at.as_deref(), epoch) {
                return false;
            }
        }
        false
    }

    /// Read the queued events and make stale, on `page`, what they may have ended.
    pub fn drain(&self, page: &GenerationPage) {
        let mut buf = [0u8; 4096];
        loop {
            let n = match sys::read_nonblocking(self.fd.as_fd(), &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for ev in events(&buf[..n]) {
                apply(self, page, ev);
            }
        }
    }
}

/// One inotify event: its mask and name (empty for the directory itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// `IN_*` bits.
    pub mask: u32,
    /// The name in the watched directory, without its NUL padding.
    pub name: &'a [u8],
}

/// The events in what one `read` of an inotify descriptor returned (`struct
/// inotify_event`: wd, mask, cookie, len, then `len` bytes of NUL-padded name); a
/// torn tail is ignored.
pub fn events(mut buf: &[u8]) -> impl Iterator<Item = Event<'_>> {
    std::iter::from_fn(move || {
        let word = |i: usize| u32::from_ne_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
        if buf.len() < 16 {
            return None;
        }
        let (mask, len) = (word(4), word(12) as usize);
        let raw = buf.get(16..16 + len)?;
        let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
        buf = &buf[16 + len..];
        Some(Event { mask, name })
    })
}

/// What one event makes stale.
fn apply(w: &Watch, page: &GenerationPage, ev: Event<'_>) {
    let dir = ev.mask & libc::IN_ISDIR != 0;
    if ev.mask & (libc::IN_Q_OVERFLOW | libc::IN_UNMOUNT) != 0 {
        w.forget_paths();
        page.bump(sys::BUMP_WATCH);
        return;
    }
    if ev.mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
        // A directory made or anything moved in may stand where a watched one was.
        if dir || ev.mask & libc::IN_MOVED_TO != 0 {
            w.forget_paths();
        }
        page.bump_name(ev.name, sys::BUMP_WATCH);
    }
    if ev.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 {
        // Failures relative to a working directory are kept under the directory's
        // inode: one moved has another parent, one removed may have its inode
        // number given to another directory.
        page.bump(sys::BUMP_WATCH);
    }
    if ev.mask & (libc::IN_MOVED_FROM | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED) != 0
        || (ev.mask & libc::IN_DELETE != 0 && dir)
    {
        w.forget_paths();
    }
    if ev.mask & libc::IN_ATTRIB != 0 {
        if ev.name.is_empty() {
            // The watched directory's own permissions: a walk through it may now fail
            // otherwise.
            page.bump(sys::BUMP_WATCH);
        } else if dir {
            page.bump_name(ev.name, sys::BUMP_WATCH);
        }
    }
}

/// The names of a path, `.` and empty ones left out (`..` kept).
fn components(p: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    p.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ictus-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn sh(script: &str) {
        // Another process makes the change.
        assert!(Command::new("sh").arg("-c").arg(script).status().unwrap().success(), "{script}");
    }

    fn key(page: &GenerationPage, p: &Path) -> u64 {
        page.generation_for(p.as_os_str().as_encoded_bytes())
    }

    #[test]
    fn events_parse_and_torn_tails_are_ignored() {
        let mut b = Vec::new();
        for (mask, name) in [(libc::IN_CREATE, &b"abc"[..]), (libc::IN_ATTRIB, b"")] {
            b.extend_from_slice(&1i32.to_ne_bytes());
            b.extend_from_slice(&mask.to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes());
            let padded = if name.is_empty() { 0 } else { 16 };
            b.extend_from_slice(&(padded as u32).to_ne_bytes());
            let mut n = name.to_vec();
            n.resize(padded, 0);
            b.extend_from_slice(&n);
        }
        let all: Vec<_> = events(&b).collect();
        assert_eq!(all, [Event { mask: libc::IN_CREATE, name: b"abc" }, Event { mask: libc::IN_ATTRIB, name: b"" }]);
        assert_eq!(events(&b[..20]).count(), 0, "a torn event");
        assert_eq!(events(&b[..b.len() - 3]).count(), 1);
    }

    /// A kept failure is made stale by another process's create, mkdir, rename and
    /// symlink in a directory its walk read, once the events are read.
    #[test]
    fn a_change_by_another_process_ends_a_kept_failure() {
        let d = scratch("change");
        let page = GenerationPage::new(true).unwrap();
        let w = page.watch().expect("inotify");
        std::fs::create_dir(d.join("sub")).unwrap();
        let cases: [(&str, &str); 5] = [
            ("sub/missing.h", "touch {d}/sub/missing.h"),
            ("newdir/x.h", "mkdir {d}/newdir"),
            ("moved/y.h", "mkdir {d}/elsewhere && touch {d}/elsewhere/y.h && mv {d}/elsewhere {d}/moved"),
            ("linked/z.h", "mkdir -p {d}/real && touch {d}/real/z.h && ln -s real {d}/linked"),
            ("sub/deeper/w.h", "mkdir {d}/sub/deeper"),
        ];
        for (rel, change) in cases {
            let p = d.join(rel);
            let before = key(&page, &p);
            assert!(w.failure_walk(&page, None, p.as_os_str().as_encoded_bytes(), true), "{rel} is missing");
            w.drain(&page);
            assert_eq!(key(&page, &p), before, "{rel}: nothing changed yet");
            sh(&change.replace("{d}", &d.display().to_string()));
            w.drain(&page);
            assert_ne!(key(&page, &p), before, "{rel}: the change is seen");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A failure through a link is kept, and ends when the link's target changes —
    /// whose names are not in the path.
    #[test]
    fn a_failure_through_a_link_ends_when_the_target_moves() {
        let d = scratch("link");
        std::fs::create_dir_all(d.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("usr/lib", d.join("lib")).unwrap();
        let page = GenerationPage::new(true).unwrap();
        let w = page.watch().expect("inotify");
        let p = d.join("lib/libfoo.so");
        let before = key(&page, &p);
        assert!(w.failure_walk(&page, None, p.as_os_str().as_encoded_bytes(), true));
        // Something else made under the link's target: the path's own names move.
        sh(&format!("touch {}/usr/lib/libfoo.so", d.display()));
        w.drain(&page);
        let after_create = key(&page, &p);
        assert_ne!(after_create, before);
        std::fs::remove_file(d.join("usr/lib/libfoo.so")).unwrap();
        assert!(w.failure_walk(&page, None, p.as_os_str().as_encoded_bytes(), true));
        w.drain(&page);
        let kept = key(&page, &p);
        // The target's directory replaced by another that has the file: "usr" is
        // not in the path, but it is a link's.
        sh(&format!(
            "mkdir -p {d}/usr2/lib && touch {d}/usr2/lib/libfoo.so && mv {d}/usr {d}/usr.old && mv {d}/usr2 {d}/usr",
            d = d.display()
        ));
        w.drain(&page);
        assert_ne!(key(&page, &p), kept, "a link's target changed");
        // What exists keeps nothing; neither does a walk into /proc.
        assert!(!w.failure_walk(&page, None, p.as_os_str().as_encoded_bytes(), true));
        assert!(!w.failure_walk(&page, None, b"/proc/self/nothing", true));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A walk that began before the set of watched paths was emptied adds nothing to
    /// it: the directory it opened may have been replaced at that path meanwhile.
    #[test]
    fn a_walk_older_than_a_move_records_no_path() {
        let d = scratch("epoch");
        let page = GenerationPage::new(true).unwrap();
        let w = page.watch().expect("inotify");
        let dir = std::fs::File::open(&d).unwrap();
        let p = d.as_os_str().as_encoded_bytes();
        let before = w.epoch();
        w.forget_paths();
        assert!(w.watch(dir.as_fd(), Some(p), before));
        assert!(!w.known.lock().unwrap().1.contains(p), "recorded by a walk older than the move");
        assert!(w.watch(dir.as_fd(), Some(p), w.epoch()));
        assert!(w.known.lock().unwrap().1.contains(p));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Relative failures are kept under the working directory's inode: a watched
    /// directory moved (another parent) or removed (its inode number free for
    /// another) makes every kept failure stale.
    #[test]
    fn a_watched_directory_moved_or_removed_ends_every_kept_failure() {
        let d = scratch("self");
        std::fs::create_dir_all(d.join("a/inc")).unwrap();
        let page = GenerationPage::new(true).unwrap();
        let w = page.watch().expect("inotify");
        let dir = std::fs::File::open(d.join("a")).unwrap();
        assert!(w.failure_walk(&page, Some(dir.as_fd()), b"inc/x.h", true));
        w.drain(&page);
        let before = page.generation();
        sh(&format!("mv {d}/a {d}/b", d = d.display()));
        w.drain(&page);
        let moved = page.generation();
        assert_ne!(moved, before, "the working directory moved");
        sh(&format!("rm -r {}/b/inc", d.display()));
        w.drain(&page);
        assert_ne!(page.generation(), moved, "a walked directory removed");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_relative_walk_starts_at_the_directory_given() {
        let d = scratch("rel");
        std::fs::create_dir(d.join("a")).unwrap();
        let page = GenerationPage::new(true).unwrap();
        let w = page.watch().expect("inotify");
        let dir = std::fs::File::open(&d).unwrap();
        assert!(w.failure_walk(&page, Some(dir.as_fd()), b"a/../a/x.h", true));
        assert!(!w.failure_walk(&page, Some(dir.as_fd()), b"a", true), "it exists");
        let before = key(&page, Path::new("a/x.h"));
        sh(&format!("touch {}/a/x.h", d.display()));
        w.drain(&page);
        assert_ne!(key(&page, Path::new("a/x.h")), before);
        let _ = std::fs::remove_dir_all(&d);
    }
}
