//! MARS's [`Storage`] over a Ceph cluster (issue 20): clips are striped RADOS objects
//! (libradosstriper, `ictus-objstore`), read ahead of each stream into the node's stripe
//! cache, a sealed memfd that the engine reads like any device — by descriptor, through
//! io_uring, into its registered buffers. The engine's code path is the same for both
//! backends; see `doc/mars-cluster.md`.
//!
//! - The backend's address space gives each clip a range, chunk-aligned, the first time
//!   it is looked up (a `stat` on the cluster). Objects are written once
//!   (`ictus mars put --cluster` refuses an existing name), so a name and its size make
//!   the entity tag, the same on every node: a client resuming on another node with
//!   `If-Range` gets the rest, not the whole clip again.
//! - `plan` is also the prefetch hint: the engine plans a stream's next buffer on its
//!   schedule (paced streams) or as its socket drains (downloads), so each plan of a
//!   clip's chunk queues the next `ahead` chunks for the fetcher threads. A chunk not
//!   yet in the cache is fetched first and waited for (a stall, counted).
//! - A stream's read of a chunk not in the cache fetches first only the part it needs
//!   (the engine's buffer, rounded to [`PART_ALIGN`]), as an urgent job, and the rest of
//!   the chunk after it as the first read-ahead job: a stream that starts or resumes
//!   mid-chunk waits for a quarter of a chunk's transfer, not a whole one.
//! - A plan pins the cache slots it names; the engine gives each read back
//!   ([`Storage::done`]) when it completes or is dropped, so a slot is never reused under
//!   a read in flight.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ictus_objstore::cache::StripeCache;
use ictus_objstore::{Layout, Rados, Striper};

use crate::volume::{DeviceRead, Storage, StreamInfo};

/// How to reach the cluster and size the node's cache.
#[derive(Clone, Debug)]
pub struct CephOptions {
    /// The cluster's configuration file.
    pub conf: PathBuf,
    /// The pool holding the clips.
    pub pool: String,
    /// Bytes of the stripe cache (a memfd).
    pub cache_bytes: u64,
    /// Bytes per cache chunk (one ranged read of the store).
    pub chunk: u64,
    /// Bytes fetched ahead of the chunk a stream is reading.
    pub ahead: u64,
    /// Of a chunk not yet held, fetch first only the part a stream needs now, then the
    /// rest (`false`: whole chunks only, as before; kept to compare).
    pub parts: bool,
    /// Threads fetching chunks (reads in flight on the store).
    pub fetchers: usize,
    /// Seconds a connection to the cluster, or a chunk a reader waits for, may take.
    pub timeout_s: u32,
}

impl CephOptions {
    /// Defaults for the cluster at `conf`, pool `pool`: 256 MiB of 1 MiB chunks, 8 MiB
    /// ahead (at 4 Mbit/s of video, 16 s; at a 100 MB/s download, 80 ms), 4 fetchers.
    pub fn new(conf: PathBuf, pool: String) -> CephOptions {
        CephOptions {
            conf,
            pool,
            cache_bytes: 256 << 20,
            chunk: 1 << 20,
            ahead: 8 << 20,
            parts: true,
            fetchers: 4,
            timeout_s: 10,
        }
    }
}

/// Why the Ceph backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum CephError {
    /// The cluster or its libraries.
    #[error("Ceph cluster: {0}")]
    Store(#[from] ictus_objstore::Error),
    /// The cache.
    #[error("stripe cache: {0}")]
    Cache(#[from] ictus_objstore::cache::CacheError),
    /// Settings that do not fit together.
    #[error("{0}")]
    Settings(String),
    /// A thread.
    #[error("starting a fetcher thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// A first part's bounds are rounded to this (a page multiple the store reads well).
pub const PART_ALIGN: u64 = 64 << 10;

/// What the backend counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CephStats {
    /// Chunks (or parts of chunks) read from the store.
    pub fetches: u64,
    /// Of those, urgent first parts (a stream's own bytes of a chunk not yet held).
    pub parts: u64,
    /// Bytes read from the store.
    pub fetched_bytes: u64,
    /// Plans whose chunks were all in the cache.
    pub hits: u64,
    /// Plans that had to wait for a chunk (a stall).
    pub stalls: u64,
    /// Time plans waited, ns.
    pub stall_ns: u64,
    /// Chunk reads that failed.
    pub failures: u64,
    /// Times the engine was told to wait for a chunk (`ready` said no) rather than
    /// blocking in a plan.
    pub waits: u64,
    /// Clip lookups (`stat` on the cluster) done by a fetcher while the engine held
    /// the request (`lookup_ready` said no).
    pub lookups: u64,
    /// Lookups done on the caller's thread (`lookup` of a clip not yet known, without
    /// `lookup_ready` first: the streams API, the fallback server).
    pub sync_lookups: u64,
}

#[derive(Clone, Debug)]
struct Clip {
    start: u64,
    len: u64,
}

type Key = (String, u64);

/// A read of the store: bytes `[from, to)` of chunk `key`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Job {
    key: Key,
    from: u64,
    to: u64,
}

struct State {
    cache: StripeCache,
    clips: HashMap<String, Clip>,
    by_start: BTreeMap<u64, String>,
    next_start: u64,
    missing: HashMap<String, Instant>,
    /// Reads a stream needs now (fetched first).
    urgent: VecDeque<Job>,
    /// Reads ahead.
    queue: VecDeque<Job>,
    /// Every job queued or in flight, by chunk: the parts `[from, to)`.
    pending: HashMap<Key, Vec<(u64, u64)>>,
    failed: HashMap<Key, String>,
    stats: CephStats,
    stop: bool,
    /// Clips to look up (`stat`), fetched first, for requests the engine holds.
    lookups: VecDeque<String>,
    /// Those queued or in flight.
    looking: HashSet<String>,
    /// `ready` or `lookup_ready` said no since the waker was last called.
    waiters: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Fetchers wait here for jobs.
    work: Condvar,
    /// Planners wait here for chunks.
    arrived: Condvar,
    /// The engine's wake-up, called when a chunk comes while [`Storage::ready`] has said
    /// no since the last call.
    waker: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A fetcher that panicked left consistent state (every update is one statement
        // under the lock), so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A negative lookup is remembered this long (a player asking again and again for a
/// name that is not there costs the cluster one `stat` per period).
const MISSING_TTL: Duration = Duration::from_secs(1);

/// Clips from a Ceph cluster, through a stripe cache, as MARS [`Storage`].
pub struct CephStorage {
    striper: Striper,
    shared: Arc<Shared>,
    fd: OwnedFd,
    chunk: u64,
    ahead_chunks: u64,
    parts: bool,
    wait: Duration,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for CephStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CephStorage").field("chunk", &self.chunk).field("ahead_chunks", &self.ahead_chunks).finish()
    }
}

/// FNV-1a over a clip's name and size: its entity tag, the same on every node.
fn tag(name: &str, len: u64) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain(len.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"ceph-{h:016x}-{len:x}\"")
}

impl CephStorage {
    /// Connects to the cluster and starts the fetchers.
    pub fn open(opts: &CephOptions) -> Result<CephStorage, CephError> {
        if opts.chunk < 4096 || opts.chunk % 4096 != 0 || opts.chunk > 64 << 20 {
            return Err(CephError::Settings(format!("chunk {}: a multiple of 4096 up to 64 MiB", opts.chunk)));
        }
        let slots = opts.cache_bytes / opts.chunk;
        let ahead_chunks = opts.ahead.div_ceil(opts.chunk);
        // Room for every fetcher's chunk, the chunks ahead of two streams, and the
        // engine's pinned reads.
        if slots < 2 * (ahead_chunks + 1) + opts.fetchers as u64 {
            return Err(CephError::Settings(format!(
                "a cache of {} bytes holds {slots} chunks of {}: too few for {} bytes ahead (at least {} chunks)",
                opts.cache_bytes,
                opts.chunk,
                opts.ahead,
                2 * (ahead_chunks + 1) + opts.fetchers as u64
            )));
        }
        let rados = Rados::connect(&opts.conf, opts.timeout_s)?;
        let striper = rados.striper(&opts.pool, Layout::default())?;
        let cache = StripeCache::new(opts.chunk, slots as usize)?;
        let fd = cache
            .fd()
            .try_clone_to_owned()
            .map_err(|e| CephError::Cache(ictus_objstore::cache::CacheError::Io(e.to_string())))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                cache,
                clips: HashMap::new(),
                by_start: BTreeMap::new(),
                next_start: 0,
                missing: HashMap::new(),
                urgent: VecDeque::new(),
                queue: VecDeque::new(),
                pending: HashMap::new(),
                failed: HashMap::new(),
                stats: CephStats::default(),
                stop: false,
                lookups: VecDeque::new(),
                looking: HashSet::new(),
                waiters: false,
            }),
            work: Condvar::new(),
            arrived: Condvar::new(),
            waker: Mutex::new(None),
        });
        let mut s = CephStorage {
            striper,
            shared,
            fd,
            chunk: opts.chunk,
            ahead_chunks,
            parts: opts.parts,
            wait: Duration::from_secs(u64::from(opts.timeout_s.max(1))),
            threads: Vec::new(),
        };
        // The fetchers, and one more for urgent chunks only.
        for i in 0..=opts.fetchers.max(1) {
            let (sh, st, chunk) = (Arc::clone(&s.shared), s.striper.clone(), s.chunk);
            let urgent_only = i == 0;
            let t = std::thread::Builder::new()
                .name(format!("ictus-mars-fetch{i}"))
                .spawn(move || fetcher(&sh, &st, chunk, urgent_only))
                .map_err(CephError::Thread)?;
            s.threads.push(t);
        }
        Ok(s)
    }

    /// The striper (for uploads and measurements).
    pub fn striper(&self) -> &Striper {
        &self.striper
    }

    /// The clips with chunks in the cache (what the node reports to the director).
    pub fn cached_clips(&self) -> Vec<String> {
        self.shared.lock().cache.clips().into_iter().collect()
    }

    /// What was counted so far.
    pub fn stats(&self) -> CephStats {
        self.shared.lock().stats
    }

    /// Bytes of chunk `ci` of `clip` (the last one is shorter).
    fn chunk_len(&self, clip: &Clip, ci: u64) -> u64 {
        clip.len.saturating_sub(ci * self.chunk).min(self.chunk)
    }

    /// Queues a read of `[from, to)` of chunk `ci` of `name` unless held or queued (an
    /// urgent one makes a queued read-ahead job that covers it urgent, whole); urgent
    /// ones go first. Whether it is still missing. So a part is read on its own only
    /// where nothing of the chunk was asked for: a stream's start, resume or seek.
    fn want(&self, st: &mut State, name: &str, ci: u64, from: u64, to: u64, urgent: bool) -> bool {
        if from >= to || st.cache.holds(name, ci * self.chunk + from, to - from) {
            return false;
        }
        let key = (name.to_string(), ci);
        let covered = st.pending.get(&key).is_some_and(|v| v.iter().any(|&(a, b)| a <= from && to <= b));
        if covered {
            if urgent {
                // Only queued ahead: made urgent as it is. (Not split: a part fetched on
                // its own beside a queued larger read would read those bytes twice, and
                // a stream catching up with its read-ahead on a busy store would do so
                // for every chunk.)
                let queued = st.queue.iter().position(|j| j.key == key && j.from <= from && to <= j.to);
                if let Some(j) = queued.and_then(|i| st.queue.remove(i)) {
                    st.urgent.push_back(j);
                    self.shared.work.notify_all();
                }
            }
            return true;
        }
        st.pending.entry(key.clone()).or_default().push((from, to));
        let job = Job { key, from, to };
        if urgent {
            st.urgent.push_back(job);
        } else {
            st.queue.push_back(job);
        }
        // The urgent fetcher among them, whichever is free.
        self.shared.work.notify_all();
        true
    }

    /// Asks for `[off, off + len)` of clip `name` (urgent: of a chunk not held, only the
    /// part needed, and the rest of that chunk first among the read-ahead) and the
    /// prefetch window after it; whether any of it is still missing. A chunk whose fetch
    /// failed is not missing: the plan reports it.
    fn request(&self, st: &mut State, name: &str, clip: &Clip, off: u64, len: u64) -> bool {
        let (first, last) = (off / self.chunk, (off + len - 1) / self.chunk);
        let mut missing = false;
        let mut rests = Vec::new();
        for ci in first..=last {
            if st.failed.contains_key(&(name.to_string(), ci)) {
                return false;
            }
            let base = ci * self.chunk;
            let whole = self.chunk_len(clip, ci);
            let (a, b) = (off.max(base) - base, (off + len).min(base + whole) - base);
            if self.parts {
                let (pa, pb) = (a - a % PART_ALIGN, b.next_multiple_of(PART_ALIGN).min(whole));
                missing |= self.want(st, name, ci, pa, pb, true);
                rests.push((ci, pb, whole));
            } else {
                missing |= self.want(st, name, ci, 0, whole, true);
            }
        }
        // The rest of each chunk read, first among the read-ahead (the bytes before the
        // part are behind the stream).
        for (ci, from, to) in rests.into_iter().rev() {
            if self.want(st, name, ci, from, to, false) {
                if let Some(j) = st.queue.pop_back() {
                    if j.key.1 == ci && j.from == from {
                        st.queue.push_front(j);
                    } else {
                        st.queue.push_back(j);
                    }
                }
            }
        }
        // The prefetch window: the chunks after this read, in order.
        let end_chunk = clip.len.div_ceil(self.chunk);
        for ci in last + 1..(last + 1 + self.ahead_chunks).min(end_chunk) {
            let whole = self.chunk_len(clip, ci);
            self.want(st, name, ci, 0, whole, false);
        }
        missing
    }

    /// What a `stat` of `name` said: a clip given its range of the address space (the
    /// first time), or a miss remembered for [`MISSING_TTL`].
    fn record(&self, st: &mut State, name: &str, len: Result<u64, ictus_objstore::Error>) -> Option<StreamInfo> {
        record(st, name, len, self.chunk)
    }

    /// Whether `name` is known (a clip, or a miss not yet stale).
    fn known(st: &State, name: &str) -> Option<Option<StreamInfo>> {
        if let Some(c) = st.clips.get(name) {
            return Some(Some(StreamInfo {
                name: name.to_string(),
                len: c.len,
                etag: tag(name, c.len),
                start: c.start,
            }));
        }
        if st.missing.get(name).is_some_and(|t| t.elapsed() < MISSING_TTL) {
            return Some(None);
        }
        None
    }

    fn clip_at(st: &State, start: u64) -> Option<(String, Clip)> {
        let (_, name) = st.by_start.range(..=start).next_back()?;
        let c = st.clips.get(name)?;
        Some((name.clone(), c.clone()))
    }
}

/// One fetcher: urgent chunks first, then read-ahead ones unless `urgent_only` (one
/// fetcher is kept for urgent chunks, so a stream starting or resuming never waits
/// behind the read-ahead of others).
fn fetcher(shared: &Shared, striper: &Striper, chunk: u64, urgent_only: bool) {
    loop {
        let (job, to, urgent) = {
            let mut st = shared.lock();
            loop {
                if st.stop {
                    return;
                }
                // A lookup first: a request waits for it, and it is one small round trip.
                if let Some(name) = st.lookups.pop_front() {
                    drop(st);
                    let len = striper.stat(&name);
                    st = shared.lock();
                    record(&mut st, &name, len, chunk);
                    st.looking.remove(&name);
                    st.stats.lookups += 1;
                    let wake = std::mem::take(&mut st.waiters);
                    drop(st);
                    if wake {
                        if let Some(w) = shared.waker.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref()
                        {
                            w();
                        }
                    }
                    st = shared.lock();
                    continue;
                }
                let next = match st.urgent.pop_front() {
                    Some(j) => Some((j, true)),
                    None if urgent_only => None,
                    None => st.queue.pop_front().map(|j| (j, false)),
                };
                if let Some((j, urgent)) = next {
                    let whole = st.clips.get(&j.key.0).map_or(0, |c| c.len.saturating_sub(j.key.1 * chunk).min(chunk));
                    let to = j.to.min(whole);
                    if j.from >= to || st.cache.holds(&j.key.0, j.key.1 * chunk + j.from, to - j.from) {
                        unpend(&mut st, &j);
                        shared.arrived.notify_all();
                        continue;
                    }
                    break (j, to, urgent);
                }
                st = shared.work.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        };
        let at = job.key.1 * chunk + job.from;
        let len = to - job.from;
        let mut buf = vec![0u8; len as usize];
        let mut got = 0usize;
        let result = loop {
            match striper.read_at(&job.key.0, at + got as u64, &mut buf[got..]) {
                Ok(0) => break Err(format!("{} ends before byte {}", job.key.0, at + len)),
                Ok(n) => {
                    got += n;
                    if got == buf.len() {
                        break Ok(());
                    }
                }
                Err(e) => break Err(e.to_string()),
            }
        };
        let mut st = shared.lock();
        unpend(&mut st, &job);
        let result = result.and_then(|()| st.cache.insert(&job.key.0, at, &buf).map_err(|e| e.to_string()));
        match result {
            Ok(()) => {
                st.stats.fetches += 1;
                st.stats.parts += u64::from(urgent && len < chunk);
                st.stats.fetched_bytes += len;
            }
            Err(e) => {
                st.stats.failures += 1;
                st.failed.insert(job.key, e);
            }
        }
        let wake = std::mem::take(&mut st.waiters);
        drop(st);
        shared.arrived.notify_all();
        if wake {
            if let Some(w) = shared.waker.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() {
                w();
            }
        }
    }
}

/// See [`CephStorage::record`].
fn record(st: &mut State, name: &str, len: Result<u64, ictus_objstore::Error>, chunk: u64) -> Option<StreamInfo> {
    let Ok(len) = len else {
        st.missing.insert(name.to_string(), Instant::now());
        if st.missing.len() > 4096 {
            st.missing.retain(|_, t| t.elapsed() < MISSING_TTL);
        }
        return None;
    };
    st.missing.remove(name);
    let start = match st.clips.get(name) {
        Some(c) => c.start,
        None => {
            let start = st.next_start;
            // A chunk's gap after each clip: no plan ever spans two clips.
            st.next_start = start.saturating_add(len.next_multiple_of(chunk)).saturating_add(chunk);
            st.clips.insert(name.to_string(), Clip { start, len });
            st.by_start.insert(start, name.to_string());
            start
        }
    };
    // Nothing is fetched yet: the stream may start anywhere (a resume, a seek), and its
    // first plan (or `ready`) follows at once and asks for its own chunks.
    Some(StreamInfo { name: name.to_string(), len, etag: tag(name, len), start })
}

/// Forgets job `j` among the pending ones.
fn unpend(st: &mut State, j: &Job) {
    if let Some(v) = st.pending.get_mut(&j.key) {
        if let Some(i) = v.iter().position(|&(a, b)| a == j.from && b == j.to) {
            v.swap_remove(i);
        }
        if v.is_empty() {
            st.pending.remove(&j.key);
        }
    }
}

impl Drop for CephStorage {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Storage for CephStorage {
    fn lookup(&self, name: &str) -> Option<StreamInfo> {
        if !ictus_objstore::valid_name(name) || !ictus_mars::label::valid_name(name) {
            return None;
        }
        if let Some(known) = Self::known(&self.shared.lock(), name) {
            return known;
        }
        // A round trip to the cluster on the caller's thread, outside the lock (the
        // engine asks `lookup_ready` first, so a fetcher does this for it).
        let len = self.striper.stat(name);
        let mut st = self.shared.lock();
        st.stats.sync_lookups += 1;
        self.record(&mut st, name, len)
    }

    fn lookup_ready(&self, name: &str) -> bool {
        if !ictus_objstore::valid_name(name) || !ictus_mars::label::valid_name(name) {
            return true;
        }
        let mut st = self.shared.lock();
        if Self::known(&st, name).is_some() {
            return true;
        }
        if st.looking.insert(name.to_string()) {
            st.lookups.push_back(name.to_string());
            // Any fetcher, the urgent one included.
            self.shared.work.notify_all();
        }
        st.waiters = true;
        false
    }

    fn streams(&self) -> Vec<StreamInfo> {
        let st = self.shared.lock();
        let mut v: Vec<StreamInfo> = st
            .clips
            .iter()
            .map(|(n, c)| StreamInfo { name: n.clone(), len: c.len, etag: tag(n, c.len), start: c.start })
            .collect();
        v.sort_by_key(|s| s.start);
        v
    }

    fn plan(&self, start: u64, len: u64) -> Vec<DeviceRead> {
        if len == 0 {
            return Vec::new();
        }
        let mut st = self.shared.lock();
        let Some((name, clip)) = Self::clip_at(&st, start) else { return Vec::new() };
        let off = start - clip.start;
        if off.checked_add(len).map_or(true, |end| end > clip.len) {
            return Vec::new();
        }
        let (first, last) = (off / self.chunk, (off + len - 1) / self.chunk);
        let t0 = Instant::now();
        let mut waited = false;
        loop {
            for ci in first..=last {
                if let Some(e) = st.failed.remove(&(name.clone(), ci)) {
                    eprintln!("ictus mars: reading {name} from the cluster: {e}");
                    return Vec::new();
                }
            }
            // Only when `ready` was not asked first (or the chunk went since): the
            // engine's thread waits here.
            if !self.request(&mut st, &name, &clip, off, len) {
                break;
            }
            waited = true;
            let left = self.wait.saturating_sub(t0.elapsed());
            if left.is_zero() {
                eprintln!("ictus mars: {name}: a chunk did not arrive from the cluster within {:?}", self.wait);
                return Vec::new();
            }
            st = self.shared.arrived.wait_timeout(st, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
        if waited {
            st.stats.stalls += 1;
            st.stats.stall_ns += t0.elapsed().as_nanos() as u64;
        } else {
            st.stats.hits += 1;
        }
        let Some(lease) = st.cache.plan(&name, off, len) else { return Vec::new() };
        StripeCache::into_reads(lease)
            .into_iter()
            .map(|r| DeviceRead { component: 0, offset: r.offset, len: r.len, at: r.at })
            .collect()
    }

    fn done(&self, device: u16, offset: u64) {
        if device == 0 {
            self.shared.lock().cache.release_at(offset);
        }
    }

    fn ready(&self, start: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let mut st = self.shared.lock();
        let Some((name, clip)) = Self::clip_at(&st, start) else { return true };
        let off = start - clip.start;
        if off.checked_add(len).map_or(true, |end| end > clip.len) {
            // Outside the clip: `plan` says so.
            return true;
        }
        let missing = self.request(&mut st, &name, &clip, off, len);
        if missing {
            st.waiters = true;
            st.stats.waits += 1;
        }
        !missing
    }

    fn set_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        *self.shared.waker.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(wake);
    }

    fn devices(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.fd.as_fd()]
    }

    fn direct(&self) -> bool {
        false
    }

    fn align(&self) -> u64 {
        1
    }

    fn max_read(&self) -> u64 {
        self.chunk
    }
}

/// Reads the cluster for about `window` (a probe object written, read over and over
/// with `readers` threads, removed): the bytes/s a node can fetch, for admission.
pub fn measure(striper: &Striper, window: Duration, readers: usize) -> Result<f64, ictus_objstore::Error> {
    let name = format!("ictus-probe-{:016x}", crate::volume::random_id());
    let size = 8usize << 20;
    let data = vec![0x5au8; size];
    striper.write_at(&name, 0, &data)?;
    let t0 = Instant::now();
    let bytes = std::sync::atomic::AtomicU64::new(0);
    let result = std::thread::scope(|s| {
        let hs: Vec<_> = (0..readers.max(1))
            .map(|i| {
                let (striper, name, bytes) = (striper.clone(), &name, &bytes);
                s.spawn(move || -> Result<(), ictus_objstore::Error> {
                    let mut buf = vec![0u8; 1 << 20];
                    let mut at = (i as u64 * (1 << 20)) % size as u64;
                    while t0.elapsed() < window {
                        let n = striper.read_at(name, at, &mut buf)?;
                        bytes.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                        at = (at + (1 << 20)) % size as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().unwrap_or(Err(ictus_objstore::Error::Pool)))
    });
    let _ = striper.remove(&name);
    result?;
    Ok(bytes.into_inner() as f64 / t0.elapsed().as_secs_f64())
}
