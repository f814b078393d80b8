//! mmbufs (001 §3): one pool of buffers, each seen by the disk and by the network.
//!
//! The paper's mmbuf is a buffer-cache header and an mbuf header over one data cluster,
//! so the disk driver fills the cluster and the network stack sends it without a copy.
//! Here one anonymous mapping is cut into equal buffers that are **registered with
//! io_uring** (`IORING_REGISTER_BUFFERS`): the kernel pins their pages once, `O_DIRECT`
//! reads (`IORING_OP_READ_FIXED`) DMA into them, and zero-copy sends
//! (`IORING_OP_SEND_ZC` with `IORING_RECVSEND_FIXED_BUF`) hand the same pages to the
//! socket. Each buffer has the paper's four states — empty, read in progress, full, send
//! in progress — and a count of kernel operations that still use it; a buffer goes back
//! to the free list only when its owner is done with it *and* no operation uses it, so a
//! client that dies mid-stream frees its buffers as soon as the kernel lets go.

use std::io;
use std::ptr::NonNull;

/// A buffer's state (the paper's four).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufState {
    /// On the free list.
    Empty,
    /// Device reads in progress.
    Reading,
    /// Data ready to send.
    Full,
    /// Being sent.
    Sending,
}

/// Who holds a buffer: a connection slot and its generation.
pub type Owner = (u32, u32);

#[derive(Clone, Copy, Debug)]
struct Meta {
    state: BufState,
    owner: Option<Owner>,
    /// Kernel operations using the buffer (reads in flight, zero-copy sends not yet
    /// notified).
    refs: u32,
}

/// The pool.
#[derive(Debug)]
pub struct BufPool {
    base: NonNull<u8>,
    // Unmapped on drop, after the engine's ring (the engine drops its ring first).
    _map: ictus_sys::mm::Mapping,
    size: usize,
    meta: Vec<Meta>,
    /// Buffers `split..` are the huge-page part.
    split: u16,
    /// Free buffers of the small-page part (`[0]`) and of the huge-page part (`[1]`).
    free: [Vec<u16>; 2],
}

// SAFETY: the pool owns its mapping exclusively; the raw pointer is only an address into
// it, and
// the engine thread that owns the pool is the only one that touches the memory (the
// kernel does too, for operations the engine started, which the `refs` count tracks).
unsafe impl Send for BufPool {}

impl BufPool {
    /// `count` buffers of `size` bytes (a multiple of the page size), in one mapping;
    /// the last `huge` of them advised for transparent huge pages (see [`BufPool::alloc`]).
    pub fn new(count: usize, size: usize, huge: usize) -> io::Result<BufPool> {
        if count == 0 || count > usize::from(u16::MAX) || size == 0 || size % 4096 != 0 || huge > count {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer pool: 1..65535 buffers of 4 KiB multiples, at most all of them on huge pages",
            ));
        }
        let map_len =
            count.checked_mul(size).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pool too large"))?;
        let map = ictus_sys::mm::Mapping::anonymous(map_len)?;
        let base = NonNull::new(map.as_ptr()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let split = count - huge;
        if huge > 0 {
            // Huge pages where the kernel has them to give (transparent huge pages in
            // `madvise` mode, Debian's default): a 1 MiB `O_DIRECT` read into 4 KiB
            // pages is 256 segments to pin and describe to the device; in huge pages it
            // is one (how they are sent: [`BufPool::alloc`]). Advice only: refused, the
            // pool works.
            // SAFETY: advice over a range of the mapping just made, which nothing uses yet.
            let _ = unsafe {
                rustix::mm::madvise(
                    map.as_ptr().add(split * size).cast(),
                    huge * size,
                    rustix::mm::Advice::LinuxHugepage,
                )
            };
        }
        let meta = vec![Meta { state: BufState::Empty, owner: None, refs: 0 }; count];
        let free = [(0..split as u16).rev().collect(), (split as u16..count as u16).rev().collect()];
        Ok(BufPool { base, _map: map, size, meta, split: split as u16, free })
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.size
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.meta.len()
    }

    /// Buffers on the free list.
    pub fn free_count(&self) -> usize {
        self.free[0].len() + self.free[1].len()
    }

    /// Whether buffer `id` is in the huge-page part.
    pub fn is_huge(&self, id: u16) -> bool {
        id >= self.split
    }

    /// The iovecs to register with io_uring, one per buffer.
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.meta.len()).map(|i| libc::iovec { iov_base: self.ptr(i as u16).cast(), iov_len: self.size }).collect()
    }

    /// Where buffer `id` starts.
    pub fn ptr(&self, id: u16) -> *mut u8 {
        assert!(usize::from(id) < self.meta.len(), "buffer {id} out of range");
        // SAFETY: id < count, so the offset stays inside the mapping (count × size bytes).
        unsafe { self.base.as_ptr().add(usize::from(id) * self.size) }
    }

    /// Takes a buffer for `owner`, in state [`BufState::Reading`]: from the huge-page
    /// part if `huge` (downloads), from the small-page part if not (paced streams),
    /// from the other part when that one has none left.
    ///
    /// The engine never sends a huge-page buffer by its registered index (to a peer on
    /// this host it copies, to others it sends zero-copy by address):
    /// sent from registered huge pages, a local receiver was charged for whole folio
    /// spans (`TcpExtPruneCalled` 33–42 per quick Table 2 run, 0 on small pages), its
    /// window stayed at a few KiB, a paced stream stalled 140–190 ms and a striped
    /// download lost a fifth of its rate (doc/mars.md). Paced streams keep small pages
    /// and registered sends, which pin nothing per send.
    pub fn alloc(&mut self, owner: Owner, huge: bool) -> Option<u16> {
        let first = usize::from(huge);
        let id = match self.free[first].pop() {
            Some(id) => id,
            None => self.free[1 - first].pop()?,
        };
        self.meta[usize::from(id)] = Meta { state: BufState::Reading, owner: Some(owner), refs: 0 };
        Some(id)
    }

    /// The buffer's state and owner.
    pub fn state(&self, id: u16) -> (BufState, Option<Owner>) {
        let m = &self.meta[usize::from(id)];
        (m.state, m.owner)
    }

    /// Sets the state of a buffer in use.
    pub fn set_state(&mut self, id: u16, state: BufState) {
        let m = &mut self.meta[usize::from(id)];
        if m.state != BufState::Empty {
            m.state = state;
        }
    }

    /// A kernel operation starts using the buffer.
    pub fn hold(&mut self, id: u16) {
        self.meta[usize::from(id)].refs += 1;
    }

    /// A kernel operation is done with it; frees it if its owner let go. Returns whether
    /// it was freed.
    pub fn unhold(&mut self, id: u16) -> bool {
        let m = &mut self.meta[usize::from(id)];
        m.refs = m.refs.saturating_sub(1);
        self.maybe_free(id)
    }

    /// The owner is done with the buffer; it is freed once no operation uses it.
    /// Returns whether it was freed now.
    pub fn release(&mut self, id: u16) -> bool {
        self.meta[usize::from(id)].owner = None;
        self.maybe_free(id)
    }

    fn maybe_free(&mut self, id: u16) -> bool {
        let m = &mut self.meta[usize::from(id)];
        if m.owner.is_none() && m.refs == 0 && m.state != BufState::Empty {
            m.state = BufState::Empty;
            self.free[usize::from(id >= self.split)].push(id);
            return true;
        }
        false
    }

    /// Bytes `[from, from + len)` of a buffer no kernel operation is writing.
    pub fn bytes(&self, id: u16, from: usize, len: usize) -> &[u8] {
        assert!(from + len <= self.size);
        // SAFETY: inside buffer `id` (checked above and in `ptr`); the engine calls this
        // only for full buffers, which no read is writing.
        unsafe { std::slice::from_raw_parts(self.ptr(id).add(from), len) }
    }

    /// Buffers in each state, for `state` and the tests.
    pub fn census(&self) -> [usize; 4] {
        let mut c = [0; 4];
        for m in &self.meta {
            c[match m.state {
                BufState::Empty => 0,
                BufState::Reading => 1,
                BufState::Full => 2,
                BufState::Sending => 3,
            }] += 1;
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_freed_when_owner_and_kernel_are_done() {
        let mut p = BufPool::new(2, 4096, 0).unwrap();
        let a = p.alloc((1, 0), false).unwrap();
        let b = p.alloc((1, 0), true).unwrap();
        assert!(p.alloc((1, 0), false).is_none());
        p.hold(a);
        assert!(!p.release(a), "the kernel still uses it");
        assert!(p.unhold(a));
        assert!(p.release(b));
        assert_eq!(p.free_count(), 2);
        assert_eq!(p.census(), [2, 0, 0, 0]);
        assert!(BufPool::new(1, 100, 0).is_err());
        assert!(BufPool::new(2, 4096, 3).is_err());
    }

    /// Each kind of owner takes its own part first, the other part when its own is
    /// empty, and a freed buffer goes back to the part it came from.
    #[test]
    fn downloads_take_the_huge_part_and_streams_the_small_one_first() {
        let mut p = BufPool::new(4, 4096, 2).unwrap();
        let h = p.alloc((1, 0), true).unwrap();
        assert!(p.is_huge(h));
        let s = p.alloc((2, 0), false).unwrap();
        assert!(!p.is_huge(s));
        let h2 = p.alloc((1, 0), true).unwrap();
        assert!(p.is_huge(h2));
        let spill = p.alloc((1, 0), true).unwrap();
        assert!(!p.is_huge(spill), "the huge part is used up: the small one lends");
        assert!(p.alloc((2, 0), false).is_none());
        assert!(p.release(h));
        let again = p.alloc((2, 0), false).unwrap();
        assert_eq!(again, h, "the small part is used up: the huge one lends");
        assert_eq!(p.free_count(), 0);
    }

    /// The huge-page part's mapping is advised (`hg` in its VMA's flags) and the small
    /// part's is not, where the kernel has transparent huge pages at all.
    #[test]
    fn only_the_huge_part_asks_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            eprintln!("skipped: this kernel has no transparent huge pages");
            return;
        }
        let pool = BufPool::new(16, 1 << 20, 8).unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let flags_at = |at: usize| {
            let mut inside = false;
            for line in smaps.lines() {
                if let Some((range, _)) = line.split_once(' ') {
                    if let Some((a, b)) = range.split_once('-') {
                        if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                            inside = (a..b).contains(&at);
                            continue;
                        }
                    }
                }
                if inside {
                    if let Some(f) = line.strip_prefix("VmFlags:") {
                        return f.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
                    }
                }
            }
            panic!("no mapping at {at:#x} in smaps");
        };
        let small = flags_at(pool.ptr(0) as usize);
        let huge = flags_at(pool.ptr(15) as usize);
        assert!(!small.iter().any(|f| f == "hg"), "small part: {small:?}");
        assert!(huge.iter().any(|f| f == "hg"), "huge part: {huge:?}");
    }
}
