//! A stream's reader: ranged reads of one striped object, kept a window ahead of the
//! consumer by asynchronous requests ([`crate::prefetch::Planner`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::prefetch::{Fetch, Planner, Window};
use crate::{Error, PendingRead, Striper};

/// What a reader did, for experiments and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Requests started.
    pub requests: u64,
    /// Bytes those requests brought.
    pub fetched: u64,
    /// Bytes brought but not wanted any more (a seek came first).
    pub discarded: u64,
    /// Bytes returned by `read_at`.
    pub served: u64,
    /// Reads that found their bytes in memory.
    pub hits: u64,
    /// Reads that had to wait for the store.
    pub stalls: u64,
    /// Total time spent waiting (ns).
    pub stall_ns: u64,
}

/// Reads one striped object for a stream, prefetching ahead of it.
#[derive(Debug)]
pub struct StreamReader {
    striper: Striper,
    name: String,
    len: u64,
    planner: Planner,
    flying: VecDeque<(Fetch, u64, PendingRead)>,
    ready: BTreeMap<u64, Vec<u8>>,
    stats: ReadStats,
}

impl StreamReader {
    /// Opens object `name` (its size read once) for reading with `window`.
    pub fn open(striper: &Striper, name: &str, window: Window) -> Result<StreamReader, Error> {
        let len = striper.stat(name)?;
        Ok(StreamReader {
            striper: striper.clone(),
            name: name.to_string(),
            len,
            planner: Planner::new(len, window),
            flying: VecDeque::new(),
            ready: BTreeMap::new(),
            stats: ReadStats::default(),
        })
    }

    /// The object's size.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What it did so far.
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// Bytes held in memory, ready to serve.
    pub fn buffered(&self) -> u64 {
        self.ready.values().map(|b| b.len() as u64).sum()
    }

    fn take(&mut self, fetch: Fetch, epoch: u64, pending: PendingRead) -> Result<(), Error> {
        let got = pending.wait();
        let wanted = self.planner.complete(fetch, epoch);
        let bytes = match got {
            Ok(b) => b,
            Err(e) => {
                self.planner.failed(fetch.offset);
                return Err(e);
            }
        };
        self.stats.fetched += bytes.len() as u64;
        if bytes.len() as u64 != fetch.len {
            // The object shrank under us: its bytes are not what `stat` promised.
            self.planner.failed(fetch.offset);
            return Err(Error::Short { name: self.name.clone(), expected: fetch.len, got: bytes.len() as u64 });
        }
        if wanted {
            self.ready.insert(fetch.offset, bytes);
        } else {
            self.stats.discarded += bytes.len() as u64;
        }
        Ok(())
    }

    /// The consumer is at `pos`: collects completed requests, drops bytes behind it, and
    /// starts the requests that keep the window full. Does not block.
    pub fn advance(&mut self, pos: u64) -> Result<(), Error> {
        let mut i = 0;
        while i < self.flying.len() {
            if self.flying[i].2.is_complete() {
                let (f, e, p) = self.flying.remove(i).expect("index in range");
                self.take(f, e, p)?;
            } else {
                i += 1;
            }
        }
        let fetches = self.planner.advance(pos);
        let chunk = self.planner.window().chunk;
        let base = pos.min(self.len) - pos.min(self.len) % chunk;
        let end = self.planner.requested_end();
        // Chunks behind the consumer were used; those dropped ahead of it (a seek back)
        // were fetched for nothing.
        let mut dropped = 0u64;
        self.ready.retain(|&off, b| {
            let keep = off >= base && off < end;
            if !keep && off >= base {
                dropped += b.len() as u64;
            }
            keep
        });
        self.stats.discarded += dropped;
        let epoch = self.planner.epoch();
        for f in fetches {
            let p = self.striper.read_async(&self.name, f.offset, f.len as usize)?;
            self.stats.requests += 1;
            self.flying.push_back((f, epoch, p));
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` (fewer at the end), from memory when the
    /// window brought them, else waiting for the store. Moves the window to `offset`.
    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        if offset > self.len {
            return Err(Error::Range { name: self.name.clone(), offset, len: buf.len() as u64, size: self.len });
        }
        let want = (buf.len() as u64).min(self.len - offset) as usize;
        self.advance(offset)?;
        let chunk = self.planner.window().chunk;
        let mut done = 0usize;
        let mut stalled = false;
        let started = Instant::now();
        while done < want {
            let at = offset + done as u64;
            let c = at - at % chunk;
            if !self.ready.contains_key(&c) {
                stalled = true;
                let epoch = self.planner.epoch();
                if let Some(i) = self.flying.iter().position(|(f, e, _)| f.offset == c && *e == epoch) {
                    let (f, e, p) = self.flying.remove(i).expect("index in range");
                    self.take(f, e, p)?;
                } else {
                    // Not requested (every request slot held by a seek's stale reads):
                    // fetch it now.
                    let len = chunk.min(self.len - c) as usize;
                    let mut b = vec![0u8; len];
                    let n = self.striper.read_at(&self.name, c, &mut b)?;
                    self.stats.requests += 1;
                    self.stats.fetched += n as u64;
                    if n != len {
                        return Err(Error::Short { name: self.name.clone(), expected: len as u64, got: n as u64 });
                    }
                    self.ready.insert(c, b);
                }
                continue;
            }
            let bytes = &self.ready[&c];
            let from = (at - c) as usize;
            let n = (bytes.len() - from).min(want - done);
            buf[done..done + n].copy_from_slice(&bytes[from..from + n]);
            done += n;
        }
        if stalled {
            self.stats.stalls += 1;
            self.stats.stall_ns += started.elapsed().as_nanos() as u64;
        } else {
            self.stats.hits += 1;
        }
        self.stats.served += done as u64;
        self.advance(offset + done as u64)?;
        Ok(done)
    }
}
