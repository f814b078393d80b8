//! HTTP/1.1 as players use it, checked byte for byte with curl against the file the
//! volume was made from: whole streams, single ranges, multiple ranges
//! (multipart/byteranges), ranges across stripe units, HEAD, validators, errors,
//! keep-alive, HLS playlists with byte ranges, paced streams; the same through the
//! fallback; and hostile clients (slowloris, half-closed, garbage, oversized heads).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use common::*;
use ictus_mars_server::EngineConfig;

fn url(r: &ictus_mars_server::Running, path: &str) -> String {
    format!("http://{}/{path}", r.addr.unwrap())
}

/// Single and multiple ranges at awkward places: stripe-unit edges (16 KiB × 3
/// components), the start, the end, suffixes, open ends, overlaps (merged).
fn check_ranges(r: &ictus_mars_server::Running, clip: &[u8]) {
    let u = url(r, "clip.bin");
    let (status, head, body) = curl(&[&u]);
    assert_eq!(status, 200);
    assert_eq!(body, clip, "the whole stream");
    assert_eq!(header(&head, "content-length"), Some(clip.len().to_string().as_str()));
    let len = clip.len() as u64;
    let unit = 16u64 << 10;
    let singles = [
        (0, 0),
        (unit - 1, unit),
        (unit - 10, 3 * unit + 10),
        (5 * unit, 5 * unit + 4095),
        (1_000_001, 2_000_002),
        (len - 1, len - 1),
        (123, len - 1),
    ];
    for (a, b) in singles {
        let (status, head, body) = curl(&["-r", &format!("{a}-{b}"), &u]);
        assert_eq!(status, 206, "{a}-{b}");
        assert_eq!(header(&head, "content-range"), Some(format!("bytes {a}-{b}/{len}").as_str()));
        assert_eq!(body, &clip[a as usize..=b as usize], "range {a}-{b}");
    }
    let (_, _, body) = curl(&["-r", "-1000", &u]);
    assert_eq!(body, &clip[clip.len() - 1000..], "suffix");
    let (_, _, body) = curl(&["-r", "2999000-", &u]);
    assert_eq!(body, &clip[2_999_000..], "open end");
    // Multiple ranges: disjoint ones in the client's order.
    let spec = format!("0-9,{}-{},{}-{},-5", unit - 3, unit + 2, 7 * unit, 9 * unit + 17);
    let (status, head, body) = curl(&["-r", &spec, &u]);
    assert_eq!(status, 206);
    let ctype = header(&head, "content-type").unwrap();
    let boundary = ctype.split("boundary=").nth(1).expect("a boundary").to_string();
    assert_eq!(header(&head, "content-length"), Some(body.len().to_string().as_str()));
    let got = parts(&body, &boundary);
    let want = [(0, 9), (unit - 3, unit + 2), (7 * unit, 9 * unit + 17), (len - 5, len - 1)];
    assert_eq!(got.len(), want.len());
    for (((a, b, total), bytes), (wa, wb)) in got.iter().zip(want) {
        assert_eq!((*a, *b, *total), (wa, wb, len));
        assert_eq!(bytes.as_slice(), &clip[wa as usize..=wb as usize]);
    }
    // Overlapping ranges are merged into one part.
    let (status, head, body) = curl(&["-r", "100-200,150-300,1000-1001", &u]);
    assert_eq!(status, 206);
    let boundary = header(&head, "content-type").unwrap().split("boundary=").nth(1).unwrap().to_string();
    let got = parts(&body, &boundary);
    assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), vec![(100, 300, len), (1000, 1001, len)]);
    assert_eq!(got[0].1, &clip[100..=300]);
}

#[test]
fn ranges_byte_for_byte() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("ranges");
    let (comps, clip, _) = volume(dir.path());
    let r = start(&comps, EngineConfig::default(), false);
    check_ranges(&r, &clip);
    let stats = r.handle.as_ref().unwrap().stats().unwrap();
    assert_eq!(stats.buffers_free, stats.buffers, "every buffer back after the responses");
    assert!(stats.bytes_zero_copy + stats.bytes_copied > 0);
    r.stop();
}

/// Downloads spliced from the page cache (the default) and through the registered
/// buffers (`splice: false`, as where the kernel has no `IORING_OP_SPLICE`): the same
/// bytes, every buffer and pipe back.
#[test]
fn ranges_byte_for_byte_spliced_and_not() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("splice");
    let (comps, clip, _) = volume(dir.path());
    for splice in [true, false] {
        let r = start(
            &comps,
            EngineConfig { splice, splice_pipes: 2, cold_direct: false, ..EngineConfig::default() },
            false,
        );
        check_ranges(&r, &clip);
        let stats = r.handle.as_ref().unwrap().stats().unwrap();
        assert_eq!(stats.buffers_free, stats.buffers, "every buffer back after the responses");
        if splice && stats.zero_copy {
            // A kernel with IORING_OP_SEND_ZC (6.0) has IORING_OP_SPLICE (5.7).
            assert!(stats.splice, "splicing refused on a kernel that has it: {stats:?}");
        }
        if splice && stats.splice {
            assert!(stats.bytes_spliced >= clip.len() as u64, "downloads spliced: {stats:?}");
            assert_eq!(stats.bytes_zero_copy, 0, "no download took the buffers: {stats:?}");
        } else {
            assert!(!stats.splice);
            assert_eq!(stats.bytes_spliced, 0);
            assert!(stats.bytes_zero_copy + stats.bytes_copied >= clip.len() as u64);
        }
        r.stop();
    }
}

#[test]
fn ranges_byte_for_byte_through_the_fallback() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("fallback");
    let (comps, clip, _) = volume(dir.path());
    let r = start(&comps, EngineConfig::default(), true);
    assert!(r.handle.is_none());
    check_ranges(&r, &clip);
    r.stop();
}

#[test]
fn head_validators_and_errors() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("errors");
    let (comps, clip, _) = volume(dir.path());
    let r = start(&comps, EngineConfig::default(), false);
    let u = url(&r, "clip.bin");
    let (status, head, body) = curl(&["-I", &u]);
    assert_eq!((status, body.len()), (200, 0));
    assert_eq!(header(&head, "content-length"), Some(clip.len().to_string().as_str()));
    assert_eq!(header(&head, "accept-ranges"), Some("bytes"));
    let etag = header(&head, "etag").unwrap().to_string();
    assert_eq!(curl(&[&url(&r, "nothing-here")]).0, 404);
    assert_eq!(curl(&["--path-as-is", &url(&r, "a/../clip.bin")]).0, 404, "no dot segments");
    let (status, head, _) = curl(&["-r", "5000000-", &u]);
    assert_eq!(status, 416);
    assert_eq!(header(&head, "content-range"), Some(format!("bytes */{}", clip.len()).as_str()));
    let (status, _, body) = curl(&["-r", "10-19", "-H", &format!("If-Range: {etag}"), &u]);
    assert_eq!((status, body.as_slice()), (206, &clip[10..20]));
    let (status, _, body) = curl(&["-r", "10-19", "-H", "If-Range: \"stale\"", &u]);
    assert_eq!((status, body.len()), (200, clip.len()), "a changed validator gets the whole stream");
    assert_eq!(curl(&["-H", &format!("If-None-Match: {etag}"), &u]).0, 304);
    assert_eq!(curl(&["-X", "POST", &u]).0, 405);
    assert_eq!(curl(&["--http1.0", &u]).2, clip, "HTTP/1.0, no Host");
    r.stop();
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("keepalive");
    let (comps, clip, _) = volume(dir.path());
    let r = start(&comps, EngineConfig::default(), false);
    let h = r.handle.clone().unwrap();
    let before = h.stats().unwrap().accepted;
    let u = url(&r, "clip.bin");
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-o", "/dev/null", "-o", "/dev/null", "-r", "0-99", &u, &u, &u])
        .args(["-w", "%{num_connects}\n"])
        .output()
        .unwrap();
    let connects: Vec<u32> =
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(connects.iter().sum::<u32>(), 1, "three requests, one connection: {connects:?}");
    assert_eq!(h.stats().unwrap().accepted - before, 1);
    // Pipelined: two requests in one write, two responses in order.
    let mut s = TcpStream::connect(r.addr.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /clip.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-4\r\n\r\nGET /clip.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=5-9\r\nConnection: close\r\n\r\n").unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    assert_eq!(text.matches("HTTP/1.1 206").count(), 2, "{text}");
    let first = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(&all[first..first + 5], &clip[..5]);
    assert!(all.ends_with(&clip[5..10]));
    drop(clip);
    r.stop();
}

#[test]
fn hls_playlist_segments_rebuild_the_clip() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("hls");
    let (comps, _, ts) = volume(dir.path());
    let r = start(&comps, EngineConfig::default(), false);
    let (status, head, body) = curl(&[&url(&r, "film.m3u8")]);
    assert_eq!(status, 200);
    assert_eq!(header(&head, "content-type"), Some("application/vnd.apple.mpegurl"));
    let text = String::from_utf8(body).unwrap();
    assert!(text.starts_with("#EXTM3U") && text.trim_end().ends_with("#EXT-X-ENDLIST"), "{text}");
    let mut rebuilt = Vec::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if let Some(br) = l.strip_prefix("#EXT-X-BYTERANGE:") {
            let (n, at) = br.split_once('@').unwrap();
            let (n, at): (u64, u64) = (n.parse().unwrap(), at.parse().unwrap());
            let uri = lines.next().unwrap();
            assert_eq!(uri, "film.ts");
            let (status, _, seg) = curl(&["-r", &format!("{at}-{}", at + n - 1), &url(&r, uri)]);
            assert_eq!(status, 206);
            rebuilt.extend(seg);
        }
    }
    assert_eq!(rebuilt, ts, "the segments, in order, are the clip");
    r.stop();
}

#[test]
fn a_paced_request_is_admitted_or_refused() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("paced");
    let (comps, clip, _) = volume(dir.path());
    let r = start(&comps, EngineConfig { buf_size: 64 << 10, ..EngineConfig::default() }, false);
    // 3 MB at 6 MB/s: admitted (capability 100 MB/s × 0.8), paced by an upcall.
    let (status, _, body) = curl(&[&format!("{}?rate=6000000", url(&r, "clip.bin"))]);
    assert_eq!(status, 200);
    assert_eq!(body, clip);
    // More than the reservable share: refused with 503 and Retry-After.
    let (status, head, _) = curl(&[&format!("{}?rate=90000000", url(&r, "clip.bin"))]);
    assert_eq!(status, 503);
    assert_eq!(header(&head, "retry-after"), Some("5"));
    let s = r.handle.as_ref().unwrap().stats().unwrap();
    assert_eq!((s.rt_streams, s.buffers_free), (0, s.buffers), "the reservation and buffers are released");
    r.stop();
}

/// More paced streams at once than the upcall runtime has upcalls (64): streams share
/// one tick upcall per period level, so the 65th is not refused. Slow streams of a
/// small clip; every one is admitted (206) and gets its bytes.
#[test]
fn a_node_paces_more_streams_than_the_runtime_has_upcalls() {
    let dir = TempDir::new("many-paced");
    let (comps, clip, _) = volume(dir.path());
    let cfg = EngineConfig { buf_size: 64 << 10, buffers: 512, ..EngineConfig::default() };
    let r = start(&comps, cfg, false);
    let addr = r.addr.unwrap();
    let n = ictus_rt::upcall::DEFAULT_UPCALL_LIMIT + 32;
    // 192 KiB at 64 kB/s each, three rates (three tick levels): each lasts ~3 s, so
    // all are open together once their heads are in (a head comes at once).
    let len = 192usize << 10;
    let streams: Vec<(usize, TcpStream)> = (0..n)
        .map(|i| {
            let rate = [64_000, 72_000, 96_000][i % 3];
            let start = (i * 4096) % (clip.len() - len);
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            let req = format!(
                "GET /clip.bin?rate={rate} HTTP/1.1\r\nHost: x\r\nRange: bytes={start}-{}\r\nConnection: close\r\n\r\n",
                start + len - 1
            );
            s.write_all(req.as_bytes()).unwrap();
            (start, s)
        })
        .collect();
    let readers: Vec<_> = streams
        .into_iter()
        .map(|(start, mut s)| {
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let _ = s.read_to_end(&mut out);
                (start, out)
            })
        })
        .collect();
    for (i, t) in readers.into_iter().enumerate() {
        let (start, out) = t.join().unwrap();
        let (status, _, body) = split_response(&out);
        assert_eq!(status, 206, "stream {i} of {n}");
        assert!(body == clip[start..start + len], "stream {i}: the bytes of its range");
    }
    let s = r.handle.as_ref().unwrap().stats().unwrap();
    assert_eq!((s.rt_streams, s.buffers_free), (0, s.buffers), "every reservation and buffer released");
    r.stop();
}

fn raw(r: &ictus_mars_server::Running, bytes: &[u8], half_close: bool) -> Vec<u8> {
    let mut s = TcpStream::connect(r.addr.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(bytes).unwrap();
    if half_close {
        s.shutdown(Shutdown::Write).unwrap();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

#[test]
fn hostile_clients_cost_bounded_memory_and_do_not_stop_others() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("hostile");
    let (comps, clip, _) = volume(dir.path());
    let cfg = EngineConfig {
        head_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(2),
        ..EngineConfig::default()
    };
    let r = start(&comps, cfg, false);
    let h = r.handle.clone().unwrap();
    // Garbage, a head too long, a body, an unknown version: an error status, then close.
    assert!(raw(&r, b"\x16\x03\x01garbage\r\n\r\n", false).starts_with(b"HTTP/1.1 400"));
    let long = format!("GET /clip.bin HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "p".repeat(20_000));
    assert!(raw(&r, long.as_bytes(), false).starts_with(b"HTTP/1.1 431"));
    assert!(raw(&r, b"GET /clip.bin HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", false)
        .starts_with(b"HTTP/1.1 400"));
    // Half-closed: the request, then the client's write side shut: still answered.
    let out = raw(&r, b"GET /clip.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=7-16\r\n\r\n", true);
    assert!(out.starts_with(b"HTTP/1.1 206") && out.ends_with(&clip[7..17]));
    // Slowloris: 300 connections each holding an unfinished head.
    let accepted_before = h.stats().unwrap().accepted;
    let mut slow: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = TcpStream::connect(r.addr.unwrap()).unwrap();
            s.write_all(b"GET /clip.bin HTTP/1.1\r\nHost: x\r\n").unwrap();
            s
        })
        .collect();
    // All accepted (on a loaded machine the first may already have timed out: the head
    // timeout is 1 s here, and nothing below depends on them all being open at once).
    assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().accepted >= accepted_before + 300));
    let s = h.stats().unwrap();
    assert_eq!(s.buffers_free, s.buffers, "an unfinished head holds no buffer");
    // Meanwhile a download is served whole.
    assert_eq!(curl(&[&url(&r, "clip.bin")]).2, clip);
    // The slow heads are closed by the head timeout (1 s here); the watchdog is generous.
    assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().timed_out >= 300));
    for s in &mut slow {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).unwrap_or(0), 0, "closed by the server");
    }
    assert!(eventually(Duration::from_secs(30), || h.stats().unwrap().connections == 0));
    r.stop();
}

/// A client of `addr` with a small receive buffer (so that the server's sends block),
/// having sent `request`.
fn small_window_client(addr: std::net::SocketAddr, request: &str) -> TcpStream {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    sockopt::set_socket_recv_buffer_size(&fd, 64 << 10).unwrap();
    rustix::net::connect(&fd, &addr).unwrap();
    let mut s = TcpStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s
}

/// Spliced downloads to clients that stop reading are closed by the send timeout and
/// free their pipe; while the only pipe is held, another download is served through the
/// registered buffers; a client reading slower than one pipeful per send timeout is
/// not cut off (its acknowledged bytes are progress).
#[test]
fn stalled_and_slow_spliced_downloads() {
    stalled_and_slow(true);
}

/// The same through io_uring's `IORING_OP_SPLICE` (`sendfile: false`), the other
/// page-cache path.
#[test]
fn stalled_and_slow_downloads_spliced_by_io_uring() {
    stalled_and_slow(false);
}

fn stalled_and_slow(sendfile: bool) {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new(if sendfile { "stall" } else { "stall-uring" });
    let comps: Vec<std::path::PathBuf> = (0..2).map(|i| dir.path().join(format!("s{i}.img"))).collect();
    let mut v = ictus_mars_server::Volume::create(&comps, 64 << 10, Some(40 << 20)).unwrap();
    let big = pattern(48 << 20, 11);
    std::fs::write(dir.path().join("big.src"), &big).unwrap();
    v.add_file("big.bin", &dir.path().join("big.src"), 4.0).unwrap();
    drop(v);
    let cfg = EngineConfig {
        send_timeout: Duration::from_secs(5),
        splice_pipes: 1,
        sendfile,
        cold_direct: false,
        ..EngineConfig::default()
    };
    let r = start(&comps, cfg, false);
    let h = r.handle.clone().unwrap();
    assert!(!h.stats().unwrap().sendfile || sendfile);
    if !h.stats().unwrap().splice {
        r.stop();
        return; // no IORING_OP_SPLICE here: the buffered path is tested elsewhere
    }
    let addr = r.addr.unwrap();
    // A: asks for the whole stream and reads nothing.
    let mut stalled = small_window_client(addr, "GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n");
    if sendfile {
        assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().bytes_spliced > 0));
    } else {
        // io_uring's chain reports its bytes only when all of it is sent, which a
        // client that reads nothing may never let happen: A holds the pipe once its
        // request is taken.
        assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().requests >= 1));
    }
    // B, while A holds the only pipe: served whole through the buffers.
    let (status, _, body) = curl(&["-r", "1000-2000999", &url(&r, "big.bin")]);
    assert_eq!(status, 206);
    assert_eq!(body, &big[1000..2_001_000]);
    // A is closed by the send timeout: it gets less than the stream.
    assert!(eventually(Duration::from_secs(120), || h.stats().unwrap().timed_out >= 1));
    let mut a = Vec::new();
    let _ = stalled.read_to_end(&mut a);
    assert!(a.len() < big.len(), "the stalled client was cut off");
    assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().connections == 0), "A's slot and pipe freed");
    let spliced_before = h.stats().unwrap().bytes_spliced;
    // C, spliced once A's pipe is gone: reads 32 KiB every 250 ms for 12 s (a 1 MiB
    // splice takes 8 s at that pace, past the 5 s send timeout), then the rest at once:
    // every byte arrives.
    let slow = std::thread::spawn(move || {
        let want = 16usize << 20;
        let mut s = small_window_client(
            addr,
            &format!("GET /big.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-{}\r\n\r\n", want - 1),
        );
        let mut got = Vec::new();
        let mut b = vec![0u8; 32 << 10];
        let until = std::time::Instant::now() + Duration::from_secs(12);
        while std::time::Instant::now() < until {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4).unwrap_or(got.len());
        while got.len() < head_end + want {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
        (got.split_off(head_end), got)
    });
    let (body, head) = slow.join().unwrap();
    assert!(head.starts_with(b"HTTP/1.1 206"), "{:?}", String::from_utf8_lossy(&head));
    assert_eq!(body.len(), 16 << 20, "the slow reader got every byte");
    assert!(body == big[..16 << 20]);
    assert!(h.stats().unwrap().bytes_spliced >= spliced_before + (16 << 20), "C was spliced");
    assert!(eventually(Duration::from_secs(30), || h.stats().unwrap().connections == 0));
    let s = h.stats().unwrap();
    assert_eq!(s.buffers_free, s.buffers);
    r.stop();
}

/// Downloads sent by the download thread's `sendfile` (the default) and by io_uring's
/// splice: the same bytes, ranges and multi-ranges across stripe units included.
#[test]
fn ranges_byte_for_byte_sendfile_and_uring_splice() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("sendfile");
    let (comps, clip, _) = volume(dir.path());
    for sendfile in [true, false] {
        let r = start(
            &comps,
            EngineConfig { sendfile, splice_pipes: 2, cold_direct: false, ..EngineConfig::default() },
            false,
        );
        let before = r.handle.as_ref().unwrap().stats().unwrap();
        check_ranges(&r, &clip);
        let stats = r.handle.as_ref().unwrap().stats().unwrap();
        if stats.splice {
            assert_eq!(stats.sendfile, sendfile, "{stats:?}");
            assert!(stats.bytes_spliced >= before.bytes_spliced + clip.len() as u64, "{stats:?}");
            assert_eq!(stats.bytes_zero_copy, 0, "no download took the buffers: {stats:?}");
        }
        assert_eq!(stats.buffers_free, stats.buffers);
        assert!(eventually(Duration::from_secs(30), || r.handle.as_ref().unwrap().stats().unwrap().connections == 0));
        r.stop();
    }
}

/// Clients that ask for a whole stream and stop reading hold no device slot of the
/// download path: while they are still connected (no send timeout has closed them),
/// another download is served whole, byte for byte, and so is a paced stream. Their
/// jobs are parked (handed back by the download thread) and wait for their sockets,
/// out of DRR.
#[test]
fn a_client_that_stops_reading_stalls_no_other_download() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("nostall");
    let comps: Vec<std::path::PathBuf> = (0..2).map(|i| dir.path().join(format!("n{i}.img"))).collect();
    let mut v = ictus_mars_server::Volume::create(&comps, 64 << 10, Some(40 << 20)).unwrap();
    let big = pattern(48 << 20, 12);
    std::fs::write(dir.path().join("big.src"), &big).unwrap();
    v.add_file("big.bin", &dir.path().join("big.src"), 4.0).unwrap();
    drop(v);
    // A send timeout far beyond the test: nothing is freed by closing the stalled ones.
    let cfg = EngineConfig {
        send_timeout: Duration::from_secs(3600),
        buf_size: 64 << 10,
        cold_direct: false,
        ..EngineConfig::default()
    };
    let r = start(&comps, cfg, false);
    let h = r.handle.clone().unwrap();
    if !h.stats().unwrap().sendfile {
        r.stop();
        return; // no page-cache path here: the buffered path is tested elsewhere
    }
    let addr = r.addr.unwrap();
    let stalled: Vec<TcpStream> =
        (0..4).map(|_| small_window_client(addr, "GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")).collect();
    assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().parked >= 4), "{:?}", h.stats());
    let (status, _, body) = curl(&[&url(&r, "big.bin")]);
    assert_eq!(status, 200);
    assert!(body == big, "the other download, whole");
    let (status, _, body) = curl(&["-r", "1000-3000999", &format!("{}?rate=8000000", url(&r, "big.bin"))]);
    assert_eq!(status, 206);
    assert!(body == big[1000..3_001_000], "the paced stream, whole");
    let s = h.stats().unwrap();
    assert_eq!(s.timed_out, 0, "the stalled clients were not closed to make room: {s:?}");
    assert!(s.connections >= 4, "the stalled clients are still connected: {s:?}");
    drop(stalled);
    assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().connections == 0), "{:?}", h.stats());
    let s = h.stats().unwrap();
    assert_eq!(s.buffers_free, s.buffers);
    r.stop();
}

/// A download whose client pauses past the park time again and again, with two jobs
/// in flight on the download thread (double buffering): every pause parks the job
/// being sent, the job behind it comes back unsent, and the client still gets every
/// byte in order.
#[test]
fn a_pausing_client_gets_every_byte_in_order_with_two_jobs_in_flight() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("pausing");
    let comps: Vec<std::path::PathBuf> = (0..2).map(|i| dir.path().join(format!("p{i}.img"))).collect();
    let mut v = ictus_mars_server::Volume::create(&comps, 64 << 10, Some(40 << 20)).unwrap();
    let big = pattern(48 << 20, 13);
    std::fs::write(dir.path().join("big.src"), &big).unwrap();
    v.add_file("big.bin", &dir.path().join("big.src"), 4.0).unwrap();
    drop(v);
    let cfg = EngineConfig {
        send_timeout: Duration::from_secs(3600),
        device_depth: 8,
        cold_direct: false,
        ..EngineConfig::default()
    };
    let r = start(&comps, cfg, false);
    let h = r.handle.clone().unwrap();
    if !h.stats().unwrap().sendfile {
        r.stop();
        return; // no page-cache path here: the buffered path is tested elsewhere
    }
    let mut s = small_window_client(r.addr.unwrap(), "GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut got = Vec::new();
    let mut b = vec![0u8; 256 << 10];
    let mut pauses = 0;
    while got.len() < big.len() + 4096 {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
        }
        // A pause at each 6 MiB read while more than the socket buffers hold is left:
        // the job being sent is parked.
        if got.len() < 36 << 20 && got.len() / (6 << 20) > pauses {
            pauses += 1;
            let parked = h.stats().unwrap().parked;
            assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().parked > parked), "{:?}", h.stats());
        }
        let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
        if head_end.is_some_and(|e| got.len() >= e + big.len()) {
            break;
        }
    }
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4).unwrap();
    assert!(got.starts_with(b"HTTP/1.1 200"));
    assert_eq!(got.len() - head_end, big.len());
    assert!(got[head_end..] == big[..], "every byte, in order");
    let st = h.stats().unwrap();
    assert!(st.parked >= 5, "{st:?}");
    assert!(st.jobs_behind >= 1, "a second job was in flight: {st:?}");
    drop(s);
    assert!(eventually(Duration::from_secs(60), || h.stats().unwrap().connections == 0), "{:?}", h.stats());
    let st = h.stats().unwrap();
    assert_eq!(st.buffers_free, st.buffers);
    eprintln!("pausing client: {st:?}");
    r.stop();
}

/// A download whose range is out of the page cache goes from the disk into the
/// registered buffers (`O_DIRECT`, no page cache filled); once the range is cached, the
/// next download of it is spliced from the page cache. Both byte for byte.
#[test]
fn a_cold_download_takes_the_buffers_and_a_cached_one_is_spliced() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("cold");
    let (comps, clip, _) = volume(dir.path());
    let r = start(&comps, EngineConfig { splice_pipes: 2, ..EngineConfig::default() }, false);
    let h = r.handle.clone().unwrap();
    let s0 = h.stats().unwrap();
    if !s0.splice || !s0.direct {
        eprintln!("skipped: no splice path or no O_DIRECT here ({s0:?})");
        r.stop();
        return;
    }
    let drop_cache = || {
        for c in &comps {
            let f = std::fs::File::open(c).unwrap();
            f.sync_all().unwrap();
            rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        }
    };
    drop_cache();
    let (status, _, body) = curl(&[&url(&r, "clip.bin")]);
    assert_eq!(status, 200);
    assert!(body == clip, "the cold download, byte for byte");
    let s1 = h.stats().unwrap();
    assert_eq!(s1.cold_downloads, s0.cold_downloads + 1, "{s1:?}");
    assert_eq!(s1.bytes_spliced, s0.bytes_spliced, "nothing of it spliced: {s1:?}");
    assert!(s1.bytes_zero_copy + s1.bytes_copied >= s0.bytes_zero_copy + s0.bytes_copied + clip.len() as u64);
    // The page cache holds the volume again (read through it), so the next is spliced.
    for c in &comps {
        std::fs::read(c).unwrap();
    }
    let (status, _, body) = curl(&[&url(&r, "clip.bin")]);
    assert_eq!(status, 200);
    assert!(body == clip, "the cached download, byte for byte");
    let s2 = h.stats().unwrap();
    assert_eq!(s2.cold_downloads, s1.cold_downloads, "{s2:?}");
    assert!(s2.bytes_spliced >= s1.bytes_spliced + clip.len() as u64, "{s2:?}");
    assert!(eventually(Duration::from_secs(30), || h.stats().unwrap().buffers_free == s2.buffers));
    r.stop();
}
