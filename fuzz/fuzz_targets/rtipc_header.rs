//! Fuzz the real-time message header and the attributes a port sends its clients
//! (`ictus_rtipc::wire::RtHeader::parse`, `ictus_rtipc::PortAttrs::decode`).
//!
//! The first input byte is the number of descriptors that "arrived" with the datagram;
//! the rest is the datagram. Besides never panicking, an accepted datagram must agree
//! with its own length and descriptor count and encode back to its header bytes, and
//! accepted attributes must be valid and encode back to the same bytes.
#![no_main]

use ictus_rtipc::wire::{RtHeader, RT_HEADER_LEN};
use ictus_rtipc::PortAttrs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&nfds, bytes)) = data.split_first() else {
        return;
    };
    let nfds = usize::from(nfds % 4);
    if let Ok(h) = RtHeader::parse(bytes, nfds) {
        assert_eq!(h.len as usize + RT_HEADER_LEN, bytes.len());
        assert_eq!(h.kind.fds(), nfds);
        assert!(h.priority <= 99);
        assert_eq!(&h.encode()[..], &bytes[..RT_HEADER_LEN]);
        let body = &bytes[RT_HEADER_LEN..];
        if body.len() >= 16 {
            if let Some(a) = PortAttrs::decode(&body[..16]) {
                assert!(a.validate().is_ok());
                assert_eq!(&a.encode()[..], &body[..16]);
            }
        }
    }
    if let Some(a) = PortAttrs::decode(bytes) {
        assert_eq!(&a.encode()[..], bytes);
    }
});
