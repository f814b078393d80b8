//! Shared by the server's integration tests: volumes in a temporary directory, a server
//! started in-process, curl as the client, a watchdog.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ictus_mars_server::{EngineConfig, Running, StartOptions, Volume};

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("ictus-mars-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A 3-component volume with a 16 KiB interleave (so ranges cross stripe units often)
/// holding `clip.bin` (3 MB + 123 bytes of `pattern`) and `film.ts` (a synthetic
/// transport stream, with its playlist `film.m3u8`). Returns the components and the
/// clip's bytes.
pub fn volume(dir: &Path) -> (Vec<PathBuf>, Vec<u8>, Vec<u8>) {
    let comps: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("c{i}.img"))).collect();
    let mut v = Volume::create(&comps, 16 << 10, Some(32 << 20)).unwrap();
    let clip = pattern(3_000_123, 7);
    std::fs::write(dir.join("clip.src"), &clip).unwrap();
    v.add_file("clip.bin", &dir.join("clip.src"), 4.0).unwrap();
    let ts = ictus_mars::hls::synthetic_ts(20, 50);
    std::fs::write(dir.join("film.src"), &ts).unwrap();
    v.add_file("film.ts", &dir.join("film.src"), 4.0).unwrap();
    (comps, clip, ts)
}

pub fn start(comps: &[PathBuf], cfg: EngineConfig, fallback: bool) -> Running {
    ictus_mars_server::start(&StartOptions {
        volume: comps.to_vec(),
        listen: Some("127.0.0.1:0".into()),
        capability: Some(100e6),
        engine: cfg,
        force_fallback: fallback,
    })
    .expect("server starts")
}

pub fn have_curl() -> bool {
    let ok = Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: curl is not installed (scripts/setup.sh installs it)");
    }
    ok
}

/// Runs curl with `args`, returns (status code, headers, body).
pub fn curl(args: &[&str]) -> (u16, String, Vec<u8>) {
    let head_only = args.contains(&"-I");
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "60"])
        .args(if head_only { &[][..] } else { &["-D", "-"][..] })
        .args(args)
        .output()
        .expect("curl runs");
    assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    split_response(&out.stdout)
}

/// Splits the last response head curl printed from the body.
pub fn split_response(raw: &[u8]) -> (u16, String, Vec<u8>) {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head, raw[end..].to_vec())
}

pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Parses a multipart/byteranges body: each part's (first, last, total) and bytes.
pub fn parts(body: &[u8], boundary: &str) -> Vec<((u64, u64, u64), Vec<u8>)> {
    let delim = format!("\r\n--{boundary}");
    let d = delim.as_bytes();
    let mut out = Vec::new();
    let find = |from: usize| body[from..].windows(d.len()).position(|w| w == d).map(|p| p + from);
    let mut next = find(0).expect("first boundary");
    loop {
        let at = next + d.len();
        if body[at..].starts_with(b"--") {
            break;
        }
        let head_end = body[at..].windows(4).position(|w| w == b"\r\n\r\n").unwrap() + at + 4;
        let head = String::from_utf8_lossy(&body[at..head_end]).into_owned();
        let cr = header(&head, "content-range").expect("content-range");
        let spec = cr.strip_prefix("bytes ").unwrap();
        let (r, total) = spec.split_once('/').unwrap();
        let (a, b) = r.split_once('-').unwrap();
        let range = (a.parse().unwrap(), b.parse().unwrap(), total.parse().unwrap());
        next = find(head_end).expect("next boundary");
        out.push((range, body[head_end..next].to_vec()));
    }
    out
}

/// Polls `f` until it holds or `limit` passes (a watchdog, not a timing claim).
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}
