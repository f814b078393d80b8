//! The fallback where io_uring is refused (`kernel.io_uring_disabled`, a seccomp filter,
//! an old kernel): HTTP served by a bounded pool of threads, one connection each, with
//! blocking `pread` (still `O_DIRECT` where the storage allows, into one aligned buffer
//! per connection) and `send`. The request handling is the same pure core as the
//! engine's. What it lacks, and says once at start: no Deficit Round Robin (the kernel
//! orders the reads), no zero-copy send, no streams API and no pacing.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ictus_mars::http::{self, Parsed};
use ictus_mars::range::Segment;

use crate::mmbuf::BufPool;
use crate::volume::Storage;

/// Most connections served at once; more are closed.
pub const MAX_THREADS: usize = 256;

/// Serves `listener` until `stop` is set.
pub fn serve(
    storage: Arc<dyn Storage>,
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    buf_size: usize,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((sock, _)) => {
                if active.load(Ordering::Acquire) >= MAX_THREADS {
                    continue; // dropped: closed
                }
                active.fetch_add(1, Ordering::AcqRel);
                let (storage, active, stop) = (Arc::clone(&storage), Arc::clone(&active), Arc::clone(&stop));
                let spawned = std::thread::Builder::new().name("ictus-mars-conn".into()).spawn(move || {
                    let _ = connection(&*storage, sock, &stop, buf_size);
                    active.fetch_sub(1, Ordering::AcqRel);
                });
                if spawned.is_err() {
                    // The closure (and its count) was dropped unrun.
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    Ok(())
}

fn connection(storage: &dyn Storage, mut sock: TcpStream, stop: &AtomicBool, buf_size: usize) -> io::Result<()> {
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    sock.set_write_timeout(Some(Duration::from_secs(30)))?;
    let _ = sock.set_nodelay(true);
    let mut pool = BufPool::new(1, buf_size, 0)?;
    let devices = storage.devices();
    let align = storage.align().max(1);
    let mut head: Vec<u8> = Vec::new();
    let mut scratch = [0u8; 4096];
    let mut seq = 0u64;
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let (req, n) = match http::parse(&head) {
            Parsed::Partial => {
                let room = (http::MAX_HEAD + 1).saturating_sub(head.len()).min(scratch.len());
                let got = sock.read(&mut scratch[..room])?;
                if got == 0 {
                    return Ok(());
                }
                head.extend_from_slice(&scratch[..got]);
                continue;
            }
            Parsed::Refuse(status) => {
                let plan = http::refusal(&head, status);
                sock.write_all(&plan.head)?;
                for s in &plan.body {
                    if let Segment::Bytes(b) = s {
                        sock.write_all(b)?;
                    }
                }
                return Ok(());
            }
            Parsed::Request(r, n) => (r, n),
        };
        head.drain(..n);
        seq += 1;
        let plan = http::respond(&req, &Catalog(storage), &format!("ictus-fallback-{seq:x}"));
        let start = plan.stream.as_deref().and_then(|s| storage.lookup(s)).map_or(0, |s| s.start);
        sock.write_all(&plan.head)?;
        for s in &plan.body {
            match s {
                Segment::Bytes(b) => sock.write_all(b)?,
                Segment::Data { offset, len } => {
                    let (mut pos, end) = (start + offset, start + offset + len);
                    while pos < end {
                        let first = pos - pos % align;
                        let span_end = (first + buf_size as u64).min(end.next_multiple_of(align));
                        for p in storage.plan(first, span_end - first) {
                            let mut dst = buffer_mut(&mut pool, p.at as usize, p.len as usize);
                            let mut off = p.offset;
                            while !dst.is_empty() {
                                match rustix::io::pread(devices[usize::from(p.component)], &mut *dst, off) {
                                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                                    Ok(n) => {
                                        dst = &mut dst[n..];
                                        off += n as u64;
                                    }
                                    Err(rustix::io::Errno::INTR) => {}
                                    Err(e) => return Err(e.into()),
                                }
                            }
                        }
                        let skip = (pos - first) as usize;
                        let n = (span_end.min(end) - pos) as usize;
                        sock.write_all(pool.bytes(0, skip, n))?;
                        pos += n as u64;
                    }
                }
            }
        }
        if !plan.keep_alive {
            return Ok(());
        }
    }
}

fn buffer_mut(pool: &mut BufPool, at: usize, len: usize) -> &mut [u8] {
    assert!(at + len <= pool.buf_size());
    // SAFETY: the fallback's one-buffer pool belongs to this connection's thread; the
    // slice lies inside buffer 0 (checked above) and no other reference to it is alive
    // while it is filled.
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts_mut(pool.ptr(0).add(at), len)
    }
}

struct Catalog<'a>(&'a dyn Storage);

impl http::Catalog for Catalog<'_> {
    fn lookup(&self, name: &str) -> Option<http::Resource> {
        self.0.lookup(name).map(|s| http::Resource::Stream { len: s.len, etag: s.etag })
    }
}
