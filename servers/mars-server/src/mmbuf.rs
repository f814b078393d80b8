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
    free: Vec<u16>,
}

// SAFETY: the pool owns its mapping exclusively; the raw pointer is only an address into
// it, and
// the engine thread that owns the pool is the only one that touches the memory (the
// kernel does too, for operations the engine started, which the `refs` count tracks).
unsafe impl Send for BufPool {}

impl BufPool {
    /// `count` buffers of `size` bytes (a multiple of the page size), in one mapping.
    pub fn new(count: usize, size: usize) -> io::Result<BufPool> {
        if count == 0 || count > usize::from(u16::MAX) || size == 0 || size % 4096 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer pool: 1..65535 buffers of 4 KiB multiples",
            ));
        }
        let map_len =
            count.checked_mul(size).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pool too large"))?;
        let map = ictus_sys::mm::Mapping::anonymous(map_len)?;
        let base = NonNull::new(map.as_ptr()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        // Not advised for huge pages: with MADV_HUGEPAGE the sender CPU per GB of cold
        // downloads halved, but a paced stream beside downloads through DRR stalled
        // 140-190 ms (late slots in Table 2, held without it in every run); see
        // doc/mars.md.
        let meta = vec![Meta { state: BufState::Empty, owner: None, refs: 0 }; count];
        let free = (0..count as u16).rev().collect();
        Ok(BufPool { base, _map: map, size, meta, free })
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
        self.free.len()
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

    /// Takes a buffer for `owner`, in state [`BufState::Reading`].
    pub fn alloc(&mut self, owner: Owner) -> Option<u16> {
        let id = self.free.pop()?;
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
            self.free.push(id);
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
        let mut p = BufPool::new(2, 4096).unwrap();
        let a = p.alloc((1, 0)).unwrap();
        let b = p.alloc((1, 0)).unwrap();
        assert!(p.alloc((1, 0)).is_none());
        p.hold(a);
        assert!(!p.release(a), "the kernel still uses it");
        assert!(p.unhold(a));
        assert!(p.release(b));
        assert_eq!(p.free_count(), 2);
        assert_eq!(p.census(), [2, 0, 0, 0]);
        assert!(BufPool::new(1, 100).is_err());
    }
}
