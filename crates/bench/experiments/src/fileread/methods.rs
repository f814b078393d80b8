//! The methods. Each opens the file, reads it all, and returns the checksum of what it
//! read; opening, mapping and closing are part of the time.

// io_uring's submissions point into our buffers, and a mapping's bytes are read in
// place: each says what keeps them valid.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ictus_bench::sys::{self, Protection};

use super::checksum::{Checksum, StreamChecksum};
use super::testfile::TestFile;
use super::{Method, DIRECT_ALIGN, DIRECT_REQUEST, STDIO_BUFFER, STDIO_REQUEST, URING_DEPTH, URING_REQUEST};

/// Fills `buf` from `reader` as `fread` does: until it is full or the input ends.
pub(super) fn fread(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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
pub(super) fn fread_all(reader: &mut impl Read) -> io::Result<Checksum> {
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

pub(super) fn read_block(path: &Path, size: usize) -> io::Result<Checksum> {
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
    let map = sys::map_file(&file, size as usize, Protection::Read)?;
    let mut sum = Checksum::default();
    // SAFETY: the file is the experiment's own, only read while mapped and never
    // truncated or written meanwhile, so its bytes neither change nor vanish under
    // the slice.
    sum.add_at(0, unsafe { map.as_slice() });
    Ok(sum)
}

/// A `stdio`-like reader over a mapped file: each read copies out of the mapping.
#[derive(Debug)]
pub(super) struct MapReader<'a> {
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
    let map = sys::map_file(&file, size as usize, Protection::Read)?;
    // SAFETY: as in `read_mapped`: the file is ours and nothing changes it meanwhile.
    fread_all(&mut MapReader { data: unsafe { map.as_slice() }, pos: 0 })
}

/// A heap buffer whose usable part starts on an [`DIRECT_ALIGN`] boundary.
pub(super) struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub(super) fn new(len: usize) -> Self {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let start = (DIRECT_ALIGN - storage.as_ptr() as usize % DIRECT_ALIGN) % DIRECT_ALIGN;
        AlignedBuf { storage, start, len }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

pub(super) fn open_direct(path: &Path) -> io::Result<File> {
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
pub(super) fn read_with(method: Method, path: &Path, size: u64) -> io::Result<Checksum> {
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

/// One timed read of the whole file.
#[derive(Debug, Clone, Copy)]
pub(super) struct RunSample {
    pub(super) bytes: u64,
    pub(super) wall: Duration,
    pub(super) user: Duration,
    pub(super) sys: Duration,
    pub(super) minor_faults: u64,
    pub(super) major_faults: u64,
    pub(super) resident_before: f64,
}

impl RunSample {
    pub(super) fn mb_s(&self) -> f64 {
        self.bytes as f64 / self.wall.as_secs_f64().max(1e-9) / 1e6
    }

    pub(super) fn cpu(&self) -> Duration {
        self.user + self.sys
    }
}

pub(super) fn timed(method: Method, file: &TestFile, resident_before: f64) -> io::Result<(RunSample, Checksum)> {
    let before = sys::process_usage();
    let start = Instant::now();
    let sum = read_with(method, &file.path, file.size)?;
    let wall = start.elapsed();
    let after = sys::process_usage();
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

/// Whether `O_DIRECT` reads work on the test file; the reason if not.
pub(super) fn probe_direct(file: &TestFile) -> Result<(), String> {
    let mut f = open_direct(&file.path).map_err(|e| format!("open(O_DIRECT) failed: {e}"))?;
    let mut buf = AlignedBuf::new(DIRECT_ALIGN);
    f.read(buf.as_mut_slice()).map(drop).map_err(|e| format!("an aligned O_DIRECT read failed: {e}"))
}

/// Whether io_uring can be used here (and whether buffers can be registered with it);
/// the reason if not.
pub(super) fn probe_uring() -> Result<bool, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fileread::checksum::fill_pattern;
    use crate::fileread::testfile::{choose_base, Dropper};
    use crate::fileread::{FilereadOptions, Plan, MIB};

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
