//! The shared-memory transport: every client's ring (`ictus-shm`), one server flag
//! only the server writes, one thread sleeping in `futex_waitv` on every client's
//! doorbell and on a channel of the server's own (the back door other threads ring).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use ictus_display::service;
use ictus_display::spin::SpinPolicy;
use ictus_shm::{ClientId, Event, Next, WaitConfig};

use super::{put_back, take_msgs};
use crate::core::{lock, Core, FrameSrc, Outbox, Session};

/// Largest record of messages sent to a shared-memory client at once.
const SHM_OUT_MAX: usize = 16 << 10;

/// The shared-memory transport: every client's ring, one server flag, one thread.
/// Before each wait it spins up to `wait.spin`, as the machine allows (see
/// [`SpinPolicy`]): while it spins its flag says it is awake, so clients' records need
/// no wake-up at all.
pub(crate) fn run(core: Arc<Core>, mut server: ictus_shm::Server, wait: WaitConfig) {
    let mut sessions: HashMap<ClientId, Session> = HashMap::new();
    let mut backdoor: Option<ClientId> = None;
    let mut batch = Vec::with_capacity(64 << 10);
    let waker = || lock(&core.shm_waker).clone();
    let mut spin = SpinPolicy::new(wait.spin);
    let mut spinning = None;
    while !core.stop.load(Ordering::Acquire) {
        let s = spin.spin(Instant::now());
        if spinning != Some(s) {
            server.set_wait(WaitConfig { spin: s, liveness: wait.liveness });
            spinning = Some(s);
        }
        if let Err(e) = server.wait(Some(wait.liveness)) {
            eprintln!("ictus display: shared-memory transport stops: {e}");
            break;
        }
        release(&mut server, &core);
        loop {
            let mut close = None;
            // A client whose batch was executed: its answers go out before the next
            // look at the rings (see `deliver`).
            let mut answer = None;
            let event = match server.try_next() {
                None => break,
                Some(Next::Event(e)) => Some(e),
                Some(Next::Record(r)) => {
                    let id = r.client();
                    match sessions.get_mut(&id) {
                        _ if Some(id) == backdoor => {}
                        None => {}
                        Some(s) => match (r.tag(), r.is_pool()) {
                            (service::TAG_ATTACH, true) => {
                                let seg = s.channel_seg;
                                if let Some(held) = r.hold() {
                                    s.attach(&core, FrameSrc::Held { held, seg });
                                }
                            }
                            (service::TAG_BATCH, false) => {
                                // Shared memory the client can still write: copy, then parse.
                                batch.clear();
                                batch.resize(r.payload().len(), 0);
                                r.payload().copy_to(&mut batch);
                                drop(r);
                                if s.execute(&core, &batch).is_err() {
                                    close = Some(id);
                                } else {
                                    answer = Some(id);
                                }
                            }
                            _ => close = Some(id),
                        },
                    }
                    None
                }
            };
            match event {
                Some(Event::Opened { client, geometry, .. }) => {
                    if backdoor.is_none() {
                        // The first channel is the server's own (see `Waker::Shm`).
                        backdoor = Some(client);
                        continue;
                    }
                    let Some(w) = waker() else { continue };
                    let mut s = Session::new(&core, Outbox::new(w));
                    if let (Some(x), true) = (&core.x, geometry.pool.slots > 0) {
                        if x.has_shm() && geometry.total() <= u64::from(u32::MAX) {
                            if let Some(fd) = server.channel_fd(client) {
                                s.channel_seg = x.attach(fd).ok();
                                let _ = x.flush();
                            }
                        }
                    }
                    sessions.insert(client, s);
                }
                Some(Event::Closed { client, .. }) => {
                    if let Some(s) = sessions.remove(&client) {
                        s.close(&core);
                    }
                }
                None => {}
            }
            if let Some(id) = answer {
                // Buffers the batch's present cycle retired go back first (the X server
                // has acknowledged everything that read them): the client, woken by its
                // answer, then lends again the buffer it wrote two frames ago, still in
                // the cache, rather than a third or fourth one (doc/display.md).
                release(&mut server, &core);
                if sessions.get(&id).is_some_and(|s| !deliver(&mut server, &core, id, s)) {
                    close = Some(id);
                }
            }
            if let Some(id) = close {
                core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
                server.close(id);
            }
        }
        // Deliver what waits (what other threads queued: frames shown, fenced syncs,
        // X events).
        let mut cut = Vec::new();
        for (id, s) in &sessions {
            if !deliver(&mut server, &core, *id, s) {
                cut.push(*id);
            }
        }
        for id in cut {
            core.stats.cut_off.fetch_add(1, Ordering::Relaxed);
            server.close(id);
        }
    }
    for (_, s) in sessions.drain() {
        s.close(&core);
    }
}

/// Give back the pool buffers other threads (or this one) are done with; then the
/// buffers of frames the X server has and whose clients wait for each frame
/// ([`crate::core::FrameJob::give_back`]), which the windows keep seeing. Those go last,
/// so that the client's next loan (the most recently returned buffer first) is the
/// frame's own buffer.
fn release(server: &mut ictus_shm::Server, core: &Core) {
    for h in std::mem::take(&mut *lock(&core.release)) {
        server.release(h);
    }
    let wins = std::mem::take(&mut *lock(&core.give_back));
    if wins.is_empty() {
        return;
    }
    // No present cycle is in flight while this is held (they hold it from their first
    // request to the X server's answer): a frame marked to give back and shown is one
    // the X server has acknowledged.
    let _cycles = lock(&core.present);
    for win in wins {
        let mut st = lock(&win.st);
        let Some(f) = st.overlay.as_mut().filter(|f| f.give_back) else { continue };
        f.give_back = false;
        let src = std::mem::replace(&mut f.src, FrameSrc::Bytes(Vec::new()));
        f.src = match src {
            FrameSrc::Held { held, seg } => match server.release_viewed(held) {
                Ok(view) => FrameSrc::Viewed { view, seg },
                Err(held) => FrameSrc::Held { held, seg },
            },
            other => other,
        };
    }
}

/// Send what waits in `s`'s outbox to its reply ring; `false` if the client is to be
/// cut off (its ring stays full while its outbox overflows).
///
/// Called right after a batch is executed, not only after every ring is drained: the
/// answer to a sync then goes out (and wakes the client) before the ring's next look,
/// whose wake-up "for room" would otherwise reach a client that sleeps for its answer,
/// which, if it then ran at once, found nothing and slept again (an extra context
/// switch pair in about one muncher iteration in eight; doc/display.md). With the
/// answer first, that later wake-up belongs to the sleep already woken and is not sent.
fn deliver(server: &mut ictus_shm::Server, core: &Core, id: ClientId, s: &Session) -> bool {
    loop {
        let bytes = take_msgs(&s.outbox, SHM_OUT_MAX);
        if bytes.is_empty() {
            return true;
        }
        match server.send_to(id, 1, &bytes) {
            Ok(()) => {}
            Err(ictus_shm::ReplyError::Full) => {
                put_back(&s.outbox, bytes);
                return lock(&s.outbox.q).len() <= core.limits.outbox;
            }
            Err(_) => return true,
        }
    }
}
