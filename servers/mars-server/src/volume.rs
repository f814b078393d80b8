//! Striped volumes on files or block devices (the paper's ccd): create, open, add
//! streams, describe; and the [`Storage`] trait the engine reads through.
//!
//! A volume is a set of components, each starting with the same label
//! ([`ictus_mars::label`]) apart from its index. Writes go through the page cache and are
//! synced before the label that names them is written, so a crash while adding a stream
//! leaves the old label, which does not name the half-written bytes. Reads by the server
//! use `O_DIRECT` ([`Volume::open_direct`]) where the file system allows it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ictus_mars::hls::{playlist, TsIndexer};
use ictus_mars::label::{valid_name, Geometry, Label, LabelError, StreamEntry, LABEL_BYTES};

/// Why a volume operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A system call failed on a component or source file.
    #[error("{path}: {source}")]
    Io {
        /// Which file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A label could not be read or made.
    #[error("{path}: {source}")]
    Label {
        /// Which component.
        path: PathBuf,
        /// Why.
        #[source]
        source: LabelError,
    },
    /// The components given do not form one volume.
    #[error("not one volume: {0}")]
    Mismatch(String),
    /// A stream name is not allowed.
    #[error("bad stream name {0:?} (1 to 64 of A-Z a-z 0-9 . _ - /, no empty or dot components)")]
    BadName(String),
    /// A stream with this name exists.
    #[error("stream {0:?} exists")]
    Exists(String),
    /// Not enough room.
    #[error("no room: {need} bytes needed, {free} free")]
    Full {
        /// Bytes needed.
        need: u64,
        /// Bytes free.
        free: u64,
    },
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io { path: path.to_path_buf(), source }
}

/// One open component.
#[derive(Debug)]
pub struct Component {
    /// Its path.
    pub path: PathBuf,
    /// Opened for reading and writing (through the page cache).
    pub file: File,
}

/// An open volume.
#[derive(Debug)]
pub struct Volume {
    /// The components, in index order.
    pub components: Vec<Component>,
    /// The label (index of component 0).
    pub label: Label,
}

/// Bytes of a component: its length, or for a block device the end found by seeking.
fn size_of(file: &mut File) -> io::Result<u64> {
    let meta = file.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let end = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(0))?;
    Ok(end)
}

/// 64 random bits (from `/dev/urandom`; the clock and pid if that fails).
pub fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        return (t as u64) ^ u64::from(std::process::id()).rotate_left(32);
    }
    u64::from_le_bytes(b)
}

impl Volume {
    /// Makes a new volume over `paths` with the given interleave. Files that do not
    /// exist are created with `create_size` bytes (if given); existing files and block
    /// devices are used at their size. Every component's label is overwritten.
    pub fn create(paths: &[PathBuf], interleave: u64, create_size: Option<u64>) -> Result<Volume, VolumeError> {
        let mut components = Vec::new();
        let mut smallest = u64::MAX;
        // What each component is, whatever path names it: one file (or device) given
        // twice would hold two components' labels and stripes at once.
        let mut seen: Vec<((u64, u64), &PathBuf)> = Vec::new();
        for path in paths {
            let mut file = match (OpenOptions::new().read(true).write(true).open(path), create_size) {
                (Ok(f), _) => f,
                (Err(e), Some(size)) if e.kind() == io::ErrorKind::NotFound => {
                    let f =
                        OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(io_at(path))?;
                    f.set_len(size).map_err(io_at(path))?;
                    f
                }
                (Err(e), _) => return Err(io_at(path)(e)),
            };
            let meta = file.metadata().map_err(io_at(path))?;
            let identity = if meta.file_type().is_block_device() { (0, meta.rdev()) } else { (meta.dev(), meta.ino()) };
            if let Some((_, first)) = seen.iter().find(|(id, _)| *id == identity) {
                return Err(VolumeError::Mismatch(format!(
                    "{} and {} are the same {}",
                    first.display(),
                    path.display(),
                    if identity.0 == 0 { "device" } else { "file" }
                )));
            }
            seen.push((identity, path));
            let size = size_of(&mut file).map_err(io_at(path))?;
            smallest = smallest.min(size.saturating_sub(LABEL_BYTES));
            components.push(Component { path: path.clone(), file });
        }
        let count = u16::try_from(paths.len()).map_err(|_| VolumeError::Mismatch("too many components".into()))?;
        let geometry = Geometry::new(interleave, count, smallest)
            .map_err(|source| VolumeError::Label { path: paths.first().cloned().unwrap_or_default(), source })?;
        let label = Label { volume_id: random_id(), index: 0, geometry, generation: 1, streams: Vec::new() };
        let mut v = Volume { components, label };
        v.write_labels()?;
        Ok(v)
    }

    /// Opens the volume whose components are `paths` (in any order).
    pub fn open(paths: &[PathBuf]) -> Result<Volume, VolumeError> {
        let mut found: Vec<(Label, Component)> = Vec::new();
        for path in paths {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .or_else(|_| File::open(path))
                .map_err(io_at(path))?;
            let mut buf = vec![0u8; LABEL_BYTES as usize];
            file.read_exact_at(&mut buf, 0).map_err(io_at(path))?;
            let label = Label::decode(&buf).map_err(|source| VolumeError::Label { path: path.clone(), source })?;
            found.push((label, Component { path: path.clone(), file }));
        }
        let Some((first, _)) = found.first() else { return Err(VolumeError::Mismatch("no components given".into())) };
        let first = first.clone();
        if found.len() != usize::from(first.geometry.components) {
            return Err(VolumeError::Mismatch(format!(
                "the volume has {} components, {} given",
                first.geometry.components,
                found.len()
            )));
        }
        for (l, c) in &found {
            let same = Label { index: first.index, ..l.clone() };
            if same != first {
                return Err(VolumeError::Mismatch(format!(
                    "{} belongs to another volume or another generation of it",
                    c.path.display()
                )));
            }
        }
        found.sort_by_key(|(l, _)| l.index);
        if found.iter().enumerate().any(|(i, (l, _))| usize::from(l.index) != i) {
            return Err(VolumeError::Mismatch("two components claim one index".into()));
        }
        let label = Label { index: 0, ..first };
        Ok(Volume { components: found.into_iter().map(|(_, c)| c).collect(), label })
    }

    fn write_labels(&mut self) -> Result<(), VolumeError> {
        for (i, c) in self.components.iter().enumerate() {
            let l = Label { index: i as u16, ..self.label.clone() };
            let bytes = l.encode().map_err(|source| VolumeError::Label { path: c.path.clone(), source })?;
            c.file.write_all_at(&bytes, 0).map_err(io_at(&c.path))?;
            c.file.sync_data().map_err(io_at(&c.path))?;
        }
        Ok(())
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.label.geometry
    }

    /// Bytes not yet used by streams.
    pub fn free(&self) -> u64 {
        self.geometry().capacity().saturating_sub(self.label.free_start())
    }

    /// Writes `data` (of `len` bytes, read from `src`) as the stream `name`.
    fn add_reader(&mut self, name: &str, src: &mut dyn Read, len: u64, src_path: &Path) -> Result<(), VolumeError> {
        if !valid_name(name) {
            return Err(VolumeError::BadName(name.to_string()));
        }
        if self.label.find(name).is_some() {
            return Err(VolumeError::Exists(name.to_string()));
        }
        let start = self.label.free_start();
        if start.checked_add(len).map_or(true, |end| end > self.geometry().capacity()) {
            return Err(VolumeError::Full { need: len, free: self.free() });
        }
        let g = self.geometry();
        let mut buf = vec![0u8; g.interleave as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(g.interleave - (start + done) % g.interleave);
            src.read_exact(&mut buf[..n as usize]).map_err(io_at(src_path))?;
            let mut at = 0usize;
            for p in g.map(start + done, n) {
                let c = &self.components[usize::from(p.component)];
                c.file.write_all_at(&buf[at..at + p.len as usize], p.offset).map_err(io_at(&c.path))?;
                at += p.len as usize;
            }
            done += n;
        }
        for c in &self.components {
            c.file.sync_data().map_err(io_at(&c.path))?;
        }
        self.label.generation += 1;
        self.label.streams.push(StreamEntry { name: name.to_string(), start, len, generation: self.label.generation });
        self.write_labels()
    }

    /// Adds the file at `src` as stream `name`. A transport stream (`.ts`) also gets
    /// its HLS playlist, `NAME` with `.m3u8` for `.ts`, segments of about `hls_target`
    /// seconds; returns the playlist's name if one was made.
    pub fn add_file(&mut self, name: &str, src: &Path, hls_target: f64) -> Result<Option<String>, VolumeError> {
        let mut f = File::open(src).map_err(io_at(src))?;
        let len = f.metadata().map_err(io_at(src))?.len();
        self.add_reader(name, &mut f, len, src)?;
        let Some(stem) = name.strip_suffix(".ts") else { return Ok(None) };
        let mut ix = TsIndexer::new();
        let mut f = File::open(src).map_err(io_at(src))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(io_at(src))?;
            if n == 0 {
                break;
            }
            ix.feed(&buf[..n]);
        }
        let Ok(segments) = ix.segments(len, hls_target) else { return Ok(None) };
        let uri = name.rsplit('/').next().unwrap_or(name);
        let text = playlist(uri, &segments);
        let pl = format!("{stem}.m3u8");
        if valid_name(&pl) && self.label.find(&pl).is_none() {
            self.add_reader(&pl, &mut text.as_bytes(), text.len() as u64, src)?;
            return Ok(Some(pl));
        }
        Ok(None)
    }

    /// Reads `buf.len()` bytes of the volume at `offset` through the page cache (for
    /// checks and tools; the server reads with `O_DIRECT`).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        for p in self.geometry().map(offset, buf.len() as u64) {
            let c = &self.components[usize::from(p.component)];
            c.file.read_exact_at(&mut buf[p.at as usize..(p.at + p.len) as usize], p.offset).map_err(io_at(&c.path))?;
        }
        Ok(())
    }

    /// A description for `ictus mars volume info`.
    pub fn describe(&self) -> String {
        let l = &self.label;
        let mut s = format!(
            "volume {:016x}, generation {}\n{}\nused {} bytes, free {} bytes\ncomponents:\n",
            l.volume_id,
            l.generation,
            l.geometry,
            l.free_start(),
            self.free()
        );
        for (i, c) in self.components.iter().enumerate() {
            s.push_str(&format!("  {i}: {}\n", c.path.display()));
        }
        s.push_str(&format!("streams ({}):\n", l.streams.len()));
        for st in &l.streams {
            s.push_str(&format!("  {}  {} bytes at {}  etag {}\n", st.name, st.len, st.start, etag(l, st)));
        }
        s
    }

    /// Opens every component again for the server's reads: with `O_DIRECT` if the file
    /// system allows (the returned flag says), else through the page cache.
    pub fn open_direct(&self) -> Result<(Vec<File>, bool), VolumeError> {
        let mut direct = true;
        let mut out = Vec::new();
        for c in &self.components {
            let f = match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&c.path) {
                Ok(f) if probe_direct(&f) => f,
                _ => {
                    direct = false;
                    File::open(&c.path).map_err(io_at(&c.path))?
                }
            };
            out.push(f);
        }
        if !direct {
            // Mixed modes would make alignment rules differ per component: all or none.
            out = self
                .components
                .iter()
                .map(|c| File::open(&c.path).map_err(io_at(&c.path)))
                .collect::<Result<_, _>>()?;
        }
        Ok((out, direct))
    }
}

/// An aligned `O_DIRECT` read of the label works (tmpfs, for one, refuses `O_DIRECT` at
/// open; some file systems only at the first read).
fn probe_direct(f: &File) -> bool {
    let layout = std::alloc::Layout::from_size_align(4096, 4096).expect("valid layout");
    let mut v = AlignedVec::new(layout);
    f.read_at(v.as_mut_slice(), 0).is_ok()
}

/// A heap block with an alignment, for the `O_DIRECT` probe.
struct AlignedVec {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedVec {
    fn new(layout: std::alloc::Layout) -> AlignedVec {
        let storage = vec![0u8; layout.size() + layout.align()];
        let start = (layout.align() - storage.as_ptr() as usize % layout.align()) % layout.align();
        AlignedVec { storage, start, len: layout.size() }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// A stream's strong entity tag: the volume id and the generation that wrote it.
pub fn etag(label: &Label, s: &StreamEntry) -> String {
    format!("\"{:016x}-{:x}\"", label.volume_id, s.generation)
}

/// What the engine needs of a stream: where its bytes are and its validator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// The name.
    pub name: String,
    /// Bytes.
    pub len: u64,
    /// Strong entity tag, quoted.
    pub etag: String,
    /// First byte in the backend's address space.
    pub start: u64,
}

/// One device read of a stream range: component `device`, `len` bytes at `offset`,
/// into the buffer at `at`.
pub type DeviceRead = ictus_mars::label::Piece;

/// Storage behind the engine, streams addressed by name. A local striped volume is one;
/// a cluster backend (issue 20: Ceph) can be another, as long as a stream's bytes can be
/// read as device reads into registered buffers.
pub trait Storage: Send + Sync {
    /// The stream called `name`.
    fn lookup(&self, name: &str) -> Option<StreamInfo>;
    /// Every stream.
    fn streams(&self) -> Vec<StreamInfo>;
    /// The device reads covering `[start, start + len)` of the backend's address space.
    fn plan(&self, start: u64, len: u64) -> Vec<DeviceRead>;
    /// The devices, for reads (index = [`DeviceRead::component`]).
    fn devices(&self) -> Vec<BorrowedFd<'_>>;
    /// Whether reads bypass the page cache (`O_DIRECT`), so must be aligned.
    fn direct(&self) -> bool;
    /// Alignment of offsets, lengths and buffers for reads.
    fn align(&self) -> u64;
    /// The largest single device read the plan makes.
    fn max_read(&self) -> u64;
    /// The same devices opened through the page cache (index = [`DeviceRead::component`]),
    /// for full-speed downloads spliced from the page cache to the socket; empty if the
    /// backend has none (downloads then take the `O_DIRECT` path of the streams).
    fn cached(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }
    /// The engine is done with the read that [`Storage::plan`] gave at `offset` of
    /// `device` (completed, failed, or dropped unsubmitted): a backend that pins what it
    /// planned (a cache: `crate::ceph`) may reuse those bytes. A volume pins nothing.
    fn done(&self, _device: u16, _offset: u64) {}
    /// Whether [`Storage::plan`] of `[start, start + len)` would answer without waiting.
    /// A backend that fetches from afar (a cluster: `crate::ceph`) starts fetching what
    /// is missing and says no; the engine then waits for [`Storage::set_waker`]'s call
    /// instead of blocking its thread in `plan` (every other stream would wait too). A
    /// volume is always ready.
    fn ready(&self, _start: u64, _len: u64) -> bool {
        true
    }
    /// Whether [`Storage::lookup`] of `name` would answer without a round trip to afar.
    /// A backend that asks a cluster (`crate::ceph`: a `stat`) starts the lookup on
    /// another thread and says no; the engine holds the request until
    /// [`Storage::set_waker`]'s call and asks again, so one slow `stat` never delays
    /// the node's other streams. A volume always knows.
    fn lookup_ready(&self, _name: &str) -> bool {
        true
    }
    /// The function to call when bytes that [`Storage::ready`] said were missing, or a
    /// lookup [`Storage::lookup_ready`] started, may have come (from any thread;
    /// spurious calls are harmless).
    fn set_waker(&self, _wake: Box<dyn Fn() + Send + Sync>) {}
}

/// A local striped volume as [`Storage`]: the label read at open, the components opened
/// for the server's reads.
#[derive(Debug)]
pub struct LocalStorage {
    label: Label,
    files: Vec<File>,
    direct: bool,
    /// The components again, through the page cache, for spliced downloads.
    cached: Vec<File>,
}

impl LocalStorage {
    /// Opens the volume on `paths` for serving.
    pub fn open(paths: &[PathBuf]) -> Result<LocalStorage, VolumeError> {
        let v = Volume::open(paths)?;
        let (files, direct) = v.open_direct()?;
        let mut cached = Vec::with_capacity(files.len());
        for c in &v.components {
            let f = File::open(&c.path).map_err(io_at(&c.path))?;
            // Downloads read each component in order: a larger read-ahead window
            // (advice only; a refusal changes nothing).
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::Sequential);
            cached.push(f);
        }
        Ok(LocalStorage { label: v.label, files, direct, cached })
    }

    /// The label.
    pub fn label(&self) -> &Label {
        &self.label
    }
}

impl Storage for LocalStorage {
    fn lookup(&self, name: &str) -> Option<StreamInfo> {
        self.label.find(name).map(|s| StreamInfo {
            name: s.name.clone(),
            len: s.len,
            etag: etag(&self.label, s),
            start: s.start,
        })
    }
    fn streams(&self) -> Vec<StreamInfo> {
        self.label.streams.iter().filter_map(|s| self.lookup(&s.name)).collect()
    }
    fn plan(&self, start: u64, len: u64) -> Vec<DeviceRead> {
        self.label.geometry.map(start, len).collect()
    }
    fn devices(&self) -> Vec<BorrowedFd<'_>> {
        self.files.iter().map(|f| f.as_fd()).collect()
    }
    fn direct(&self) -> bool {
        self.direct
    }
    fn align(&self) -> u64 {
        ictus_mars::label::ALIGN
    }
    fn max_read(&self) -> u64 {
        self.label.geometry.interleave
    }
    fn cached(&self) -> Vec<BorrowedFd<'_>> {
        self.cached.iter().map(|f| f.as_fd()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ictus-mars-vol-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn create_add_reopen_read_back() {
        let d = tmp("basic");
        let paths = vec![d.join("a"), d.join("b"), d.join("c")];
        let mut v = Volume::create(&paths, 8192, Some(LABEL_BYTES + (1 << 20))).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(d.join("src"), &data).unwrap();
        v.add_file("x.bin", &d.join("src"), 4.0).unwrap();
        assert!(matches!(v.add_file("x.bin", &d.join("src"), 4.0), Err(VolumeError::Exists(_))));
        assert!(matches!(v.add_file("../x", &d.join("src"), 4.0), Err(VolumeError::BadName(_))));
        // Open with the components in another order.
        let v = Volume::open(&[paths[2].clone(), paths[0].clone(), paths[1].clone()]).unwrap();
        let s = v.label.find("x.bin").unwrap().clone();
        let mut back = vec![0u8; data.len()];
        v.read_at(s.start, &mut back).unwrap();
        assert_eq!(back, data);
        assert!(v.describe().contains("x.bin"));
        // A missing component, or one from another volume, is refused.
        assert!(matches!(Volume::open(&paths[..2]), Err(VolumeError::Mismatch(_))));
        let other = Volume::create(&[d.join("o")], 8192, Some(LABEL_BYTES + (1 << 20))).unwrap();
        drop(other);
        assert!(Volume::open(&[paths[0].clone(), paths[1].clone(), d.join("o")]).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_transport_stream_gets_a_playlist() {
        let d = tmp("hls");
        let mut v = Volume::create(&[d.join("a")], 4096, Some(LABEL_BYTES + (4 << 20))).unwrap();
        std::fs::write(d.join("clip.ts"), ictus_mars::hls::synthetic_ts(12, 40)).unwrap();
        let pl = v.add_file("films/clip.ts", &d.join("clip.ts"), 4.0).unwrap();
        assert_eq!(pl.as_deref(), Some("films/clip.m3u8"));
        let s = v.label.find("films/clip.m3u8").unwrap();
        let mut text = vec![0u8; s.len as usize];
        v.read_at(s.start, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("#EXT-X-BYTERANGE:") && text.contains("\nclip.ts\n"), "{text}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// One file given twice, by one path, another path or a link, is refused before
    /// any label is written: it would hold two components at once.
    #[test]
    fn one_file_twice_is_not_two_components() {
        let d = tmp("twice");
        let a = d.join("a");
        std::os::unix::fs::symlink(&a, d.join("link")).unwrap();
        let size = Some(LABEL_BYTES + (1 << 20));
        for second in [a.clone(), d.join(".").join("a"), d.join("link")] {
            let e = Volume::create(&[a.clone(), d.join("b"), second.clone()], 8192, size).err();
            assert!(matches!(&e, Some(VolumeError::Mismatch(m)) if m.contains("the same file")), "{second:?}: {e:?}");
        }
        assert!(Volume::open(std::slice::from_ref(&a)).is_err(), "no label written");
        Volume::create(&[a, d.join("b")], 8192, size).unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_full_volume_refuses() {
        let d = tmp("full");
        let mut v = Volume::create(&[d.join("a")], 4096, Some(LABEL_BYTES + 8192)).unwrap();
        std::fs::write(d.join("big"), vec![1u8; 10_000]).unwrap();
        assert!(matches!(v.add_file("big", &d.join("big"), 4.0), Err(VolumeError::Full { .. })));
        let _ = std::fs::remove_dir_all(&d);
    }
}
