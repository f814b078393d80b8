//! The Unix server's request decoder: any datagram, with any number of descriptors
//! claimed, is refused or yields paths inside it without NUL.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let nfds = (data[0] % 5) as usize;
    if let Ok(r) = ictus_unix_emul::wire::Request::parse(&data[1..], nfds) {
        for p in [r.path1, r.path2].into_iter().flatten() {
            assert!(p.len() <= ictus_unix_emul::wire::PATH_MAX && !p.contains(&0));
        }
        assert_eq!(r.header.fd_args.count_ones() as usize, nfds);
    }
    let _ = ictus_unix_emul::wire::parse_reply(&data[1..], nfds);
});
