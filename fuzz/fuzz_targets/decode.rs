//! Fuzz the untrusted-message decoder, `ictus_abi::Datagram::parse`.
//!
//! The first input byte is the number of file descriptors that "arrived" with the
//! datagram; the rest is the datagram. Besides never panicking, an accepted datagram
//! must account for every file descriptor, agree with its own header, and encode back
//! to exactly the bytes it was parsed from (so nothing in it is ignored: every bit is
//! either checked or carried).
#![no_main]

use ictus_abi::{Datagram, Descriptor, DESCRIPTOR_LEN, HEADER_LEN, MAX_DESCRIPTORS, MAX_FDS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&nfds, bytes)) = data.split_first() else {
        return;
    };
    let nfds = usize::from(nfds);
    let Ok(dg) = Datagram::parse(bytes, nfds) else {
        return;
    };

    // Every file descriptor is accounted for, in the documented order.
    let needed = dg.header.leading_fds() + dg.descriptors.iter().map(Descriptor::nfds).sum::<usize>();
    assert_eq!(needed, nfds, "accepted datagram leaves file descriptors unaccounted");
    assert!(nfds <= MAX_FDS);
    assert_eq!(usize::from(dg.header.nfds), nfds);

    // The header agrees with the parsed form and with the datagram's size.
    assert!(dg.descriptors.len() <= MAX_DESCRIPTORS);
    assert_eq!(dg.descriptors.len(), usize::from(dg.header.ndesc));
    assert_eq!(dg.inline.len(), dg.header.inline_len as usize);
    assert_eq!(bytes.len(), HEADER_LEN + dg.descriptors.len() * DESCRIPTOR_LEN + dg.inline.len());
    assert!(dg.header.big_len == 0 || dg.inline.is_empty());

    // Re-encoding the parsed form gives back the input, byte for byte.
    let mut out = Vec::new();
    let header =
        Datagram::encode(dg.header.head(), &dg.descriptors, dg.inline, dg.header.big_len, &mut out)
            .expect("an accepted datagram must be encodable");
    assert_eq!(header, dg.header, "re-encoded header differs");
    assert_eq!(out, bytes, "re-encoding an accepted datagram changed its bytes");

    // And the re-encoded form parses to the same thing.
    let again = Datagram::parse(&out, nfds).expect("re-encoded datagram must parse");
    assert_eq!(again, dg);
});
