//! The `fileread` experiment: ways to read a file (paper 000 §9, Table 2).
//!
//! The paper read a 30 MB file on a 16 MB machine, so that nothing came from the cache,
//! with four methods: `stdio`, plain `read` at the best block size (it tried many and kept
//! the best), a memory mapping faulted in page by page, and `mapio`, a `stdio`-like
//! library over a mapping. We read one test file with those four and with today's two
//! ways past the page cache's copying, `O_DIRECT` and io_uring, each both *cached* (the
//! file read once just before) and *uncached* (read in, then its pages dropped with
//! `posix_fadvise(POSIX_FADV_DONTNEED)` just before, verified with `mincore`; reading it
//! in first makes every uncached run reuse the memory just freed, whatever ran before).
//!
//! A file larger than memory is not practical on a machine with gigabytes of it, so
//! "uncached" here means "not in this kernel's page cache": dropping one file's pages
//! needs no privileges and leaves the rest of the machine alone.
//!
//! Every run is timed (wall clock) and charged its CPU time (`getrusage(RUSAGE_SELF)`
//! user + system, which includes io_uring's kernel workers), and checksums every byte
//! it read; a checksum that differs from the one computed while writing the file fails
//! the experiment. Methods take turns in rounds, rotating who goes first, cached and
//! uncached phases alternating, after an untimed warm-up round, so machine noise falls on
//! all of them alike. Each (method, cache state) is reported as the median MB/s (10^6
//! bytes per second) of its runs with the slowest and fastest, CPU seconds per GB and
//! CPU % of the wall time (the paper's measure).
//!
//! Headline `fileread_best_vs_stdio`: the fastest method's uncached throughput against
//! buffered `stdio`-style reads (what a program gets without trying), higher is better.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Write as _};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::conditions::{disk_share, free_bytes, Conditions, DISK_RESERVE};
use crate::report::{Better, Headline, PaperFigure, Report};
use crate::stats::Throughput;
use crate::svg::escape;
use crate::{format_size, BenchError};

/// Experiment name, as in `ictus bench fileread`.
pub const EXPERIMENT: &str = "fileread";
/// Where in the papers the experiment comes from.
pub const PAPER: &str = "000 Table 2";
/// The headline's stable name.
pub const HEADLINE: &str = "fileread_best_vs_stdio";
/// What the headline's peer is.
pub const PEER_NAME: &str = "buffered stdio-style reads (BufReader)";

/// Buffer of the `stdio`-style reader (bytes), as a C `FILE`'s is typically.
pub const STDIO_BUFFER: usize = 8 << 10;
/// Size of each `fread`-like request of the `stdio` and `mapio` readers (bytes): the
/// paper's best `stdio` request size on SCSI.
pub const STDIO_REQUEST: usize = 1 << 10;
/// Request size of the `O_DIRECT` reader (bytes).
pub const DIRECT_REQUEST: usize = 1 << 20;
/// Reads in flight in the io_uring readers.
pub const URING_DEPTH: usize = 8;
/// Request size of each io_uring read (bytes).
pub const URING_REQUEST: usize = 1 << 20;
/// Alignment of `O_DIRECT` buffers, offsets and lengths (bytes).
pub const DIRECT_ALIGN: usize = 4096;
/// Block sizes searched for plain `read(2)` in full mode, 4 KiB to 4 MiB.
pub const BLOCK_SIZES: &[usize] =
    &[4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20];
/// Block sizes searched in quick mode.
pub const BLOCK_SIZES_QUICK: &[usize] = &[4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

/// Test file size in quick mode (bytes).
pub const QUICK_FILE: u64 = 256 << 20;
/// Test file size in full mode (bytes).
pub const FULL_FILE: u64 = 2 << 30;

/// Environment variable naming the directory to put the test file in.
pub const DIR_ENV: &str = "ICTUS_BENCH_DIR";

const MIB: u64 = 1 << 20;
/// Uncached runs should start with at most this fraction of the file resident.
const DROPPED: f64 = 0.01;
const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58f6;

/// Options of `ictus bench fileread`.
#[derive(Debug, Clone, Default)]
pub struct FilereadOptions {
    /// Seconds instead of minutes: a 256 MiB file, fewer block sizes, 3 rounds.
    pub quick: bool,
    /// Where to write the JSON report; the bar chart goes beside it with `.svg`.
    pub json: Option<PathBuf>,
    /// Directory to create the test file in [default: `$ICTUS_BENCH_DIR`, else the
    /// temporary directory if it is on a disk, else `./target`]. A private
    /// subdirectory is made in it and removed at the end.
    pub dir: Option<PathBuf>,
    /// Test file size instead of the mode's (rounded up to whole MiB): tests use a
    /// small one.
    pub file_bytes: Option<u64>,
    /// Rounds instead of the mode's (3 quick, 7 full).
    pub rounds: Option<usize>,
    /// Print a line per round to standard error.
    pub progress: bool,
}

/// `ictus bench fileread [--quick] [--json FILE]`: runs the experiment, prints the
/// table, and with `json` writes the JSON report and the bar chart beside it.
pub fn main(quick: bool, json: Option<PathBuf>) -> Result<(), BenchError> {
    let report = run(&FilereadOptions { quick, json, ..FilereadOptions::default() })?;
    report.print_table();
    Ok(())
}

/// A way to read the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `fread`-like requests of [`STDIO_REQUEST`] bytes through a [`BufReader`] of
    /// [`STDIO_BUFFER`] bytes: the peer.
    Stdio,
    /// Plain `read(2)` of this many bytes at a time into one buffer.
    Block(usize),
    /// The whole file mapped and every byte touched: page faults bring it in.
    Mapped,
    /// `fread`-like requests of [`STDIO_REQUEST`] bytes copied out of a mapping of the
    /// whole file (the paper's `mapio`).
    Mapio,
    /// `read(2)` of [`DIRECT_REQUEST`] bytes with `O_DIRECT` into an aligned buffer.
    Direct,
    /// io_uring: [`URING_DEPTH`] reads of [`URING_REQUEST`] bytes in flight into
    /// registered buffers, through the page cache or (`direct`) with `O_DIRECT`.
    Uring {
        /// Open the file with `O_DIRECT`.
        direct: bool,
    },
}

impl Method {
    /// The method's name in rows: `stdio`, `block`, `mapped`, `mapio`, `O_DIRECT`,
    /// `io_uring`, `io_uring O_DIRECT`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Stdio => "stdio",
            Method::Block(_) => "block",
            Method::Mapped => "mapped",
            Method::Mapio => "mapio",
            Method::Direct => "O_DIRECT",
            Method::Uring { direct: false } => "io_uring",
            Method::Uring { direct: true } => "io_uring O_DIRECT",
        }
    }

    /// Bytes asked for per request (`None` for a mapping, which asks for nothing).
    pub fn request_bytes(self) -> Option<usize> {
        match self {
            Method::Stdio | Method::Mapio => Some(STDIO_REQUEST),
            Method::Block(size) => Some(size),
            Method::Mapped => None,
            Method::Direct => Some(DIRECT_REQUEST),
            Method::Uring { .. } => Some(URING_REQUEST),
        }
    }

    /// Name and request size, e.g. `block 64 KiB`, `io_uring 8x1 MiB`, `mapped`.
    pub fn label(self) -> String {
        match (self, self.request_bytes()) {
            (Method::Uring { .. }, Some(size)) => format!("{} {URING_DEPTH}x{}", self.name(), format_size(size)),
            (_, Some(size)) => format!("{} {}", self.name(), format_size(size)),
            (_, None) => self.name().to_string(),
        }
    }

    fn needs_direct(self) -> bool {
        matches!(self, Method::Direct | Method::Uring { direct: true })
    }

    fn needs_uring(self) -> bool {
        matches!(self, Method::Uring { .. })
    }
}

/// Whether the file's pages were in the page cache when a run started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// The file was read just before.
    Cached,
    /// The file's pages were dropped just before.
    Uncached,
}

impl Cache {
    /// `cached` or `uncached`.
    pub fn name(self) -> &'static str {
        match self {
            Cache::Cached => "cached",
            Cache::Uncached => "uncached",
        }
    }
}

// ---------------------------------------------------------------------------------------
// The checksum every method computes over what it read.

/// A position-dependent checksum of a file's bytes that can be computed in pieces, in
/// any order: the wrapping sum of the file's little-endian 64-bit words, and the
/// wrapping sum of each word xored with a mix of its index. The last word, if partial,
/// is padded with zeros. Cheap enough (a few adds per word) not to hide the read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checksum {
    sum: u64,
    mixed: u64,
    len: u64,
}

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

impl Checksum {
    /// Adds the bytes found at byte `offset` of the file. `offset` must be a multiple
    /// of 8, and `data.len()` too unless `data` ends the file.
    pub fn add_at(&mut self, offset: u64, data: &[u8]) {
        debug_assert_eq!(offset % 8, 0, "checksum pieces start on a word");
        let mut key = (offset / 8).wrapping_mul(MIX);
        let (mut sum, mut mixed) = (0u64, 0u64);
        let mut words = data.chunks_exact(8);
        for word in &mut words {
            let w = u64::from_le_bytes([word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7]]);
            sum = sum.wrapping_add(w);
            mixed = mixed.wrapping_add(w ^ key);
            key = key.wrapping_add(MIX);
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            let w = u64::from_le_bytes(last);
            sum = sum.wrapping_add(w);
            mixed = mixed.wrapping_add(w ^ key);
        }
        self.sum = self.sum.wrapping_add(sum);
        self.mixed = self.mixed.wrapping_add(mixed);
        self.len += data.len() as u64;
    }

    /// Bytes summed.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was summed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A [`Checksum`] fed the file's bytes in order, in pieces of any length.
#[derive(Debug, Clone, Default)]
pub struct StreamChecksum {
    sum: Checksum,
    offset: u64,
    carry: [u8; 8],
    carried: usize,
}

impl StreamChecksum {
    /// An empty checksum at offset 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the next bytes of the file.
    pub fn update(&mut self, mut data: &[u8]) {
        if self.carried > 0 {
            let take = (8 - self.carried).min(data.len());
            self.carry[self.carried..self.carried + take].copy_from_slice(&data[..take]);
            self.carried += take;
            data = &data[take..];
            if self.carried < 8 {
                return;
            }
            self.sum.add_at(self.offset, &self.carry);
            self.offset += 8;
            self.carried = 0;
        }
        let whole = data.len() / 8 * 8;
        self.sum.add_at(self.offset, &data[..whole]);
        self.offset += whole as u64;
        let rest = &data[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carried = rest.len();
    }

    /// The checksum of everything added.
    pub fn finish(mut self) -> Checksum {
        if self.carried > 0 {
            self.sum.add_at(self.offset, &self.carry[..self.carried]);
        }
        self.sum
    }
}

/// Fails unless a run's checksum is the file's.
fn check_checksum(case: &str, expected: Checksum, got: Checksum) -> Result<(), BenchError> {
    if got == expected {
        Ok(())
    } else {
        Err(BenchError::io(
            format!("{case}: read data differs from the file written"),
            io::Error::other(format!("checksum {got:x?}, expected {expected:x?}")),
        ))
    }
}

/// The test file's content at `offset` (a multiple of 8; `buf.len()` too): one
/// splitmix64 word per 8 bytes, so it neither compresses nor repeats.
fn fill_pattern(buf: &mut [u8], offset: u64, seed: u64) {
    let first = offset / 8;
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        let mut z = seed.wrapping_add((first + i as u64).wrapping_mul(MIX));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        word.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
}

// ---------------------------------------------------------------------------------------
// Where the file lives.

/// The mount a path is on, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    point: String,
    fstype: String,
    source: String,
}

/// The mount with the longest mount point that contains `path` (absolute, canonical).
/// Mount points with spaces are octal-escaped in mountinfo (`\040`); they are matched
/// unescaped.
fn mount_of(mountinfo: &str, path: &Path) -> Option<Mount> {
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

fn unescape_mount(text: &str) -> String {
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
fn read_ahead_kb(source: &str) -> Option<u64> {
    let name = source.strip_prefix("/dev/")?.rsplit('/').next()?;
    ["queue/read_ahead_kb", "../queue/read_ahead_kb"]
        .iter()
        .find_map(|tail| std::fs::read_to_string(format!("/sys/class/block/{name}/{tail}")).ok()?.trim().parse().ok())
}

/// Whether a directory's filesystem keeps files in memory (tmpfs, ramfs), where
/// "uncached" means nothing and `O_DIRECT` is refused.
fn memory_backed(dir: &Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|s| {
        // The field's type differs by architecture; the magic numbers are 32-bit.
        let magic = s.f_type as u32;
        magic == TMPFS_MAGIC || magic == RAMFS_MAGIC
    })
}

/// The directory to make the test directory in, and why it was chosen.
fn choose_base(explicit: Option<&Path>) -> (PathBuf, String) {
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
fn free_page_reporting() -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/bus/virtio/devices") else { return false };
    devices.flatten().any(|d| {
        let read = |name: &str| std::fs::read_to_string(d.path().join(name)).unwrap_or_default();
        balloon_reports_free_pages(&read("device"), &read("features"))
    })
}

/// A read-only shared mapping of a file.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(file: &File, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot map an empty file"));
        }
        // SAFETY: a new read-only shared mapping at an address the kernel picks (null
        // hint, no MAP_FIXED) overlaps no existing Rust object; `file` is open for
        // reading and `len` is non-zero.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                file,
                0,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    /// The mapped bytes. Touching them faults the file's pages in.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is the start of a live readable mapping of `len` bytes that
        // stays mapped until `self` is dropped, which the borrow outlives not. The file
        // is the experiment's own, only read while mapped and never truncated, so the
        // bytes do not change (nor vanish, which would raise SIGBUS) under the borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Fraction of the mapped file's pages in the page cache (`mincore`); mapping the
    /// file does not bring them in, so this observes without disturbing.
    fn resident_fraction(&self) -> io::Result<f64> {
        let page = rustix::param::page_size();
        let pages = self.len.div_ceil(page);
        let mut vec = vec![0u8; pages];
        // SAFETY: `ptr` is page-aligned (returned by mmap) and `len` bytes from it are
        // mapped; `vec` has one writable byte per page of that range.
        let rc = unsafe { libc::mincore(self.ptr.as_ptr().cast(), self.len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `new`, and no borrow of
        // `bytes()` outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// How uncached runs get the file out of the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dropper {
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` on the file: unprivileged, this file only.
    Fadvise,
    /// `echo 1 > /proc/sys/vm/drop_caches` after fadvise: root, the whole machine.
    DropCaches,
    /// Nothing worked: "uncached" runs start with the file (partly) resident.
    Nothing,
}

/// The test file: written with a known pattern, removed (with its directory) on drop.
struct TestFile {
    dir: PathBuf,
    path: PathBuf,
    size: u64,
    checksum: Checksum,
    /// Open for fadvise and the residency mapping.
    file: File,
    residency: Mapping,
    mount: Option<Mount>,
}

impl TestFile {
    /// Creates a private directory in `base` and writes `size` bytes of the pattern.
    fn create(base: &Path, size: u64) -> io::Result<Self> {
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

    fn write(dir: &Path, path: &Path, size: u64) -> io::Result<Self> {
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
        let residency = Mapping::new(&file, size as usize)?;
        let absolute = std::fs::canonicalize(dir)?;
        let mount = std::fs::read_to_string("/proc/self/mountinfo").ok().and_then(|m| mount_of(&m, &absolute));
        Ok(TestFile { dir: dir.to_path_buf(), path: path.to_path_buf(), size, checksum: sum, file, residency, mount })
    }

    fn resident(&self) -> f64 {
        self.residency.resident_fraction().unwrap_or(f64::NAN)
    }

    fn fadvise_dontneed(&self) -> io::Result<()> {
        rustix::fs::fadvise(&self.file, 0, None, rustix::fs::Advice::DontNeed)?;
        Ok(())
    }

    /// Drops the file's pages the way `how` says; returns the fraction still resident.
    fn drop_pages(&self, how: Dropper) -> f64 {
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
    fn warm(&self) -> io::Result<()> {
        read_block(&self.path, 1 << 20).map(drop)
    }

    /// Finds a way to drop the file's pages, trying the unprivileged one first.
    fn find_dropper(&self, notes: &mut Vec<String>) -> Dropper {
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

// ---------------------------------------------------------------------------------------
// The methods. Each opens the file, reads it all, and returns the checksum of what it
// read; opening, mapping and closing are part of the time.

/// Fills `buf` from `reader` as `fread` does: until it is full or the input ends.
fn fread(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// `fread`s of [`STDIO_REQUEST`] bytes from `reader` to its end, checksummed.
///
/// The caller's buffer starts a page: copying out of a cold mapping (`mapio`) runs
/// several times faster or slower depending on where the destination falls in a page
/// relative to the source (measured on AMD EPYC), and a stack array's place moves with
/// every process's random stack offset, so a fixed, plain placement keeps runs
/// comparable.
fn fread_all(reader: &mut impl Read) -> io::Result<Checksum> {
    let mut request = AlignedBuf::new(STDIO_REQUEST);
    let buf = request.as_mut_slice();
    let mut sum = StreamChecksum::new();
    loop {
        let n = fread(reader, buf)?;
        // The program reads the copy, not the source: keep the compiler from
        // checksumming the source and dropping the copy (it can see through a mapping).
        let copied = std::hint::black_box(&mut *buf);
        sum.update(&copied[..n]);
        if n < STDIO_REQUEST {
            return Ok(sum.finish());
        }
    }
}

fn read_stdio(path: &Path) -> io::Result<Checksum> {
    let mut reader = BufReader::with_capacity(STDIO_BUFFER, File::open(path)?);
    fread_all(&mut reader)
}

fn read_block(path: &Path, size: usize) -> io::Result<Checksum> {
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; size];
    let mut sum = StreamChecksum::new();
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(sum.finish()),
            Ok(n) => sum.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn read_mapped(path: &Path, size: u64) -> io::Result<Checksum> {
    let file = File::open(path)?;
    let map = Mapping::new(&file, size as usize)?;
    let mut sum = Checksum::default();
    sum.add_at(0, map.bytes());
    Ok(sum)
}

/// A `stdio`-like reader over a mapped file: each read copies out of the mapping.
#[derive(Debug)]
struct MapReader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Read for MapReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn read_mapio(path: &Path, size: u64) -> io::Result<Checksum> {
    let file = File::open(path)?;
    let map = Mapping::new(&file, size as usize)?;
    fread_all(&mut MapReader { data: map.bytes(), pos: 0 })
}

/// A heap buffer whose usable part starts on an [`DIRECT_ALIGN`] boundary.
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let start = (DIRECT_ALIGN - storage.as_ptr() as usize % DIRECT_ALIGN) % DIRECT_ALIGN;
        AlignedBuf { storage, start, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

fn open_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path)
}

fn read_direct(path: &Path) -> io::Result<Checksum> {
    let mut file = open_direct(path)?;
    let mut buf = AlignedBuf::new(DIRECT_REQUEST);
    let mut sum = Checksum::default();
    let mut offset = 0u64;
    loop {
        match file.read(buf.as_mut_slice()) {
            Ok(0) => return Ok(sum),
            Ok(n) => {
                sum.add_at(offset, &buf.as_slice()[..n]);
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// One io_uring read slot: which part of the file its buffer holds.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    offset: u64,
    len: usize,
    filled: usize,
}

fn read_uring(path: &Path, size: u64, direct: bool) -> io::Result<Checksum> {
    use io_uring::{opcode, types, IoUring};

    let file = if direct { open_direct(path)? } else { File::open(path)? };
    let fd = types::Fd(file.as_raw_fd());
    // Declared before the ring, so dropped after it: the kernel may use registered
    // buffers until the ring is gone.
    let mut bufs: Vec<AlignedBuf> = (0..URING_DEPTH).map(|_| AlignedBuf::new(URING_REQUEST)).collect();
    let mut ring = IoUring::new(URING_DEPTH as u32)?;
    let iovecs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec { iov_base: b.as_mut_slice().as_mut_ptr().cast(), iov_len: b.len })
        .collect();
    // SAFETY: each iovec is one of `bufs`' aligned regions, which neither move (their
    // Vecs are never resized) nor are freed before `ring` is dropped (declared first,
    // dropped last).
    let fixed = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();

    let mut slots = [Slot::default(); URING_DEPTH];
    let mut next = 0u64;
    let mut in_flight = 0usize;
    let mut sum = Checksum::default();
    let mut failure: Option<io::Error> = None;

    // Queues the rest of slot `i`'s read; returns whether it was queued.
    let submit = |ring: &mut IoUring, bufs: &mut [AlignedBuf], slot: Slot, i: usize| -> bool {
        let room = &mut bufs[i].as_mut_slice()[slot.filled..];
        // O_DIRECT lengths must be aligned: ask for whole blocks; the read stops at
        // the end of the file.
        let wanted = slot.len - slot.filled;
        let len = if direct { wanted.next_multiple_of(DIRECT_ALIGN).min(room.len()) } else { wanted } as u32;
        let ptr = room.as_mut_ptr();
        let offset = slot.offset + slot.filled as u64;
        let entry = if fixed {
            opcode::ReadFixed::new(fd, ptr, len, i as u16).offset(offset).build()
        } else {
            opcode::Read::new(fd, ptr, len).offset(offset).build()
        };
        // SAFETY: the entry points into `bufs[i]`, which stays allocated and untouched
        // by us until its completion is reaped: every return below first waits for
        // all reads in flight, or leaks the buffers if it cannot.
        unsafe { ring.submission().push(&entry.user_data(i as u64)) }.is_ok()
    };

    for (i, slot) in slots.iter_mut().enumerate() {
        if next >= size {
            break;
        }
        *slot = Slot { offset: next, len: URING_REQUEST.min((size - next) as usize), filled: 0 };
        next += slot.len as u64;
        if !submit(&mut ring, &mut bufs, *slot, i) {
            failure = Some(io::Error::other("io_uring submission queue full"));
            break;
        }
        in_flight += 1;
    }
    let mut done: Vec<(usize, i32)> = Vec::with_capacity(URING_DEPTH);
    while in_flight > 0 {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Reads may still be in flight into the buffers: leak them rather than
                // free memory the kernel may write.
                std::mem::forget(bufs);
                return Err(e);
            }
        }
        done.clear();
        done.extend(ring.completion().map(|c| (c.user_data() as usize, c.result())));
        for &(i, result) in &done {
            in_flight -= 1;
            let slot = &mut slots[i];
            if result < 0 {
                failure.get_or_insert(io::Error::from_raw_os_error(-result));
                continue;
            }
            if failure.is_some() {
                continue;
            }
            slot.filled = (slot.filled + result as usize).min(slot.len);
            if slot.filled < slot.len {
                if result == 0 {
                    failure = Some(io::Error::new(io::ErrorKind::UnexpectedEof, "file ended early"));
                } else if submit(&mut ring, &mut bufs, *slot, i) {
                    in_flight += 1;
                } else {
                    failure = Some(io::Error::other("io_uring submission queue full"));
                }
                continue;
            }
            sum.add_at(slot.offset, &bufs[i].as_slice()[..slot.filled]);
            if next < size {
                *slot = Slot { offset: next, len: URING_REQUEST.min((size - next) as usize), filled: 0 };
                next += slot.len as u64;
                if submit(&mut ring, &mut bufs, *slot, i) {
                    in_flight += 1;
                } else {
                    failure = Some(io::Error::other("io_uring submission queue full"));
                }
            }
        }
    }
    drop(ring);
    match failure {
        Some(e) => Err(e),
        None => Ok(sum),
    }
}

/// Reads the file once with `method`.
fn read_with(method: Method, path: &Path, size: u64) -> io::Result<Checksum> {
    match method {
        Method::Stdio => read_stdio(path),
        Method::Block(block) => read_block(path, block),
        Method::Mapped => read_mapped(path, size),
        Method::Mapio => read_mapio(path, size),
        Method::Direct => read_direct(path),
        Method::Uring { direct } => read_uring(path, size, direct),
    }
}

// ---------------------------------------------------------------------------------------
// Timing and CPU.

/// Process CPU time and page faults so far.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    user: Duration,
    sys: Duration,
    minor_faults: u64,
    major_faults: u64,
}

fn usage() -> Usage {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` points to writable memory for one rusage that outlives the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return Usage::default();
    }
    // SAFETY: all-zero bytes are a valid rusage (integers only), and getrusage has
    // filled it in.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.clamp(0, 999_999) * 1000) as u32);
    Usage {
        user: tv(ru.ru_utime),
        sys: tv(ru.ru_stime),
        minor_faults: ru.ru_minflt.max(0) as u64,
        major_faults: ru.ru_majflt.max(0) as u64,
    }
}

/// One timed read of the whole file.
#[derive(Debug, Clone, Copy)]
struct RunSample {
    bytes: u64,
    wall: Duration,
    user: Duration,
    sys: Duration,
    minor_faults: u64,
    major_faults: u64,
    resident_before: f64,
}

impl RunSample {
    fn mb_s(&self) -> f64 {
        self.bytes as f64 / self.wall.as_secs_f64().max(1e-9) / 1e6
    }

    fn cpu(&self) -> Duration {
        self.user + self.sys
    }
}

fn timed(method: Method, file: &TestFile, resident_before: f64) -> io::Result<(RunSample, Checksum)> {
    let before = usage();
    let start = Instant::now();
    let sum = read_with(method, &file.path, file.size)?;
    let wall = start.elapsed();
    let after = usage();
    let sample = RunSample {
        bytes: sum.len(),
        wall,
        user: after.user.saturating_sub(before.user),
        sys: after.sys.saturating_sub(before.sys),
        minor_faults: after.minor_faults.saturating_sub(before.minor_faults),
        major_faults: after.major_faults.saturating_sub(before.major_faults),
        resident_before,
    };
    Ok((sample, sum))
}

// ---------------------------------------------------------------------------------------
// Summaries, report, plot.

/// One (method, cache state) summarized over its runs.
#[derive(Debug, Clone, PartialEq)]
struct Summary {
    method: Method,
    cache: Cache,
    mb_s: Throughput,
    cpu_s_per_gb: f64,
    user_s_per_gb: f64,
    sys_s_per_gb: f64,
    cpu_pct: f64,
    minor_faults: u64,
    major_faults: u64,
    /// Most of the file resident when an uncached run started; least for cached ones.
    resident_before: f64,
    /// The best block size for this cache state.
    best_block: bool,
}

fn median(values: &[f64]) -> f64 {
    Throughput::from_runs(values).map_or(f64::NAN, |t| t.median)
}

fn summarize(method: Method, cache: Cache, samples: &[RunSample]) -> Option<Summary> {
    let mb_s = Throughput::from_runs(&samples.iter().map(RunSample::mb_s).collect::<Vec<_>>())?;
    let per_gb = |f: &dyn Fn(&RunSample) -> Duration| {
        median(&samples.iter().map(|s| f(s).as_secs_f64() / (s.bytes as f64 / 1e9)).collect::<Vec<_>>())
    };
    let resident = samples.iter().map(|s| s.resident_before).filter(|r| r.is_finite());
    Some(Summary {
        method,
        cache,
        mb_s,
        cpu_s_per_gb: per_gb(&|s| s.cpu()),
        user_s_per_gb: per_gb(&|s| s.user),
        sys_s_per_gb: per_gb(&|s| s.sys),
        cpu_pct: median(
            &samples.iter().map(|s| 100.0 * s.cpu().as_secs_f64() / s.wall.as_secs_f64()).collect::<Vec<_>>(),
        ),
        minor_faults: median(&samples.iter().map(|s| s.minor_faults as f64).collect::<Vec<_>>()).round() as u64,
        major_faults: median(&samples.iter().map(|s| s.major_faults as f64).collect::<Vec<_>>()).round() as u64,
        resident_before: match cache {
            Cache::Cached => resident.fold(f64::NAN, f64::min),
            Cache::Uncached => resident.fold(f64::NAN, f64::max),
        },
        best_block: false,
    })
}

/// The block size with the highest median throughput (the smaller one on a tie).
fn best_block_size(curve: &[(usize, f64)]) -> Option<usize> {
    curve
        .iter()
        .filter(|(_, rate)| rate.is_finite())
        .fold(None, |best: Option<(usize, f64)>, &(size, rate)| match best {
            Some((b, r)) if r > rate || (r == rate && b < size) => Some((b, r)),
            _ => Some((size, rate)),
        })
        .map(|(size, _)| size)
}

/// Marks the best block size of each cache state.
fn mark_best_blocks(summaries: &mut [Summary]) {
    for cache in [Cache::Cached, Cache::Uncached] {
        let curve: Vec<(usize, f64)> = summaries
            .iter()
            .filter_map(|s| match s.method {
                Method::Block(size) if s.cache == cache => Some((size, s.mb_s.median)),
                _ => None,
            })
            .collect();
        if let Some(best) = best_block_size(&curve) {
            for s in summaries.iter_mut().filter(|s| s.cache == cache) {
                s.best_block = s.method == Method::Block(best);
            }
        }
    }
}

fn find(summaries: &[Summary], cache: Cache, pick: impl Fn(&Summary) -> bool) -> Option<&Summary> {
    summaries.iter().find(|s| s.cache == cache && pick(s))
}

/// The fastest uncached method other than the peer.
fn fastest_uncached(summaries: &[Summary]) -> Option<&Summary> {
    summaries
        .iter()
        .filter(|s| s.cache == Cache::Uncached && s.method != Method::Stdio)
        .max_by(|a, b| a.mb_s.median.total_cmp(&b.mb_s.median))
}

fn row(s: &Summary) -> Value {
    json!({
        "case": format!("{} {}", s.method.label(), s.cache.name()),
        "method": s.method.name(),
        "cache": s.cache.name(),
        "request_bytes": s.method.request_bytes(),
        "mb_s_median": s.mb_s.median,
        "mb_s_min": s.mb_s.min,
        "mb_s_max": s.mb_s.max,
        "runs": s.mb_s.runs,
        "cpu_s_per_gb": s.cpu_s_per_gb,
        "user_s_per_gb": s.user_s_per_gb,
        "sys_s_per_gb": s.sys_s_per_gb,
        "cpu_pct": s.cpu_pct,
        "minor_faults": s.minor_faults,
        "major_faults": s.major_faults,
        "resident_before": finite(s.resident_before),
        "best_block": if s.best_block { Some("yes") } else { None },
    })
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// The paper's Table 2, SCSI column (and IDE for context): method, quantity, text,
/// SCSI KB/s.
const PAPER_TABLE: &[(&str, &str, &str, f64)] = &[
    ("stdio", "stdio read (SCSI)", "840 KB/s (1 KB), CPU 102% (IDE 450 KB/s)", 840.0),
    ("block", "block read, best size (SCSI)", "940 KB/s (8 KB), CPU 112% (IDE 440 KB/s)", 940.0),
    ("mapped", "memory-mapped read (SCSI)", "660 KB/s (1 MB), CPU 54% (IDE 420 KB/s)", 660.0),
    ("mapio", "mapio read (SCSI)", "660 KB/s (20 KB), CPU 68% (IDE 430 KB/s)", 660.0),
];

fn paper_figures(summaries: &[Summary]) -> Vec<PaperFigure> {
    PAPER_TABLE
        .iter()
        .map(|&(name, quantity, paper, kb_s)| {
            let figure = PaperFigure::new(quantity, paper, Some(kb_s / 1000.0), "MB/s", Better::Higher);
            let pick = |s: &Summary| s.method.name() == name && (name != "block" || s.best_block);
            let uncached = find(summaries, Cache::Uncached, pick);
            let cached = find(summaries, Cache::Cached, pick);
            match uncached {
                Some(u) => {
                    let cached_text = cached.map_or(String::new(), |c| {
                        format!("; cached {:.0} MB/s ({})", c.mb_s.median, c.method.label())
                    });
                    figure.ours(
                        Some(u.mb_s.median),
                        format!(
                            "uncached {:.0} MB/s ({}), CPU {:.0}%{cached_text}",
                            u.mb_s.median,
                            u.method.label(),
                            u.cpu_pct
                        ),
                    )
                }
                None => figure.ours(None, format!("{name} not measured")),
            }
        })
        .collect()
}

fn headline(summaries: &[Summary], notes: &mut Vec<String>) -> Option<Headline> {
    let peer = find(summaries, Cache::Uncached, |s| s.method == Method::Stdio);
    let ours = fastest_uncached(summaries);
    match (ours, peer) {
        (Some(ours), Some(peer)) => {
            notes.push(format!(
                "{HEADLINE}: ours is the fastest uncached method, {} ({:.0} MB/s); peer is {} uncached",
                ours.method.label(),
                ours.mb_s.median,
                peer.method.label()
            ));
            Some(Headline::new(HEADLINE, ours.mb_s.median, peer.mb_s.median, PEER_NAME, "MB/s", Better::Higher))
        }
        _ => {
            notes.push(format!("headline {HEADLINE} omitted: needs stdio and another method measured uncached"));
            None
        }
    }
}

/// Builds the report's rows, headline and paper figures from the summaries.
fn fill_report(report: &mut Report, summaries: &[Summary], checksum_rate: Option<Throughput>) {
    report.rows.extend(summaries.iter().map(row));
    if let Some(t) = checksum_rate {
        report.rows.push(json!({
            "case": "checksum only, in memory",
            "mb_s_median": t.median,
            "mb_s_min": t.min,
            "mb_s_max": t.max,
            "runs": t.runs,
        }));
    }
    let mut notes = Vec::new();
    report.headline.extend(headline(summaries, &mut notes));
    report.paper_figures = paper_figures(summaries);
    report.notes.extend(notes);
}

/// One bar of the chart.
#[derive(Debug, Clone, PartialEq)]
struct Bar {
    median: f64,
    min: f64,
    max: f64,
    label: String,
}

/// Bars per method: (method, cached, uncached), in the order of the rows. Block reads
/// show their best size only.
fn bars(report: &Report) -> Vec<(String, Option<Bar>, Option<Bar>)> {
    let mut groups: Vec<(String, Option<Bar>, Option<Bar>)> = Vec::new();
    for r in &report.rows {
        let (Some(method), Some(cache), Some(median)) = (
            r.get("method").and_then(Value::as_str),
            r.get("cache").and_then(Value::as_str),
            r.get("mb_s_median").and_then(Value::as_f64),
        ) else {
            continue;
        };
        if method == "block" && r.get("best_block").and_then(Value::as_str).is_none() {
            continue;
        }
        let value = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(median);
        let size = r.get("request_bytes").and_then(Value::as_u64);
        let label = match (method, size) {
            ("block", Some(size)) => format!("{median:.0} ({})", format_size(size as usize)),
            _ => format!("{median:.0}"),
        };
        let bar = Bar { median, min: value("mb_s_min"), max: value("mb_s_max"), label };
        let name = if method == "block" { "block (best size)" } else { method };
        let index = match groups.iter().position(|g| g.0 == name) {
            Some(i) => i,
            None => {
                groups.push((name.to_string(), None, None));
                groups.len() - 1
            }
        };
        if cache == "cached" {
            groups[index].1 = Some(bar);
        } else {
            groups[index].2 = Some(bar);
        }
    }
    groups
}

/// A round top for a linear axis from 0 and its tick step (1-2-5 steps, at most 10).
fn nice_axis(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.2);
    }
    let magnitude = 10f64.powf((max / 8.0).log10().floor());
    let step =
        [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| max / s <= 10.0).unwrap_or(10.0 * magnitude);
    ((max / step).ceil() * step, step)
}

/// The bar chart of median throughput per method, cached beside uncached, with the
/// runs' min-max as whiskers, from a report's rows.
pub fn plot_svg(report: &Report) -> String {
    use std::fmt::Write as _;
    const W: f64 = 900.0;
    const H: f64 = 500.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 130.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 70.0;
    const COLORS: [&str; 2] = ["#1f77b4", "#ff7f0e"];
    let groups = bars(report);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let top = groups
        .iter()
        .flat_map(|g| [&g.1, &g.2])
        .flatten()
        .map(|b| b.max.max(b.median))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let (y_max, step) = nice_axis(top);
    let py = |v: f64| TOP + plot_h - (v.clamp(0.0, y_max) / y_max) * plot_h;

    let title =
        format!("fileread: read throughput per method (median, min-max){}", if report.quick { " [quick]" } else { "" });
    let mut svg = crate::svg::open_document(W, H, LEFT + plot_w / 2.0, &title);
    let ticks = (y_max / step).round() as usize;
    for k in 0..=ticks {
        let v = k as f64 * step;
        let y = py(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            escape(&format!("{v}"))
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>
<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">MB/s</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    let group_w = plot_w / groups.len().max(1) as f64;
    let bar_w = group_w * 0.35;
    for (g, (name, cached, uncached)) in groups.iter().enumerate() {
        let x0 = LEFT + g as f64 * group_w + group_w * 0.15;
        for (k, bar) in [cached, uncached].into_iter().enumerate() {
            let Some(bar) = bar else { continue };
            let x = x0 + k as f64 * bar_w;
            let y = py(bar.median);
            let cx = x + bar_w / 2.0;
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>
<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="black"/>
<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="9">{}</text>"#,
                bar_w,
                (TOP + plot_h - y).max(0.0),
                COLORS[k],
                escape(&format!("{name} {}: {}", if k == 0 { "cached" } else { "uncached" }, bar.label)),
                py(bar.min),
                py(bar.max),
                py(bar.max.max(bar.median)) - 4.0,
                escape(&bar.label)
            );
        }
        // The method's name under its bars, on two lines when it has two words.
        let cx = LEFT + (g as f64 + 0.5) * group_w;
        let (first, second) = name.split_once(' ').unwrap_or((name, ""));
        let _ = writeln!(
            svg,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle"><tspan x="{cx:.1}">{}</tspan><tspan x="{cx:.1}" dy="14">{}</tspan></text>"#,
            TOP + plot_h + 18.0,
            escape(first),
            escape(second)
        );
    }
    for (k, name) in ["cached", "uncached"].into_iter().enumerate() {
        let y = TOP + 10.0 + k as f64 * 20.0;
        let x = LEFT + plot_w + 16.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{x:.1}" y="{:.1}" width="14" height="10" fill="{}"/>
<text x="{:.1}" y="{:.1}">{name}</text>"#,
            y - 5.0,
            COLORS[k],
            x + 20.0,
            y + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

// ---------------------------------------------------------------------------------------
// The experiment.

/// Sizes and counts of one run of the experiment.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    file_bytes: u64,
    rounds: usize,
    block_sizes: &'static [usize],
}

impl Plan {
    fn new(opts: &FilereadOptions) -> Self {
        let file_bytes = opts.file_bytes.unwrap_or(if opts.quick { QUICK_FILE } else { FULL_FILE }).max(1);
        Plan {
            file_bytes: file_bytes.div_ceil(MIB) * MIB,
            rounds: opts.rounds.unwrap_or(if opts.quick { 3 } else { 7 }).max(1),
            block_sizes: if opts.quick { BLOCK_SIZES_QUICK } else { BLOCK_SIZES },
        }
    }

    fn methods(&self) -> Vec<Method> {
        let mut methods = vec![Method::Stdio];
        methods.extend(self.block_sizes.iter().map(|&s| Method::Block(s)));
        methods.extend([
            Method::Mapped,
            Method::Mapio,
            Method::Direct,
            Method::Uring { direct: false },
            Method::Uring { direct: true },
        ]);
        methods
    }
}

/// Whether `O_DIRECT` reads work on the test file; the reason if not.
fn probe_direct(file: &TestFile) -> Result<(), String> {
    let mut f = open_direct(&file.path).map_err(|e| format!("open(O_DIRECT) failed: {e}"))?;
    let mut buf = AlignedBuf::new(DIRECT_ALIGN);
    f.read(buf.as_mut_slice()).map(drop).map_err(|e| format!("an aligned O_DIRECT read failed: {e}"))
}

/// Whether io_uring can be used here (and whether buffers can be registered with it);
/// the reason if not.
fn probe_uring() -> Result<bool, String> {
    let mut buf = AlignedBuf::new(DIRECT_ALIGN);
    let ring = io_uring::IoUring::new(URING_DEPTH as u32).map_err(|e| {
        let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map_or(String::new(), |v| format!(" (kernel.io_uring_disabled = {})", v.trim()));
        format!("io_uring_setup failed: {e}{sysctl}")
    })?;
    let iovec = [libc::iovec { iov_base: buf.as_mut_slice().as_mut_ptr().cast(), iov_len: DIRECT_ALIGN }];
    // SAFETY: `buf` is declared before `ring`, so it is freed after the ring that
    // registered it is gone; nothing is ever submitted.
    let fixed = unsafe { ring.submitter().register_buffers(&iovec) }.is_ok();
    Ok(fixed)
}

/// Per (method, cache state): samples, or why the method stopped.
struct Track {
    method: Method,
    cached: Vec<RunSample>,
    uncached: Vec<RunSample>,
    failed: Option<String>,
}

/// The in-memory rate of the checksum alone, the ceiling of every cached read.
fn checksum_rate(quick: bool, rounds: usize) -> Option<Throughput> {
    let mut buf = vec![0u8; if quick { 64 << 20 } else { 256 << 20 }];
    fill_pattern(&mut buf, 0, 1);
    let runs: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let mut sum = Checksum::default();
            sum.add_at(0, &buf);
            std::hint::black_box(sum);
            buf.len() as f64 / start.elapsed().as_secs_f64().max(1e-9) / 1e6
        })
        .collect();
    Throughput::from_runs(&runs)
}

/// Runs the experiment, writes the JSON and the SVG chart if asked, and returns the
/// report. Fails if any read returns other bytes than were written.
pub fn run(opts: &FilereadOptions) -> Result<Report, BenchError> {
    let started = Instant::now();
    let conditions = Conditions::capture_before();
    let plan = Plan::new(opts);
    let mut notes: Vec<String> = Vec::new();

    let (base, why) = choose_base(opts.dir.as_deref());
    std::fs::create_dir_all(&base).map_err(|e| BenchError::io(format!("creating {}", base.display()), e))?;
    let mut file_bytes = plan.file_bytes;
    if let Some(free) = free_bytes(&base) {
        // The file takes at most half of what is free beyond the reserve.
        let fits = disk_share(free, 2, file_bytes).ok_or_else(|| {
            BenchError::io(
                format!("{}: not enough free space for the test file", base.display()),
                io::Error::other(format!(
                    "{} MiB free; the smallest test file needs 1 MiB, with {} MiB left for the rest of the machine",
                    free / MIB,
                    DISK_RESERVE / MIB
                )),
            )
        })?;
        if fits < file_bytes {
            notes.push(format!(
                "only {} MiB free in {}: the file is {} MiB instead of {} MiB",
                free / MIB,
                base.display(),
                fits / MIB,
                file_bytes / MIB
            ));
            file_bytes = fits;
        }
    }
    let file = TestFile::create(&base, file_bytes)
        .map_err(|e| BenchError::io(format!("writing the test file in {}", base.display()), e))?;
    let dropper = file.find_dropper(&mut notes);

    let fs_text = match &file.mount {
        Some(m) => {
            let ra = read_ahead_kb(&m.source).map_or(String::new(), |kb| format!(", device readahead {kb} KiB"));
            format!("{} on {} mounted at {}{ra}", m.fstype, m.source, m.point)
        }
        None => "an unknown filesystem".to_string(),
    };
    notes.push(format!(
        "test file: {} MiB in {} ({why}), {fs_text}; written with a known pattern, fsynced, removed at the end",
        file.size / MIB,
        file.dir.display()
    ));
    if memory_backed(&file.dir) {
        notes.push(
            "WARNING: the test file is on a memory-backed filesystem (tmpfs/ramfs): uncached reads are \
             cached; set ICTUS_BENCH_DIR to a directory on a disk"
                .to_string(),
        );
    }

    let direct = probe_direct(&file);
    let uring = probe_uring();
    if uring == Ok(false) {
        notes.push("io_uring could not register buffers here: its reads use plain (unregistered) buffers".to_string());
    }
    let mut tracks: Vec<Track> = Vec::new();
    for method in plan.methods() {
        let refused = match (&direct, &uring) {
            (Err(why), _) if method.needs_direct() => Some(format!("O_DIRECT on {fs_text}: {why}")),
            (_, Err(why)) if method.needs_uring() => Some(why.clone()),
            _ => None,
        };
        match refused {
            Some(why) => notes.push(format!("{} could not run here: {why}", method.label())),
            None => tracks.push(Track { method, cached: Vec::new(), uncached: Vec::new(), failed: None }),
        }
    }

    let mut not_cached = 0.0f64;
    // Round 0 is a warm-up whose times are dropped: it checks every method once and
    // lets first-time costs (fresh page-cache memory, io_uring's workers) fall outside.
    for round in 0..=plan.rounds {
        let warm_up = round == 0;
        let phases = if round % 2 == 1 { [Cache::Cached, Cache::Uncached] } else { [Cache::Uncached, Cache::Cached] };
        for cache in phases {
            if opts.progress {
                match warm_up {
                    true => eprintln!("fileread: warm-up {}", cache.name()),
                    false => eprintln!("fileread: round {}/{} {}", round, plan.rounds, cache.name()),
                }
            }
            if cache == Cache::Cached {
                file.warm().map_err(|e| BenchError::io("reading the test file into the cache", e))?;
            }
            let n = tracks.len();
            for k in 0..n {
                let track = &mut tracks[(round + k) % n];
                if track.failed.is_some() {
                    continue;
                }
                let resident = match cache {
                    Cache::Cached => file.resident(),
                    Cache::Uncached => {
                        // Read it in first, so that every uncached run allocates the
                        // pages its drop has just freed, whatever ran before (see
                        // `free_page_reporting`).
                        file.warm().map_err(|e| BenchError::io("reading the test file into the cache", e))?;
                        file.drop_pages(dropper)
                    }
                };
                if cache == Cache::Cached && !warm_up {
                    not_cached = not_cached.max(1.0 - resident);
                }
                let case = format!("{} {}", track.method.label(), cache.name());
                match timed(track.method, &file, resident) {
                    Ok((sample, sum)) => {
                        check_checksum(&case, file.checksum, sum)?;
                        match cache {
                            _ if warm_up => {}
                            Cache::Cached => track.cached.push(sample),
                            Cache::Uncached => track.uncached.push(sample),
                        }
                    }
                    Err(e) => track.failed = Some(format!("{case}: {e}")),
                }
            }
        }
    }
    let checksums = checksum_rate(opts.quick, plan.rounds.max(3));
    let file_size = file.size;
    drop(file);

    let mut summaries: Vec<Summary> = Vec::new();
    for track in &tracks {
        if let Some(why) = &track.failed {
            notes.push(format!("{} stopped: {why}", track.method.label()));
        }
        summaries.extend(summarize(track.method, Cache::Cached, &track.cached));
        summaries.extend(summarize(track.method, Cache::Uncached, &track.uncached));
    }
    mark_best_blocks(&mut summaries);

    let mut report = Report::new(EXPERIMENT, PAPER, opts.quick, conditions.finish());
    report.hidden_in_table = ["method", "cache", "request_bytes", "user_s_per_gb", "sys_s_per_gb", "minor_faults"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    fill_report(&mut report, &summaries, checksums);
    let erratic: Vec<String> = summaries
        .iter()
        .filter(|s| s.mb_s.max > 1.5 * s.mb_s.min)
        .map(|s| format!("{} {}", s.method.label(), s.cache.name()))
        .collect();
    if !erratic.is_empty() {
        notes.push(format!(
            "runs varied more than 1.5x (min-max) in {}: the machine was noisy (compare medians; rerun to check)",
            erratic.join(", ")
        ));
    }
    if not_cached > 0.05 {
        notes.push(format!(
            "WARNING: up to {:.0}% of the file was not resident when a cached run started (memory pressure)",
            not_cached * 100.0
        ));
    }
    notes.push(format!(
        "{} rounds after an untimed warm-up round; each reads the whole {} MiB file once per method and \
         cache state, methods rotated, cached and uncached phases alternating; MB/s = 10^6 bytes/s, median \
         (min-max) of the rounds",
        plan.rounds,
        file_size / MIB
    ));
    notes.push(format!(
        "methods: stdio = fread-like {} requests into a page-aligned buffer through an {} BufReader; \
         block = read(2) at each size, best marked (the paper kept its best size too); mapped = mmap of \
         the whole file, every byte touched (page faults); mapio = {} fread-like copies out of a \
         whole-file mapping into a page-aligned buffer (the copy's speed depends several-fold on where \
         the buffer falls in a page relative to the source); O_DIRECT = {} aligned read(2)s; io_uring = \
         {URING_DEPTH} reads of {} in flight (registered buffers), through the page cache or with O_DIRECT",
        format_size(STDIO_REQUEST),
        format_size(STDIO_BUFFER),
        format_size(STDIO_REQUEST),
        format_size(DIRECT_REQUEST),
        format_size(URING_REQUEST)
    ));
    notes.push(
        "every run checksums every byte it reads (the `checksum only` row is that work alone, the ceiling of \
         cached reads); all checksums matched the file written"
            .to_string(),
    );
    notes.push(
        "CPU: getrusage(RUSAGE_SELF) user+sys per run (io_uring's kernel workers included, device interrupts \
         not); cpu_pct = CPU / wall, as the paper's CPU %; O_DIRECT bypasses the page cache, so its cached and \
         uncached rows both read the device"
            .to_string(),
    );
    notes.push(format!(
        "each uncached run reads the file in (untimed) and drops it just before, so that it allocates \
         the pages just freed whatever ran before it{}",
        if free_page_reporting() {
            "; this VM reports free memory to its host (virtio-balloon free page reporting), and memory \
             left free for a few seconds costs a host fault per page when next used, which shows as \
             slow uncached runs with high system CPU"
        } else {
            ""
        }
    ));
    notes.push(
        "the paper read a 30 MB file on a 16 MB machine (33 MHz i486, SCSI and IDE disks, Mach 3.0); here the \
         file fits in memory, so uncached means its pages were dropped first; on a virtual machine the host may \
         still cache the disk image, so uncached may not reach the physical disk"
            .to_string(),
    );
    notes.push(format!("measured in {:.1} s", started.elapsed().as_secs_f64()));
    report.notes.extend(notes);

    if let Some(path) = &opts.json {
        report.write_json_and_plot(path, &plot_svg(&report))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len.div_ceil(8) * 8];
        fill_pattern(&mut data, 0, 7);
        data.truncate(len);
        data
    }

    fn one_shot(data: &[u8]) -> Checksum {
        let mut sum = Checksum::default();
        sum.add_at(0, data);
        sum
    }

    #[test]
    fn the_test_file_shrinks_to_fit_a_nearly_full_disk() {
        // Plenty of room: the file asked for.
        assert_eq!(disk_share(100 << 30, 2, FULL_FILE), Some(FULL_FILE));
        // 127 MiB free (seen on a CI machine): half of what is beyond the reserve.
        assert_eq!(disk_share(127 * MIB, 2, 8 * MIB), Some(8 * MIB));
        assert_eq!(disk_share(127 * MIB, 2, FULL_FILE), Some(31 * MIB));
        // Whole MiB, never below the smallest file, never into the reserve.
        assert_eq!(disk_share(DISK_RESERVE + 3 * MIB + 5, 2, FULL_FILE), Some(MIB));
        assert_eq!(disk_share(DISK_RESERVE + MIB, 2, FULL_FILE), None);
        assert_eq!(disk_share(0, 2, MIB), None);
    }

    #[test]
    fn checksum_pieces_in_any_order_agree() {
        let data = pattern(10_003);
        let whole = one_shot(&data);
        assert_eq!(whole.len(), 10_003);

        // In order, in pieces of awkward lengths.
        let mut stream = StreamChecksum::new();
        let mut rest = &data[..];
        for size in [1usize, 3, 7, 8, 9, 1024, 5, 4096].iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let n = (*size).min(rest.len());
            stream.update(&rest[..n]);
            rest = &rest[n..];
        }
        assert_eq!(stream.finish(), whole);

        // Word-aligned pieces, last first (as io_uring completions may come).
        let mut backwards = Checksum::default();
        let chunks: Vec<(usize, &[u8])> = data.chunks(1000).enumerate().map(|(i, c)| (i * 1000, c)).collect();
        for (offset, chunk) in chunks.into_iter().rev() {
            backwards.add_at(offset as u64, chunk);
        }
        assert_eq!(backwards, whole);
        assert!(Checksum::default().is_empty());
        assert_eq!(StreamChecksum::new().finish(), Checksum::default());
    }

    #[test]
    fn checksum_sees_content_position_and_length() {
        let data = pattern(4096);
        let whole = one_shot(&data);
        let mut swapped = data.clone();
        swapped[..8].copy_from_slice(&data[8..16]);
        swapped[8..16].copy_from_slice(&data[..8]);
        assert_ne!(one_shot(&swapped), whole, "reordered words");
        let mut flipped = data.clone();
        flipped[1000] ^= 0x10;
        assert_ne!(one_shot(&flipped), whole, "one bit");
        let mut longer = data.clone();
        longer.push(0);
        assert_ne!(one_shot(&longer), whole, "a trailing zero byte");
    }

    #[test]
    fn a_mismatch_fails_the_experiment() {
        let good = one_shot(&pattern(64));
        assert!(check_checksum("stdio 1 KiB cached", good, good).is_ok());
        let err = check_checksum("mapped uncached", good, one_shot(&pattern(56))).expect_err("mismatch");
        assert!(err.to_string().contains("mapped uncached"), "{err}");
    }

    #[test]
    fn the_pattern_does_not_depend_on_how_it_is_cut() {
        let mut whole = vec![0u8; 4096];
        fill_pattern(&mut whole, 0, 42);
        let mut pieces = vec![0u8; 4096];
        for (i, chunk) in pieces.chunks_mut(512).enumerate() {
            fill_pattern(chunk, i as u64 * 512, 42);
        }
        assert_eq!(whole, pieces);
        let mut other = vec![0u8; 4096];
        fill_pattern(&mut other, 0, 43);
        assert_ne!(whole, other, "the seed matters");
    }

    /// A reader that returns at most 3 bytes per call.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(3).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn fread_fills_across_short_reads() {
        let data = pattern(3 * STDIO_REQUEST + 17);
        let mut buf = [0u8; STDIO_REQUEST];
        assert_eq!(fread(&mut Trickle(&data), &mut buf).expect("read"), STDIO_REQUEST);
        assert_eq!(&buf[..], &data[..STDIO_REQUEST]);
        assert_eq!(fread_all(&mut Trickle(&data)).expect("read"), one_shot(&data));
        assert_eq!(fread_all(&mut MapReader { data: &data, pos: 0 }).expect("read"), one_shot(&data));
        assert_eq!(fread_all(&mut MapReader { data: &[], pos: 0 }).expect("read"), Checksum::default());
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [DIRECT_ALIGN, URING_REQUEST] {
            let mut buf = AlignedBuf::new(len);
            assert_eq!(buf.as_mut_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
            assert_eq!(buf.as_slice().len(), len);
        }
    }

    #[test]
    fn the_best_block_size_is_the_fastest_median() {
        assert_eq!(best_block_size(&[(4096, 100.0), (65536, 300.0), (1 << 20, 200.0)]), Some(65536));
        assert_eq!(best_block_size(&[(65536, 300.0), (4096, 300.0)]), Some(4096), "a tie goes to the smaller");
        assert_eq!(best_block_size(&[(4096, f64::NAN), (8192, 1.0)]), Some(8192));
        assert_eq!(best_block_size(&[]), None);
    }

    fn fake(method: Method, cache: Cache, mb_s: f64) -> Summary {
        Summary {
            method,
            cache,
            mb_s: Throughput::from_runs(&[mb_s * 0.9, mb_s, mb_s * 1.1]).expect("runs"),
            cpu_s_per_gb: 0.1,
            user_s_per_gb: 0.04,
            sys_s_per_gb: 0.06,
            cpu_pct: 40.0,
            minor_faults: 0,
            major_faults: 0,
            resident_before: if cache == Cache::Cached { 1.0 } else { 0.0 },
            best_block: false,
        }
    }

    fn fake_summaries() -> Vec<Summary> {
        let mut s = Vec::new();
        for (method, cached, uncached) in [
            (Method::Stdio, 8000.0, 2600.0),
            (Method::Block(4096), 6000.0, 2500.0),
            (Method::Block(1 << 20), 17000.0, 3500.0),
            (Method::Block(256 << 10), 18000.0, 3400.0),
            (Method::Mapped, 23000.0, 3300.0),
            (Method::Mapio, 5400.0, 2800.0),
            (Method::Direct, 1000.0, 1100.0),
            (Method::Uring { direct: true }, 1500.0, 3900.0),
        ] {
            s.push(fake(method, Cache::Cached, cached));
            s.push(fake(method, Cache::Uncached, uncached));
        }
        mark_best_blocks(&mut s);
        s
    }

    #[test]
    fn each_cache_state_has_its_own_best_block() {
        let s = fake_summaries();
        let best: Vec<(Cache, Method)> = s.iter().filter(|s| s.best_block).map(|s| (s.cache, s.method)).collect();
        assert_eq!(best, [(Cache::Uncached, Method::Block(1 << 20)), (Cache::Cached, Method::Block(256 << 10))]);
    }

    #[test]
    fn the_headline_is_the_fastest_uncached_method_against_stdio() {
        let mut report = Report::new(EXPERIMENT, PAPER, true, Conditions::capture_before());
        fill_report(&mut report, &fake_summaries(), Throughput::from_runs(&[30000.0]));
        assert_eq!(report.headline.len(), 1);
        let h = &report.headline[0];
        assert_eq!((h.name.as_str(), h.peer_name.as_str(), h.unit.as_str()), (HEADLINE, PEER_NAME, "MB/s"));
        assert_eq!((h.ours, h.peer, h.better), (3900.0, 2600.0, Better::Higher));
        assert!(h.target.is_none());
        assert!(report.notes[0].contains("io_uring O_DIRECT 8x1 MiB"), "{:?}", report.notes);

        let quantities: Vec<&str> = report.paper_figures.iter().map(|f| f.quantity.as_str()).collect();
        assert_eq!(
            quantities,
            ["stdio read (SCSI)", "block read, best size (SCSI)", "memory-mapped read (SCSI)", "mapio read (SCSI)"]
        );
        let block = &report.paper_figures[1];
        assert_eq!((block.paper_value, block.ours_value), (Some(0.94), Some(3500.0)));
        assert!(block.ours.contains("block 1 MiB") && block.ours.contains("cached 18000 MB/s (block 256 KiB)"));

        // 16 method rows and the checksum row, each with a case.
        assert_eq!(report.rows.len(), 17);
        let stdio = &report.rows[1];
        assert_eq!(stdio["case"], "stdio 1 KiB uncached");
        assert_eq!((stdio["method"].as_str(), stdio["cache"].as_str()), (Some("stdio"), Some("uncached")));
        assert_eq!(stdio["request_bytes"], STDIO_REQUEST);
        assert_eq!(report.rows[5]["best_block"], "yes");
        assert!(report.rows[2]["best_block"].is_null());
        assert_eq!(report.rows[8]["request_bytes"], Value::Null, "a mapping requests nothing");
    }

    #[test]
    fn without_stdio_there_is_no_headline() {
        let summaries: Vec<Summary> =
            fake_summaries().into_iter().filter(|s| s.method != Method::Stdio || s.cache == Cache::Cached).collect();
        let mut report = Report::new(EXPERIMENT, PAPER, true, Conditions::capture_before());
        fill_report(&mut report, &summaries, None);
        assert!(report.headline.is_empty());
        assert!(report.notes.iter().any(|n| n.contains("omitted")));
        assert_eq!(report.paper_figures[0].ours, "stdio not measured");
    }

    fn balanced(xml: &str) -> Result<(), String> {
        crate::svg::check_well_formed(xml)
    }

    #[test]
    fn the_bar_chart_is_well_formed() {
        let mut report = Report::new(EXPERIMENT, PAPER, true, Conditions::capture_before());
        fill_report(&mut report, &fake_summaries(), Throughput::from_runs(&[30000.0]));
        let svg = plot_svg(&report);
        balanced(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        assert!(svg.starts_with("<?xml") && svg.ends_with("</svg>\n"));
        for text in [">stdio<", ">block<", ">(best size)<", ">mapped<", ">mapio<", ">O_DIRECT<", ">io_uring<"] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(svg.contains(">3500 (1 MiB)<") && svg.contains(">18000 (256 KiB)<"), "best block bars");
        assert!(!svg.contains(">6000 (4 KiB)<"), "only the best block size is drawn");
        assert!(!svg.contains("checksum"), "the checksum row is no method");
        // Two bars for each of the 6 methods (block once, at its best), each with a title.
        assert_eq!(svg.matches("<title>").count(), 12);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));

        report.rows.clear();
        balanced(&plot_svg(&report)).expect("an empty chart is well-formed");
    }

    #[test]
    fn axes_get_round_tops_and_steps() {
        assert_eq!(nice_axis(23_000.0), (25_000.0, 5_000.0));
        assert_eq!(nice_axis(3_509.0), (4_000.0, 500.0));
        assert_eq!(nice_axis(1.0), (1.0, 0.1));
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(nice_axis(f64::NAN), (1.0, 0.2));
    }

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

    #[test]
    fn plans_follow_the_mode() {
        let quick = Plan::new(&FilereadOptions { quick: true, ..FilereadOptions::default() });
        assert_eq!((quick.file_bytes, quick.rounds, quick.block_sizes), (QUICK_FILE, 3, BLOCK_SIZES_QUICK));
        let full = Plan::new(&FilereadOptions::default());
        assert_eq!((full.file_bytes, full.rounds, full.block_sizes.len()), (FULL_FILE, 7, 11));
        let small = Plan::new(&FilereadOptions { file_bytes: Some(3), rounds: Some(0), ..FilereadOptions::default() });
        assert_eq!((small.file_bytes, small.rounds), (MIB, 1));
        let methods = full.methods();
        assert_eq!(methods.len(), 1 + BLOCK_SIZES.len() + 5);
        assert_eq!(methods[0], Method::Stdio);
        assert!(BLOCK_SIZES.windows(2).all(|w| w[0] < w[1]));
        assert!(BLOCK_SIZES_QUICK.iter().all(|s| BLOCK_SIZES.contains(s)));
        let labels: Vec<String> = methods.iter().map(|m| m.label()).collect();
        assert!(labels.contains(&"io_uring O_DIRECT 8x1 MiB".to_string()), "{labels:?}");
        assert!(labels.contains(&"mapped".to_string()) && labels.contains(&"block 4 KiB".to_string()));
    }

    /// Every method reads back exactly the bytes written, including an odd-sized tail,
    /// and the file and its directory are gone afterwards.
    #[test]
    fn every_method_reads_the_file_written() {
        let (base, _) = choose_base(None);
        let file = TestFile::create(&base, 3 * MIB + 4099).expect("test file");
        let direct = probe_direct(&file).is_ok();
        let uring = probe_uring().is_ok();
        let mut methods = Plan::new(&FilereadOptions { quick: true, ..FilereadOptions::default() }).methods();
        methods.retain(|m| (direct || !m.needs_direct()) && (uring || !m.needs_uring()));
        for method in methods {
            let sum = read_with(method, &file.path, file.size).unwrap_or_else(|e| panic!("{method:?}: {e}"));
            assert_eq!(sum, file.checksum, "{method:?}");
        }
        let resident = file.drop_pages(Dropper::Fadvise);
        assert!((0.0..=1.0).contains(&resident), "{resident}");
        let (dir, path) = (file.dir.clone(), file.path.clone());
        drop(file);
        assert!(!path.exists() && !dir.exists());
    }
}
