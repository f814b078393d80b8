//! Where things are in a channel's shared memory. Pure arithmetic, no system calls.
//!
//! One memfd per channel, made and sized by the server, sealed against shrinking and
//! growing:
//!
//! ```text
//! 0      header: magic, version, geometry (written once by the server)
//! 64     request head      (client writes)      each word on its own cache line
//! 128    request tail      (server writes)
//! 192    reply head        (server writes)
//! 256    reply tail        (client writes)
//! 320    request doorbell  (client rings, server waits)
//! 384    client flag       (client writes: asleep / how to wake / epoch)
//! 448    reply doorbell    (server rings, client waits)
//! 512    release head      (server writes)
//! 576    release tail      (client writes)
//! 4096   release ring: one u32 per pool slot (server writes slots it is done with)
//! …      request ring, reply ring, pool slots (each page-aligned)
//! ```
//!
//! The server's page is a second memfd shared by all of a server's clients, mapped
//! writable by the server only (sealed `F_SEAL_FUTURE_WRITE` once mapped): the
//! server's flag at offset 0.

use crate::record::{PoolGeometry, RingGeometry};

/// Page size assumed for layout.
pub const PAGE: u64 = 4096;
/// Magic at offset 0 of a channel's memory.
pub const MAGIC: u64 = u64::from_le_bytes(*b"ICTSHM01");
/// Layout version.
pub const VERSION: u32 = 1;

/// Byte offset of `OFF_MAGIC` (see the module map).
pub const OFF_MAGIC: usize = 0;
/// Byte offset of `OFF_VERSION` (see the module map).
pub const OFF_VERSION: usize = 8;
/// Byte offset of `OFF_REQ_CAP` (see the module map).
pub const OFF_REQ_CAP: usize = 16;
/// Byte offset of `OFF_REP_CAP` (see the module map).
pub const OFF_REP_CAP: usize = 24;
/// Byte offset of `OFF_SLOTS` (see the module map).
pub const OFF_SLOTS: usize = 32;
/// Byte offset of `OFF_SLOT_SIZE` (see the module map).
pub const OFF_SLOT_SIZE: usize = 36;
/// Byte offset of `OFF_TOTAL` (see the module map).
pub const OFF_TOTAL: usize = 40;
/// Byte offset of `REQ_HEAD` (see the module map).
pub const REQ_HEAD: usize = 64;
/// Byte offset of `REQ_TAIL` (see the module map).
pub const REQ_TAIL: usize = 128;
/// Byte offset of `REP_HEAD` (see the module map).
pub const REP_HEAD: usize = 192;
/// Byte offset of `REP_TAIL` (see the module map).
pub const REP_TAIL: usize = 256;
/// Byte offset of `REQ_BELL` (see the module map).
pub const REQ_BELL: usize = 320;
/// Byte offset of `CLIENT_FLAG` (see the module map).
pub const CLIENT_FLAG: usize = 384;
/// Byte offset of `REP_BELL` (see the module map).
pub const REP_BELL: usize = 448;
/// Byte offset of `REL_HEAD` (see the module map).
pub const REL_HEAD: usize = 512;
/// Byte offset of `REL_TAIL` (see the module map).
pub const REL_TAIL: usize = 576;
/// Byte offset of `REL_RING` (see the module map).
pub const REL_RING: usize = PAGE as usize;
/// The server's flag in its page.
pub const SERVER_FLAG: usize = 0;

/// The most pool slots a channel has.
pub const MAX_SLOTS: u32 = 4096;
/// The largest pool slot.
pub const MAX_SLOT_SIZE: u32 = 1 << 30;
/// The largest channel memory.
pub const MAX_TOTAL: u64 = 16 << 30;

/// The shape of a channel: its two rings and its buffer pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Client-to-server ring.
    pub request: RingGeometry,
    /// Server-to-client ring.
    pub reply: RingGeometry,
    /// Buffer pool for large payloads (zero slots: none).
    pub pool: PoolGeometry,
}

/// Why a geometry is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad channel geometry: {0}")]
pub struct GeometryError(pub String);

fn round_page(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

impl Geometry {
    /// A geometry from its sizes, checked: rings are powers of two from 256 B to
    /// 1 GiB, at most [`MAX_SLOTS`] slots of at most [`MAX_SLOT_SIZE`] bytes (a
    /// multiple of 64), and the whole at most [`MAX_TOTAL`].
    pub fn new(request: u64, reply: u64, slots: u32, slot_size: u32) -> Result<Geometry, GeometryError> {
        let ring = |cap: u64, what: &str| {
            RingGeometry::new(cap).ok_or_else(|| GeometryError(format!("{what} ring of {cap} bytes")))
        };
        let g = Geometry {
            request: ring(request, "request")?,
            reply: ring(reply, "reply")?,
            pool: PoolGeometry { slots, slot_size },
        };
        if slots > MAX_SLOTS || slot_size > MAX_SLOT_SIZE || slot_size % 64 != 0 || (slots > 0 && slot_size == 0) {
            return Err(GeometryError(format!("pool of {slots} slots of {slot_size} bytes")));
        }
        if g.total() > MAX_TOTAL {
            return Err(GeometryError(format!("{} bytes in all", g.total())));
        }
        Ok(g)
    }

    /// Offset of the request ring.
    pub fn request_at(&self) -> u64 {
        REL_RING as u64 + round_page(u64::from(self.pool.slots) * 4)
    }

    /// Offset of the reply ring.
    pub fn reply_at(&self) -> u64 {
        self.request_at() + self.request.cap
    }

    /// Offset of the pool.
    pub fn pool_at(&self) -> u64 {
        round_page(self.reply_at() + self.reply.cap)
    }

    /// Offset of pool slot `slot`.
    pub fn slot_at(&self, slot: u32) -> u64 {
        self.pool_at() + u64::from(slot) * u64::from(self.pool.slot_size)
    }

    /// Bytes of the channel's memory.
    pub fn total(&self) -> u64 {
        round_page(self.pool_at() + u64::from(self.pool.slots) * u64::from(self.pool.slot_size))
    }

    /// The geometry as five little-endian numbers, for the set-up messages.
    pub fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[0..8].copy_from_slice(&self.request.cap.to_le_bytes());
        b[8..16].copy_from_slice(&self.reply.cap.to_le_bytes());
        b[16..20].copy_from_slice(&self.pool.slots.to_le_bytes());
        b[20..24].copy_from_slice(&self.pool.slot_size.to_le_bytes());
        b
    }

    /// The geometry from [`Geometry::encode`]'s bytes, checked.
    pub fn decode(b: &[u8]) -> Result<Geometry, GeometryError> {
        let b: &[u8; 24] = b.get(..24).and_then(|s| s.try_into().ok()).ok_or_else(|| GeometryError("short".into()))?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Geometry::new(u64_at(0), u64_at(8), u32_at(16), u32_at(20))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas_are_disjoint_aligned_and_inside() {
        let g = Geometry::new(1 << 16, 1 << 12, 8, 1 << 20).expect("valid");
        assert_eq!(g.request_at() % PAGE, 0);
        assert!(g.request_at() >= REL_RING as u64 + 8 * 4);
        assert!(g.reply_at() >= g.request_at() + (1 << 16));
        assert!(g.pool_at() >= g.reply_at() + (1 << 12));
        assert_eq!(g.slot_at(7) + (1 << 20), g.total());
        assert_eq!(Geometry::decode(&g.encode()), Ok(g));
    }

    #[test]
    fn nonsense_is_refused() {
        assert!(Geometry::new(1000, 4096, 0, 0).is_err());
        assert!(Geometry::new(4096, 4096, MAX_SLOTS + 1, 64).is_err());
        assert!(Geometry::new(4096, 4096, 1, 100).is_err());
        assert!(Geometry::new(4096, 4096, 4096, MAX_SLOT_SIZE).is_err());
        assert!(Geometry::decode(&[0; 10]).is_err());
        assert!(Geometry::new(4096, 4096, 0, 0).is_ok());
    }
}
