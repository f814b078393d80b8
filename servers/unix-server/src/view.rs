//! The program's view of the file tree, and path resolution in it: the server's
//! policy core. A path is walked component by component *in the view*: each
//! component's host path comes from the longest bind mount over it, hidden paths do
//! not exist, `..` never climbs above the view's root, and every symbolic link met
//! is read on the host and followed in the view (an absolute target starts again
//! at the view's root). What comes out is a host path with no symbolic link in it,
//! which the server then opens with `RESOLVE_NO_SYMLINKS`, so that a link swapped in
//! after the walk is refused rather than followed out of the view.
//!
//! The file system is a parameter ([`Lookup`]), so the walk is tested on a fake tree.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ictus_unix_emul::sysno::errno;

use crate::policy::{Mount, Policy};

/// What a host path is, as far as the walk cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Nothing there.
    Missing,
    /// A symbolic link, with its target.
    Symlink(Vec<u8>),
    /// A `/proc` link to something that is not a path (a pipe, a socket, a deleted
    /// file): it can be opened, not walked through.
    Magic,
    /// Anything else.
    Other,
}

/// The host file system, as the walk sees it.
pub trait Lookup {
    /// What `host` is (without following a final link).
    fn node(&self, host: &Path) -> Node;
}

/// A resolved path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Where it is in the view.
    pub view: PathBuf,
    /// Where it is on the host.
    pub host: PathBuf,
    /// Under a read-only mount or `ro` path.
    pub readonly: bool,
    /// A `/proc` magic link, to be opened as such.
    pub magic: bool,
}

/// Most links followed in one walk (the kernel's `MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

/// The view a policy describes.
#[derive(Debug, Clone)]
pub struct View {
    mounts: Vec<Mount>,
    hidden: Vec<PathBuf>,
    readonly: Vec<PathBuf>,
}

fn under(p: &Path, prefix: &Path) -> bool {
    p.starts_with(prefix)
}

impl View {
    /// The view of `policy` (host paths as given: the server canonicalises them).
    pub fn new(policy: &Policy) -> View {
        let mut mounts = policy.mounts.clone();
        // Longest view path first: the innermost mount wins.
        mounts.sort_by_key(|m| std::cmp::Reverse(m.view.components().count()));
        View { mounts, hidden: policy.hidden.clone(), readonly: policy.readonly.clone() }
    }

    /// The host path of a view path, and whether it is read-only.
    pub fn host_of(&self, view: &Path) -> Option<(PathBuf, bool)> {
        let m = self.mounts.iter().find(|m| under(view, &m.view))?;
        let rest = view.strip_prefix(&m.view).ok()?;
        let host = if rest.as_os_str().is_empty() { m.host.clone() } else { m.host.join(rest) };
        let ro = m.readonly || self.readonly.iter().any(|r| under(view, r));
        Some((host, ro))
    }

    /// The view path of a host path: through the mount whose host path is the
    /// longest prefix of it (and is not shadowed by a hidden path).
    pub fn view_of(&self, host: &Path) -> Option<PathBuf> {
        let mut best: Option<(usize, PathBuf)> = None;
        for m in &self.mounts {
            if let Ok(rest) = host.strip_prefix(&m.host) {
                let depth = m.host.components().count();
                if best.as_ref().map_or(true, |b| depth > b.0) {
                    let v = if rest.as_os_str().is_empty() { m.view.clone() } else { m.view.join(rest) };
                    // The view path must map back to this host path (not be covered by
                    // another mount), and not be hidden.
                    if self.host_of(&v).map(|h| h.0) == Some(host.to_path_buf()) && !self.is_hidden(&v) {
                        best = Some((depth, v));
                    }
                }
            }
        }
        best.map(|b| b.1)
    }

    /// Whether a view path is hidden.
    pub fn is_hidden(&self, view: &Path) -> bool {
        self.hidden.iter().any(|h| under(view, h))
    }

    /// Resolve `path` (bytes as the program gave them) from the view directory
    /// `base`. `follow_last`: follow a final symbolic link. Errors are errnos.
    pub fn resolve(&self, base: &Path, path: &[u8], follow_last: bool, fs: &dyn Lookup) -> Result<Resolved, i32> {
        if path.is_empty() {
            return Err(errno::ENOENT);
        }
        let mut cur: PathBuf = if path[0] == b'/' { PathBuf::from("/") } else { base.to_path_buf() };
        // Components still to walk, last first.
        let mut todo: Vec<Vec<u8>> = split(path);
        todo.reverse();
        let trailing_slash = path.ends_with(b"/");
        let mut links = 0;
        while let Some(c) = todo.pop() {
            let last = todo.is_empty();
            match c.as_slice() {
                b"." => continue,
                b".." => {
                    cur.pop();
                    continue;
                }
                _ => {}
            }
            let next = cur.join(OsStr::from_bytes(&c));
            if self.is_hidden(&next) {
                return Err(errno::ENOENT);
            }
            let (host, _) = self.host_of(&next).ok_or(errno::ENOENT)?;
            if last && !follow_last && !trailing_slash {
                cur = next;
                break;
            }
            match fs.node(&host) {
                Node::Symlink(target) => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(errno::ELOOP);
                    }
                    let target = if host.starts_with("/proc/") && target.first() == Some(&b'/') {
                        // A /proc link names a host path: show it in the view.
                        match self.view_of(Path::new(OsStr::from_bytes(&target))) {
                            Some(v) => v.into_os_string().into_vec(),
                            None => return Err(errno::ENOENT),
                        }
                    } else {
                        target
                    };
                    if target.first() == Some(&b'/') {
                        cur = PathBuf::from("/");
                    }
                    let mut parts = split(&target);
                    parts.reverse();
                    todo.extend(parts);
                }
                Node::Magic => {
                    if !last {
                        return Err(errno::ENOTDIR);
                    }
                    let ro = self.host_of(&next).map(|h| h.1).unwrap_or(true);
                    return Ok(Resolved { view: next, host, readonly: ro, magic: true });
                }
                Node::Missing if !last => return Err(errno::ENOENT),
                Node::Missing | Node::Other => cur = next,
            }
        }
        let (host, readonly) = self.host_of(&cur).ok_or(errno::ENOENT)?;
        Ok(Resolved { view: cur, host, readonly, magic: false })
    }
}

use std::os::unix::ffi::OsStringExt;

fn split(p: &[u8]) -> Vec<Vec<u8>> {
    p.split(|&b| b == b'/').filter(|s| !s.is_empty()).map(|s| s.to_vec()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fake(HashMap<PathBuf, Node>);
    impl Lookup for Fake {
        fn node(&self, host: &Path) -> Node {
            self.0.get(host).cloned().unwrap_or(Node::Missing)
        }
    }

    fn fake(entries: &[(&str, Node)]) -> Fake {
        Fake(entries.iter().map(|(p, n)| (PathBuf::from(p), n.clone())).collect())
    }

    fn policy(text: &str) -> View {
        View::new(&Policy::parse(text).unwrap())
    }

    #[test]
    fn paths_walk_through_mounts_and_links() {
        let v = policy("root /jail\nbind /data /mnt/d ro\nhide /secret\n");
        let fs = fake(&[
            ("/jail/bin", Node::Symlink(b"usr/bin".to_vec())),
            ("/jail/usr", Node::Other),
            ("/jail/usr/bin", Node::Other),
            ("/jail/usr/bin/sh", Node::Other),
            ("/jail/mnt", Node::Other),
            ("/data", Node::Other),
            ("/data/x", Node::Other),
            ("/jail/up", Node::Symlink(b"../../../etc".to_vec())),
            ("/jail/etc", Node::Other),
            ("/jail/abs", Node::Symlink(b"/mnt/d/x".to_vec())),
            ("/jail/loop", Node::Symlink(b"loop".to_vec())),
        ]);
        let r = v.resolve(Path::new("/"), b"/bin/sh", true, &fs).unwrap();
        assert_eq!(r.host, PathBuf::from("/jail/usr/bin/sh"));
        assert_eq!(r.view, PathBuf::from("/usr/bin/sh"));
        // `..` stops at the view's root, even through a link.
        let r = v.resolve(Path::new("/"), b"up", true, &fs).unwrap();
        assert_eq!(r.host, PathBuf::from("/jail/etc"));
        let r = v.resolve(Path::new("/usr"), b"../../../../mnt/d/x", true, &fs).unwrap();
        assert_eq!(r.host, PathBuf::from("/data/x"));
        assert!(r.readonly);
        // An absolute link target starts again at the view's root.
        assert_eq!(v.resolve(Path::new("/"), b"abs", true, &fs).unwrap().host, PathBuf::from("/data/x"));
        assert_eq!(v.resolve(Path::new("/"), b"abs", false, &fs).unwrap().host, PathBuf::from("/jail/abs"));
        assert_eq!(v.resolve(Path::new("/"), b"/secret/key", true, &fs), Err(errno::ENOENT));
        assert_eq!(v.resolve(Path::new("/"), b"/secret", false, &fs), Err(errno::ENOENT));
        assert_eq!(v.resolve(Path::new("/"), b"loop", true, &fs), Err(errno::ELOOP));
        assert_eq!(v.resolve(Path::new("/"), b"nothere/x", true, &fs), Err(errno::ENOENT));
        assert_eq!(v.resolve(Path::new("/"), b"", true, &fs), Err(errno::ENOENT));
        // The last component may be missing (creation).
        assert_eq!(v.resolve(Path::new("/usr"), b"new", true, &fs).unwrap().host, PathBuf::from("/jail/usr/new"));
    }

    #[test]
    fn host_paths_map_back() {
        let v = policy("root /jail\nbind /data /mnt/d\nhide /mnt/d/h\n");
        assert_eq!(v.view_of(Path::new("/data/a")), Some(PathBuf::from("/mnt/d/a")));
        assert_eq!(v.view_of(Path::new("/jail/usr")), Some(PathBuf::from("/usr")));
        assert_eq!(v.view_of(Path::new("/etc")), None);
        assert_eq!(v.view_of(Path::new("/data/h/k")), None);
    }

    #[test]
    fn proc_links_show_in_the_view() {
        let v = policy("root /jail\n");
        let fs = fake(&[
            ("/jail/proc", Node::Other),
            ("/jail/proc/7", Node::Other),
            ("/proc/7/cwd", Node::Symlink(b"/jail/work".to_vec())),
            ("/jail/work", Node::Other),
            ("/proc/7/fd/0", Node::Magic),
        ]);
        // (the test's /jail/proc maps to host /jail/proc, so use a policy binding /proc)
        let v2 = policy("root /jail\nbind /proc /proc\n");
        let fs2 = fake(&[
            ("/proc", Node::Other),
            ("/proc/7", Node::Other),
            ("/proc/7/cwd", Node::Symlink(b"/jail/work".to_vec())),
            ("/jail/work", Node::Other),
            ("/proc/7/fd", Node::Other),
            ("/proc/7/fd/0", Node::Magic),
            ("/proc/7/root", Node::Symlink(b"/".to_vec())),
        ]);
        let r = v2.resolve(Path::new("/"), b"/proc/7/cwd", true, &fs2).unwrap();
        assert_eq!(r.view, PathBuf::from("/work"));
        let r = v2.resolve(Path::new("/"), b"/proc/7/fd/0", true, &fs2).unwrap();
        assert!(r.magic);
        assert_eq!(v2.resolve(Path::new("/"), b"/proc/7/fd/0/x", true, &fs2), Err(errno::ENOTDIR));
        // The host's / is outside this view.
        assert_eq!(v2.resolve(Path::new("/"), b"/proc/7/root/etc", true, &fs2), Err(errno::ENOENT));
        let _ = (v, fs);
    }
}
