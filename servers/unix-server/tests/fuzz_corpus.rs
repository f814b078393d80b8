//! Replays the `unix_request` and `unix_policy` fuzz corpora (fuzz/corpus/) on
//! stable, with every truncation and single-bit flip of each seed.

use std::path::{Path, PathBuf};

use ictus_unix_emul::wire::Request;
use ictus_unix_server::policy::Policy;
use ictus_unix_server::view::{Lookup, Node, View};

fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(name);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).expect("read")))
        .collect();
    out.sort();
    out
}

fn request(data: &[u8]) -> Option<u32> {
    let (_, rest) = data.split_first()?;
    let _ = ictus_unix_emul::wire::parse_hello(rest);
    let _ = ictus_unix_emul::wire::hello_thread(rest);
    let r = Request::parse(rest).ok()?;
    assert!(r.header.fd_args.count_ones() as usize <= ictus_unix_emul::wire::MAX_FDS);
    for p in [r.path1, r.path2].into_iter().flatten() {
        assert!(p.len() <= ictus_unix_emul::wire::PATH_MAX && !p.contains(&0));
    }
    Some(r.header.op)
}

struct Nothing;
impl Lookup for Nothing {
    fn node(&self, _: &Path) -> Node {
        Node::Other
    }
}

fn policy(data: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(data).ok()?;
    match Policy::parse(text) {
        Ok(p) => {
            let _ = View::new(&p).resolve(Path::new("/"), data, true, &Nothing);
            Some(0)
        }
        Err(e) => Some(e.line),
    }
}

fn mutate(data: &[u8], f: &dyn Fn(&[u8])) {
    for cut in 0..data.len() {
        f(&data[..cut]);
    }
    for i in 0..data.len() {
        for bit in 0..8 {
            let mut m = data.to_vec();
            m[i] ^= 1 << bit;
            f(&m);
        }
    }
}

#[test]
fn request_seeds_decode_as_intended_and_mutations_never_panic() {
    let seeds = corpus("unix_request");
    let got: Vec<(String, Option<u32>)> = seeds.iter().map(|(n, d)| (n.clone(), request(d))).collect();
    for (name, want) in [
        ("seed-openat", Some(257)),
        ("seed-renameat2-fds", Some(316)),
        ("seed-openat2", Some(437)),
        ("seed-bad-magic", None),
        ("seed-short", None),
    ] {
        assert!(got.contains(&(name.to_string(), want)), "{name}: {got:?}");
    }
    for (_, d) in &seeds {
        mutate(d, &|m| {
            request(m);
        });
    }
}

#[test]
fn policy_seeds_parse_as_intended_and_mutations_never_panic() {
    let seeds = corpus("unix_policy");
    let got: Vec<(String, Option<usize>)> = seeds.iter().map(|(n, d)| (n.clone(), policy(d))).collect();
    for (name, want) in [
        ("seed-full", Some(0)),
        ("seed-bad-bind", Some(1)),
        ("seed-comment", Some(0)),
        ("seed-refuse", Some(0)),
        // hide /etc (line 2), then ro /etc/ (line 4): a contradiction, refused at line 4.
        ("seed-contradiction", Some(4)),
    ] {
        assert!(got.contains(&(name.to_string(), want)), "{name}: {got:?}");
    }
    for (_, d) in &seeds {
        mutate(d, &|m| {
            policy(m);
        });
    }
}
