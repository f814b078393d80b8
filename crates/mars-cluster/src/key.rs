//! The cluster key: the secret the director and its nodes share, so that only a node
//! holding it can register on the director's nodes' port (see [`crate::wire`] for the
//! challenge–response and doc/mars-cluster.md "Trust" for what it protects).
//!
//! It lives in a file, as Ceph's keyring does: the file's bytes (trailing white space
//! left out) are the key, at least [`MIN_KEY`] of them. The file must be a regular file
//! owned by the user reading it (or root) that no group or other user can read or
//! write: anyone who can read it can register as any node, anyone who can write it can
//! lock the nodes out. Anything else is refused with a message that says how to fix it;
//! there is no insecure mode — a single-user test makes a key with
//! `ictus mars cluster-key FILE` (or [`ClusterKey::create`]) in one step.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Fewest bytes of a key (what [`ClusterKey::create`] writes is 64 hex digits).
pub const MIN_KEY: usize = 32;
/// Most bytes of a key file read.
const MAX_KEY: u64 = 4096;

/// The shared secret (never printed: its `Debug` says only that it is a key).
#[derive(Clone)]
pub struct ClusterKey(Vec<u8>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// Why a key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// It could not be opened or read.
    #[error("cluster key {path}: {err}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        err: std::io::Error,
    },
    /// Not a regular file.
    #[error("cluster key {0}: not a regular file")]
    NotFile(String),
    /// Group or others may read or write it.
    #[error("cluster key {0}: mode {1:04o} lets the group or others read or write it; `chmod 600 {0}` (a key others can read lets them register as any node)")]
    Open(String, u32),
    /// Owned by another user than the reader (or root).
    #[error("cluster key {0}: owned by uid {1}, not by this user ({2}) or root; give each machine's copy to the user that runs ictus")]
    Owner(String, u32, u32),
    /// Too short to be a key.
    #[error("cluster key {0}: {1} bytes, fewer than {MIN_KEY}; make one with `ictus mars cluster-key FILE`")]
    Short(String, usize),
    /// The OS's random generator failed.
    #[error("cluster key: the system's random generator: {0}")]
    Random(String),
}

impl ClusterKey {
    /// A key of these bytes (tests, and the bench's director in-process).
    pub fn from_bytes(b: &[u8]) -> Result<ClusterKey, KeyError> {
        if b.len() < MIN_KEY {
            return Err(KeyError::Short("(bytes)".into(), b.len()));
        }
        Ok(ClusterKey(b.to_vec()))
    }

    /// The key's bytes (for the MAC).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Reads the key in `path`, refusing a file others can read or write (see the
    /// module's text). The checks are made on the file opened, not on its name.
    pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
        let name = path.display().to_string();
        let io = |err| KeyError::Io { path: name.clone(), err };
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc_nofollow()).open(path).map_err(io)?;
        let m = f.metadata().map_err(io)?;
        if !m.file_type().is_file() {
            return Err(KeyError::NotFile(name));
        }
        if m.mode() & 0o077 != 0 {
            return Err(KeyError::Open(name, m.mode() & 0o7777));
        }
        let me = rustix::process::geteuid().as_raw();
        if m.uid() != me && m.uid() != 0 {
            return Err(KeyError::Owner(name, m.uid(), me));
        }
        let mut b = Vec::new();
        f.take(MAX_KEY).read_to_end(&mut b).map_err(io)?;
        while b.last().is_some_and(u8::is_ascii_whitespace) {
            b.pop();
        }
        if b.len() < MIN_KEY {
            return Err(KeyError::Short(name, b.len()));
        }
        Ok(ClusterKey(b))
    }

    /// Makes a new key (32 bytes from the OS's generator, written as 64 hex digits and a
    /// line end) in a new file `path`, mode 0600; an existing file is not overwritten.
    pub fn create(path: &Path) -> Result<ClusterKey, KeyError> {
        let name = path.display().to_string();
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| KeyError::Random(e.to_string()))?;
        let text: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|err| KeyError::Io { path: name.clone(), err })?;
        f.write_all(format!("{text}\n").as_bytes()).map_err(|err| KeyError::Io { path: name, err })?;
        Ok(ClusterKey(text.into_bytes()))
    }
}

/// `O_NOFOLLOW`: a symbolic link in the key's place is refused (its target's mode is
/// what would be checked, and the link may be anyone's).
fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// A fresh nonce from the OS's generator.
pub(crate) fn nonce() -> std::io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::env::temp_dir().join(format!("ictus-key-{tag}-{}-{n}", std::process::id()))
    }

    #[test]
    fn a_created_key_loads_and_open_or_short_files_are_refused_with_why() {
        let p = scratch("ok");
        let k = ClusterKey::create(&p).unwrap();
        assert_eq!(ClusterKey::load(&p).unwrap().bytes(), k.bytes());
        assert!(matches!(ClusterKey::create(&p), Err(KeyError::Io { .. })), "not overwritten");
        assert_eq!(format!("{k:?}"), "ClusterKey(..)", "never printed");
        for mode in [0o640, 0o604, 0o620, 0o602] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = ClusterKey::load(&p).unwrap_err();
            assert!(matches!(e, KeyError::Open(_, m) if m == mode), "{mode:o}: {e}");
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(ClusterKey::load(&p), Err(KeyError::Io { .. })), "missing");
        let s = scratch("short");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&s)
            .unwrap()
            .write_all(b"secret\n")
            .unwrap();
        assert!(matches!(ClusterKey::load(&s), Err(KeyError::Short(_, 6))));
        std::fs::remove_file(&s).unwrap();
        let l = scratch("link");
        std::os::unix::fs::symlink("/etc/hostname", &l).unwrap();
        assert!(ClusterKey::load(&l).is_err(), "a link is refused");
        std::fs::remove_file(&l).unwrap();
        assert!(matches!(ClusterKey::load(Path::new("/")), Err(KeyError::NotFile(_) | KeyError::Io { .. })));
        assert!(ClusterKey::from_bytes(b"short").is_err());
    }
}
