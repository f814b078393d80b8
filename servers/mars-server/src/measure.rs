//! Measuring what a volume can deliver, for admission control: the rate of `O_DIRECT`
//! reads of the stripe unit, `depth` in flight per component, across the volume's used
//! bytes (or all of it, if empty). The number admission works from is this measured
//! rate, never a figure from a data sheet.

use std::io;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

use crate::mmbuf::BufPool;
use crate::volume::Storage;

/// Reads the volume for about `window` and returns bytes per second.
pub fn capability(storage: &dyn Storage, depth: usize, window: Duration) -> io::Result<f64> {
    let devices = storage.devices();
    let unit = storage.max_read().clamp(4096, 1 << 20);
    let streams = storage.streams();
    let (start, end) = match (streams.first(), streams.last()) {
        (Some(a), Some(b)) if b.start + b.len > a.start => (a.start, b.start + b.len),
        _ => (0, unit * devices.len() as u64 * 64),
    };
    let span = (end - start).next_multiple_of(unit).max(unit);
    let depth = depth.max(1);
    let slots = depth * devices.len();
    let pool = BufPool::new(slots, unit as usize, 0)?;
    let mut ring = IoUring::new((slots as u32).next_power_of_two().max(8))?;
    let mut next = 0u64;
    let mut bytes = 0u64;
    let mut in_flight = 0usize;
    let t0 = Instant::now();
    // Submits the next unit's read into buffer `i`.
    let submit = |ring: &mut IoUring, i: usize, next: &mut u64| -> io::Result<()> {
        let v = start + (*next % span);
        *next += unit;
        let piece = storage.plan(v - v % unit, unit).into_iter().next();
        let Some(p) = piece else { return Ok(()) };
        let e = opcode::Read::new(
            types::Fd(std::os::fd::AsRawFd::as_raw_fd(&devices[usize::from(p.component)])),
            pool.ptr(i as u16),
            p.len as u32,
        )
        .offset(p.offset)
        .build()
        .user_data(i as u64);
        // SAFETY: the entry points into pool buffer `i`, which outlives the ring (the
        // loop below reaps every read before returning, and the pool is dropped after).
        unsafe { ring.submission().push(&e) }.map_err(|_| io::Error::other("submission queue full"))
    };
    for i in 0..slots {
        submit(&mut ring, i, &mut next)?;
        in_flight += 1;
    }
    let mut failure = None;
    while in_flight > 0 {
        ring.submit_and_wait(1)?;
        let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (i, res) in done {
            in_flight -= 1;
            if res < 0 {
                failure.get_or_insert(io::Error::from_raw_os_error(-res));
                continue;
            }
            bytes += res as u64;
            if t0.elapsed() < window && failure.is_none() {
                submit(&mut ring, i as usize, &mut next)?;
                in_flight += 1;
            }
        }
    }
    drop(ring);
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(bytes as f64 / t0.elapsed().as_secs_f64().max(1e-9))
}
