//! Striped objects in a Ceph cluster, for MARS across machines (issue 20).
//!
//! - [`Rados`] connects to a cluster; [`Striper`] reads and writes striped objects of a
//!   pool through libradosstriper (RADOS objects cut in stripe units over several
//!   objects, so one stream's reads spread over OSDs), ranged, and in flight on reader threads
//!   ([`PendingRead`]), and uploads files ([`Striper::put_file`]).
//! - [`prefetch`]: the pure core that keeps a stream's reads a window ahead of its
//!   schedule, on virtual time; [`StreamReader`] drives it against a striper.
//! - [`cache`]: a node's stripe cache in one memfd, planned like a device so MARS's
//!   engine reads it through io_uring; what the node reports to the director as cached.
//! - [`testcluster`]: a throw-away single-machine cluster (`scripts/ceph.sh`) for tests
//!   and experiments, torn down on drop, or a reason why Ceph cannot run here.
//!
//! The libraries are opened at run time (`dlopen`), so this crate builds without Ceph.
//! `doc/mars-cluster.md` says why RADOS with striping rather than S3 through radosgw.
#![deny(unsafe_code)]

pub mod cache;
#[allow(unsafe_code)]
mod ffi;
pub mod prefetch;
#[allow(unsafe_code)]
mod rados;
mod reader;
pub mod testcluster;

pub use rados::{Layout, PendingRead, Rados, Striper};
pub use reader::{ReadStats, StreamReader};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Ceph's client libraries could not be loaded.
    #[error("Ceph client library not available: {0}")]
    Load(String),
    /// A librados or libradosstriper call failed.
    #[error("{op} {name:?}: {}", std::io::Error::from_raw_os_error(*errno))]
    Rados {
        /// Which call.
        op: &'static str,
        /// On which object (or pool, or file).
        name: String,
        /// The error number it returned (positive).
        errno: i32,
    },
    /// No such object.
    #[error("no object {0:?}")]
    NotFound(String),
    /// The object exists already.
    #[error("object {0:?} exists")]
    Exists(String),
    /// A name that is not allowed.
    #[error("bad object name: {0}")]
    BadName(String),
    /// A layout libradosstriper would refuse or that would make tiny objects.
    #[error("bad layout {0:?}: stripe unit a multiple of 4096, 1 to 64 objects, object size a multiple of the unit")]
    Layout(Layout),
    /// A range outside the object.
    #[error("range {offset}+{len} outside {name:?} of {size} bytes")]
    Range {
        /// Object.
        name: String,
        /// First byte asked.
        offset: u64,
        /// Bytes asked.
        len: u64,
        /// The object's size.
        size: u64,
    },
    /// The striper's reader threads are gone.
    #[error("the striper's reader threads are gone")]
    Pool,
    /// Reading the upload's source failed.
    #[error("upload source: {0}")]
    Source(String),
    /// The store holds fewer bytes than written or announced.
    #[error("{name:?}: {expected} bytes expected, {got} found")]
    Short {
        /// Object.
        name: String,
        /// Bytes expected.
        expected: u64,
        /// Bytes found.
        got: u64,
    },
}

/// Object names: 1 to 200 bytes of `A-Z a-z 0-9 . _ - /`, no empty, `.` or `..`
/// component (the names streams have in MARS, with room for a cluster's prefixes).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
        && name.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

fn check_name(name: &str) -> Result<(), Error> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(Error::BadName(format!("{name:?} (1 to 200 of A-Z a-z 0-9 . _ - /, no empty, . or .. components)")))
    }
}

#[cfg(test)]
mod tests {
    use super::valid_name;

    #[test]
    fn names() {
        for ok in ["a", "films/clip.ts", "x_y-z.0"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "/a", "a/", "a//b", "../x", "a/./b", "a b", "a\0b", "é", &"x".repeat(201)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
