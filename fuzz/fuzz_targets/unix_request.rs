//! The Unix server's request decoder: any datagram is refused or yields paths inside
//! it without NUL and at most three descriptor arguments; the hello decoder names a
//! non-negative descriptor or nothing. The first byte is the reply's descriptor count.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let nfds = (data[0] % 5) as usize;
    if let Ok(r) = ictus_unix_emul::wire::Request::parse(&data[1..]) {
        for p in [r.path1, r.path2].into_iter().flatten() {
            assert!(p.len() <= ictus_unix_emul::wire::PATH_MAX && !p.contains(&0));
        }
        assert!(r.header.fd_args < 0x40 && r.header.fd_args.count_ones() as usize <= ictus_unix_emul::wire::MAX_FDS);
    }
    if let Some(fd) = ictus_unix_emul::wire::parse_hello(&data[1..]) {
        assert!(fd >= 0);
    }
    if let Some(tid) = ictus_unix_emul::wire::hello_thread(&data[1..]) {
        assert!(tid > 0);
    }
    let _ = ictus_unix_emul::wire::parse_reply(&data[1..], nfds);
});
