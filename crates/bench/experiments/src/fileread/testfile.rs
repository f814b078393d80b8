//! Where the test file lives, and the file itself: written with a known pattern on a
//! disk-backed filesystem, its pages dropped from the page cache for uncached runs,
//! removed (with its directory) at the end, and after a run that was killed.

use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ictus_bench::sys::{self, Mapping, Protection};

use super::checksum::{fill_pattern, Checksum};
use super::methods::read_block;
use super::{DIR_ENV, MIB};

/// Uncached runs should start with at most this fraction of the file resident.
const DROPPED: f64 = 0.01;
const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58f6;

/// The mount a path is on, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mount {
    pub(super) point: String,
    pub(super) fstype: String,
    pub(super) source: String,
}

/// The mount with the longest mount point that contains `path` (absolute, canonical).
/// Mount points with spaces are octal-escaped in mountinfo (`\040`); they are matched
/// unescaped.
pub(super) fn mount_of(mountinfo: &str, path: &Path) -> Option<Mount> {
    let mut best: Option<Mount> = None;
    for line in mountinfo.lines() {
        let (before, after) = line.split_once(" - ")?;
        let point = unescape_mount(before.split_whitespace().nth(4)?);
        let mut rest = after.split_whitespace();
        let (fstype, source) = (rest.next()?, rest.next().unwrap_or("?"));
        if !path.starts_with(&point) {
            continue;
        }
        if best.as_ref().map_or(true, |b| point.len() >= b.point.len()) {
            best = Some(Mount { point, fstype: fstype.to_string(), source: source.to_string() });
        }
    }
    best
}

pub(super) fn unescape_mount(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Readahead of the block device behind a mount source like `/dev/vda1` (KiB).
pub(super) fn read_ahead_kb(source: &str) -> Option<u64> {
    let name = source.strip_prefix("/dev/")?.rsplit('/').next()?;
    ["queue/read_ahead_kb", "../queue/read_ahead_kb"]
        .iter()
        .find_map(|tail| std::fs::read_to_string(format!("/sys/class/block/{name}/{tail}")).ok()?.trim().parse().ok())
}

/// Whether a directory's filesystem keeps files in memory (tmpfs, ramfs), where
/// "uncached" means nothing and `O_DIRECT` is refused.
pub(super) fn memory_backed(dir: &Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|s| {
        // The field's type differs by architecture; the magic numbers are 32-bit.
        let magic = s.f_type as u32;
        magic == TMPFS_MAGIC || magic == RAMFS_MAGIC
    })
}

/// The directory to make the test directory in, and why it was chosen.
pub(super) fn choose_base(explicit: Option<&Path>) -> (PathBuf, String) {
    if let Some(dir) = explicit {
        return (dir.to_path_buf(), "as given".to_string());
    }
    if let Some(dir) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        return (PathBuf::from(dir), format!("from ${DIR_ENV}"));
    }
    let temp = std::env::temp_dir();
    if !memory_backed(&temp) {
        return (temp, "the temporary directory (on a disk)".to_string());
    }
    let target = PathBuf::from("target");
    let cwd_on_disk = std::env::current_dir().is_ok_and(|d| !memory_backed(&d));
    if cwd_on_disk {
        return (target, format!("./target ({} is in memory)", temp.display()));
    }
    (temp, "the temporary directory (every candidate is in memory)".to_string())
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);
const DIR_PREFIX: &str = "ictus-fileread-";

/// Removes test directories left by runs whose process is gone (killed mid-run).
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(stale_pid) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let dir = entry.path();
            let _ = std::fs::remove_file(dir.join("data"));
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// The process id in a test directory's name `ictus-fileread-<pid>-<n>`.
fn stale_pid(name: &str) -> Option<u32> {
    let (pid, n) = name.strip_prefix(DIR_PREFIX)?.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Whether a virtio-balloon device offers free page reporting (feature bit 5), from
/// the `features` bit string of a virtio device whose `device` id is 5 (balloon).
///
/// A virtual machine that reports free memory to its host gets it taken away: memory
/// freed and left unused for a few seconds costs a host fault per page when it is next
/// used, charged as the guest's system time. Page-cache pages freed by dropping the
/// file and reused at once are not affected; pages freed long before are.
fn balloon_reports_free_pages(device: &str, features: &str) -> bool {
    device.trim() == "0x0005" && features.as_bytes().get(5) == Some(&b'1')
}

/// Whether this machine reports free pages to a hypervisor.
pub(super) fn free_page_reporting() -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/bus/virtio/devices") else { return false };
    devices.flatten().any(|d| {
        let read = |name: &str| std::fs::read_to_string(d.path().join(name)).unwrap_or_default();
        balloon_reports_free_pages(&read("device"), &read("features"))
    })
}

/// How uncached runs get the file out of the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dropper {
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` on the file: unprivileged, this file only.
    Fadvise,
    /// `echo 1 > /proc/sys/vm/drop_caches` after fadvise: root, the whole machine.
    DropCaches,
    /// Nothing worked: "uncached" runs start with the file (partly) resident.
    Nothing,
}

/// The test file: written with a known pattern, removed (with its directory) on drop.
pub(super) struct TestFile {
    pub(super) dir: PathBuf,
    pub(super) path: PathBuf,
    pub(super) size: u64,
    pub(super) checksum: Checksum,
    /// Open for fadvise and the residency mapping.
    pub(super) file: File,
    pub(super) residency: Mapping,
    pub(super) mount: Option<Mount>,
}

impl TestFile {
    /// Creates a private directory in `base` and writes `size` bytes of the pattern.
    pub(super) fn create(base: &Path, size: u64) -> io::Result<Self> {
        std::fs::create_dir_all(base)?;
        remove_stale(base);
        let name = format!("{DIR_PREFIX}{}-{}", std::process::id(), NEXT_DIR.fetch_add(1, Ordering::Relaxed));
        let dir = base.join(name);
        std::fs::create_dir(&dir)?;
        let path = dir.join("data");
        match Self::write(&dir, &path, size) {
            Ok(file) => Ok(file),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    pub(super) fn write(dir: &Path, path: &Path, size: u64) -> io::Result<Self> {
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id());
        let mut out = File::create_new(path)?;
        let mut buf = vec![0u8; (4 * MIB).min(size) as usize];
        let mut sum = Checksum::default();
        let mut offset = 0u64;
        while offset < size {
            let n = buf.len().min((size - offset) as usize);
            fill_pattern(&mut buf[..n], offset, seed);
            out.write_all(&buf[..n])?;
            sum.add_at(offset, &buf[..n]);
            offset += n as u64;
        }
        out.sync_all()?;
        drop(out);
        let file = File::open(path)?;
        let residency = sys::map_file(&file, size as usize, Protection::Read)?;
        let absolute = std::fs::canonicalize(dir)?;
        let mount = std::fs::read_to_string("/proc/self/mountinfo").ok().and_then(|m| mount_of(&m, &absolute));
        Ok(TestFile { dir: dir.to_path_buf(), path: path.to_path_buf(), size, checksum: sum, file, residency, mount })
    }

    pub(super) fn resident(&self) -> f64 {
        sys::resident_fraction(&self.residency).unwrap_or(f64::NAN)
    }

    pub(super) fn fadvise_dontneed(&self) -> io::Result<()> {
        rustix::fs::fadvise(&self.file, 0, None, rustix::fs::Advice::DontNeed)?;
        Ok(())
    }

    /// Drops the file's pages the way `how` says; returns the fraction still resident.
    pub(super) fn drop_pages(&self, how: Dropper) -> f64 {
        match how {
            Dropper::Fadvise => {
                let _ = self.fadvise_dontneed();
            }
            Dropper::DropCaches => {
                let _ = self.fadvise_dontneed();
                let _ = std::fs::write("/proc/sys/vm/drop_caches", "1\n");
            }
            Dropper::Nothing => {}
        }
        self.resident()
    }

    /// Reads the whole file through the page cache (untimed), so that it is cached.
    pub(super) fn warm(&self) -> io::Result<()> {
        read_block(&self.path, 1 << 20).map(drop)
    }

    /// Finds a way to drop the file's pages, trying the unprivileged one first.
    pub(super) fn find_dropper(&self, notes: &mut ictus_bench::Notes) -> Dropper {
        if let Err(e) = self.fadvise_dontneed() {
            notes.push(format!("posix_fadvise(DONTNEED) failed: {e}"));
        }
        let left = self.resident();
        if left <= DROPPED {
            notes.push(format!(
                "uncached: posix_fadvise(POSIX_FADV_DONTNEED) on the (fsynced) file before each run; \
                 mincore found {:.1}% of it resident after the first drop",
                left * 100.0
            ));
            return Dropper::Fadvise;
        }
        if std::fs::write("/proc/sys/vm/drop_caches", "1\n").is_ok() && self.resident() <= DROPPED {
            notes.push(format!(
                "uncached: posix_fadvise(DONTNEED) left {:.0}% of the file resident, so each uncached run \
                 also writes 1 to /proc/sys/vm/drop_caches (the whole machine's page cache)",
                left * 100.0
            ));
            return Dropper::DropCaches;
        }
        notes.push(format!(
            "WARNING: the file's pages could not be dropped here ({:.0}% stayed resident after \
             posix_fadvise(DONTNEED), and /proc/sys/vm/drop_caches is not writable or did not help): \
             \"uncached\" rows read (partly) cached data; see resident_before",
            left * 100.0
        ));
        Dropper::Nothing
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_of_a_path_is_the_longest_prefix() {
        let info = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /tmp rw,nosuid shared:5 - tmpfs tmpfs rw,size=1024k
31 22 0:27 / /mnt/my\\040disk rw - xfs /dev/sdb1 rw
32 22 0:28 / /tmpx rw - btrfs /dev/sdc rw
";
        let at = |p: &str| mount_of(info, Path::new(p)).map(|m| (m.fstype, m.source, m.point));
        assert_eq!(at("/tmp/ictus-fileread-1-0"), Some(("tmpfs".into(), "tmpfs".into(), "/tmp".into())));
        assert_eq!(at("/tmpx/a"), Some(("btrfs".into(), "/dev/sdc".into(), "/tmpx".into())));
        assert_eq!(at("/work/main"), Some(("ext4".into(), "/dev/vda".into(), "/".into())));
        assert_eq!(at("/mnt/my disk/x").map(|m| m.0), Some("xfs".to_string()));
        assert_eq!(unescape_mount("a\\040b\\134c\\9"), "a b\\c\\9");
    }

    #[test]
    fn free_page_reporting_is_read_from_the_balloon_features() {
        assert!(balloon_reports_free_pages("0x0005\n", "0110010100000000\n"));
        assert!(!balloon_reports_free_pages("0x0005\n", "0110000100000000\n"));
        assert!(!balloon_reports_free_pages("0x0002\n", "0110010100000000\n"), "a block device");
        assert!(!balloon_reports_free_pages("0x0005", "0110"));
    }

    #[test]
    fn stale_directories_are_recognized_by_name() {
        assert_eq!(stale_pid("ictus-fileread-1234-0"), Some(1234));
        assert_eq!(stale_pid("ictus-fileread-1234"), None);
        assert_eq!(stale_pid("ictus-fileread-x-0"), None);
        assert_eq!(stale_pid("other-1234-0"), None);
    }
}
