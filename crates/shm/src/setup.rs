//! The set-up protocol, over an ictus port and then the channel's link.
//!
//! 1. The client calls the server's service port with [`OPEN`]: the protocol version
//!    and the geometry it wants.
//! 2. The server checks it against its limits, makes the channel's memfd (sized and
//!    sealed against shrinking and growing), two eventfds and the *link* (a
//!    `SOCK_SEQPACKET` socketpair), and sends on its end of the link one datagram,
//!    [`LINK_HELLO`] and the geometry, carrying the memfd, its own page's memfd
//!    (sealed against writable mappings), the request doorbell eventfd and the
//!    reply eventfd (`SCM_RIGHTS`).
//! 3. It answers the call with [`OPEN_OK`] and the client's end of the link as a
//!    port right (the nucleus checks it is an `AF_UNIX SOCK_SEQPACKET` socket), or
//!    [`OPEN_REFUSED`] and a reason.
//! 4. The client takes the link, receives the datagram, checks every descriptor
//!    (memfds' sizes and seals, eventfds' kinds) and the header in the memory, maps.
//!
//! From then on the link carries nothing but its own end: when either process closes
//! it or dies, even by `kill -9`, the kernel hangs it up, and the other side sees it
//! (`POLLHUP`). A server that cuts a client off first sends [`LINK_CUT`] and why.

use crate::layout::{Geometry, GeometryError};

/// Message id of a channel request.
pub const OPEN: i32 = 0x5348_4d00;
/// Message id of the answer that carries a channel.
pub const OPEN_OK: i32 = OPEN + 100;
/// Message id of a refusal.
pub const OPEN_REFUSED: i32 = OPEN + 101;
/// Version of the set-up protocol and memory layout.
pub const PROTOCOL: u32 = 1;
/// First bytes of the server's datagram on the link.
pub const LINK_HELLO: &[u8; 8] = b"ICSHM1\0\0";
/// First bytes of a cut-off notice on the link.
pub const LINK_CUT: &[u8; 4] = b"CUT ";

/// Encodes an [`OPEN`] request.
pub fn encode_open(g: &Geometry) -> Vec<u8> {
    let mut v = PROTOCOL.to_le_bytes().to_vec();
    v.extend_from_slice(&g.encode());
    v
}

/// Decodes an untrusted [`OPEN`] request.
pub fn decode_open(data: &[u8]) -> Result<Geometry, GeometryError> {
    if data.len() != 28 {
        return Err(GeometryError(format!("request of {} bytes", data.len())));
    }
    let version = u32::from_le_bytes(data[..4].try_into().expect("4 bytes"));
    if version != PROTOCOL {
        return Err(GeometryError(format!("protocol {version}, this server speaks {PROTOCOL}")));
    }
    Geometry::decode(&data[4..])
}

/// Encodes the server's datagram on the link.
pub fn encode_hello(g: &Geometry) -> Vec<u8> {
    let mut v = LINK_HELLO.to_vec();
    v.extend_from_slice(&g.encode());
    v
}

/// Decodes the server's datagram on the link.
pub fn decode_hello(data: &[u8]) -> Result<Geometry, GeometryError> {
    if data.len() != 32 || &data[..8] != LINK_HELLO {
        return Err(GeometryError("not a channel hello".into()));
    }
    Geometry::decode(&data[8..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_nonsense_is_refused() {
        let g = Geometry::new(4096, 4096, 2, 4096).expect("valid");
        assert_eq!(decode_open(&encode_open(&g)), Ok(g));
        assert_eq!(decode_hello(&encode_hello(&g)), Ok(g));
        let mut bad = encode_open(&g);
        bad[0] = 9;
        assert!(decode_open(&bad).is_err());
        assert!(decode_open(&bad[..10]).is_err());
        assert!(decode_hello(b"ICSHM1\0\0").is_err());
    }
}
