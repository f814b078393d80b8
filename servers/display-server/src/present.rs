//! The presenter: one thread that puts what changed on the screen, at most once per
//! refresh period for drawing (damage is merged meanwhile, as a compositor does), at
//! its time for frames, and at once for a sync that waits for the screen. Each cycle
//! ends with a round trip to the X server, after which the screen has everything the
//! cycle sent: then fenced syncs are answered, frames reported shown, and buffers the
//! screen no longer reads go back to their clients.
//!
//! A frame is sent ahead of its due time by the X server's measured latency for that
//! window (a running mean of send-to-acknowledge), so that it is on the screen when
//! due rather than that much after.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ictus_display::monotonic_ns;
use ictus_display::proto::Message;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::core::{lock, resize, Core, FrameJob, Out, Win};
use crate::raster::{Area, Surface};
use crate::x11::XEvent;

/// What the presenter remembers between cycles.
#[derive(Debug, Default)]
pub(crate) struct PresentState {
    /// When damage was last presented.
    last_damage: u64,
    /// Per window: the X server's latency for its frames (send to acknowledge).
    lead: HashMap<u64, u64>,
    /// The earliest time a queued frame is to be sent.
    next_due: Option<u64>,
}

/// One present cycle: due frames, damage (if the refresh period has passed, or
/// `force`), fenced syncs; then a round trip to the X server and what follows it.
/// Returns `Err` when the X server is gone. Any thread may run one (a transport
/// thread does for a sync that waits for the screen, saving two thread hops); they
/// take turns on the state's lock.
pub(crate) fn cycle(core: &Core, ps: &mut PresentState, force: bool) -> Result<bool, ()> {
    let now = monotonic_ns();
    let fences = std::mem::take(&mut *lock(&core.fences));
    let force = force || !fences.is_empty();
    let damage_now =
        core.damage_pending.load(Ordering::Acquire) && (now.saturating_sub(ps.last_damage) >= core.refresh_ns || force);
    if damage_now {
        core.damage_pending.store(false, Ordering::Release);
    }
    let wins: Vec<Arc<Win>> = lock(&core.windows).values().cloned().collect();
    ps.next_due = None;
    let mut frames: Vec<(Arc<Win>, Message)> = Vec::new();
    let mut framed: Vec<u64> = Vec::new();
    // Windows whose new frame's buffer goes back once the X server has it.
    let mut give_back: Vec<Arc<Win>> = Vec::new();
    let mut sent = false;
    for win in &wins {
        let mut st = lock(&win.st);
        if st.destroyed {
            continue;
        }
        let ahead = ps.lead.get(&win.key).copied().unwrap_or(0);
        let mut take: Option<FrameJob> = None;
        while let Some(f) = st.queue.front() {
            let send_at = f.due_ns.saturating_sub(ahead);
            if f.due_ns != 0 && send_at > now {
                ps.next_due = Some(ps.next_due.map_or(send_at, |d: u64| d.min(send_at)));
                break;
            }
            let f = st.queue.pop_front().expect("not empty");
            if let Some(prev) = take.replace(f) {
                // A later frame is due too: this one is never shown.
                core.stats.frames_dropped.fetch_add(1, Ordering::Relaxed);
                frames.push((
                    win.clone(),
                    Message::Frame { window: win.id, tag: prev.tag, due_ns: prev.due_ns, shown_ns: now, dropped: true },
                ));
                lock(&core.retired).push(prev.src);
            }
        }
        if let Some(f) = take {
            if let Some(old) = st.overlay.take() {
                // A viewed buffer is the client's again: if this frame was written
                // into it, the old frame's pixels are gone, and copying "them" in
                // would put this frame's bytes at the old one's geometry. The X server
                // still shows the old frame around this one; an expose there repaints
                // the contents (as an X client would be asked to).
                let overwritten = matches!(old.src, crate::core::FrameSrc::Viewed { .. })
                    && old.src.pool_buffer().is_some()
                    && old.src.pool_buffer() == f.src.pool_buffer();
                if overwritten || Area::of(f.rect).contains(&Area::of(old.rect)) {
                    lock(&core.retired).push(old.src);
                } else {
                    st.overlay = Some(old);
                    st.materialize(&core.retired);
                }
            }
            frames.push((
                win.clone(),
                Message::Frame { window: win.id, tag: f.tag, due_ns: f.due_ns, shown_ns: 0, dropped: false },
            ));
            framed.push(win.key);
            if f.give_back && core.x.is_some() {
                give_back.push(win.clone());
            }
            st.overlay = Some(f);
            st.overlay_dirty = true;
            if core.x.is_none() {
                // Headless: the frame goes into the contents now.
                st.materialize(&core.retired);
            }
        }
        let Some(x) = &core.x else {
            st.damage = Area::default();
            continue;
        };
        let Some(xw) = st.x else { continue };
        if damage_now {
            let d = std::mem::take(&mut st.damage);
            if !d.is_empty() {
                sent |= x.put_area(xw, &st.px, d).is_ok();
                // The contents under a frame not yet copied into them are stale: the
                // frame goes on top again.
                if st.overlay.as_ref().is_some_and(|f| !Area::of(f.rect).clip(&d).is_empty()) {
                    st.overlay_dirty = true;
                }
            }
        }
        if st.overlay_dirty {
            st.overlay_dirty = false;
            if let Some(f) = &st.overlay {
                let ok = match &f.src {
                    crate::core::FrameSrc::Held { held, seg: Some(seg) } => {
                        x.put_segment(xw, *seg, held.offset(), f.stride, f.rect).is_ok()
                    }
                    crate::core::FrameSrc::Viewed { view, seg: Some(seg) } => {
                        x.put_segment(xw, *seg, view.offset(), f.stride, f.rect).is_ok()
                    }
                    _ => false,
                };
                if !ok {
                    // Not in a segment the X server has: through the contents.
                    st.materialize(&core.retired);
                    let d = std::mem::take(&mut st.damage);
                    let _ = x.put_area(xw, &st.px, d);
                }
                sent = true;
            }
        }
    }
    drop(wins);
    if damage_now {
        ps.last_damage = now;
    }
    if !(sent || force || !frames.is_empty()) {
        return Ok(false);
    }
    // What was retired up to now is read, if at all, by requests sent before the round
    // trip below: free it once the X server has answered.
    let retired = std::mem::take(&mut *lock(&core.retired));
    let t_send = monotonic_ns();
    if let Some(x) = &core.x {
        x.ack().map_err(|_| ())?;
    }
    let t_ack = monotonic_ns();
    core.stats.presents.fetch_add(1, Ordering::Relaxed);
    for key in framed {
        let e = ps.lead.entry(key).or_insert(t_ack - t_send);
        *e = (*e * 7 + (t_ack - t_send)) / 8;
    }
    for f in fences {
        f.answer(t_send, t_ack);
    }
    for (win, mut m) in frames {
        if let Message::Frame { shown_ns, dropped: false, .. } = &mut m {
            *shown_ns = t_ack;
            core.stats.frames_shown.fetch_add(1, Ordering::Relaxed);
        }
        let mut b = Vec::with_capacity(32);
        m.encode(&mut b);
        win.outbox.push_wake(Out::Msg(b));
    }
    core.free(retired);
    if !give_back.is_empty() {
        // The X server has these frames: their buffers go back (after the retired ones,
        // so that the client lends this one first), through the shared-memory thread.
        lock(&core.give_back).extend(give_back);
        core.wake_shm();
    }
    if ps.lead.len() > 4 * lock(&core.windows).len() + 16 {
        let live = lock(&core.windows);
        ps.lead.retain(|k, _| live.contains_key(k));
    }
    Ok(true)
}

/// Run until `core.stop`.
pub(crate) fn run(core: Arc<Core>) {
    // Timer slack of 1 ns: a frame's timed wake-up is not deferred by the default
    // 50 µs (PR_SET_TIMERSLACK, no privilege needed).
    let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
    let mut xev = Vec::new();
    loop {
        if core.stop.load(Ordering::Acquire) {
            break;
        }
        if let Some(x) = &core.x {
            xev.clear();
            if x.poll_events(&mut xev).is_err() {
                eprintln!("ictus display: lost the X server; presenting stops");
                break;
            }
            for e in xev.drain(..) {
                x_event(&core, e);
            }
        }
        let (next_due, last_damage) = {
            let mut ps = lock(&core.present);
            match cycle(&core, &mut ps, false) {
                Ok(true) => continue,
                Ok(false) => {
                    // No cycle is in flight (they all hold this lock from their first
                    // request to the X server's answer): what was retired meanwhile
                    // is no longer read by the X server.
                    let retired = std::mem::take(&mut *lock(&core.retired));
                    core.free(retired);
                    (ps.next_due, ps.last_damage)
                }
                Err(()) => {
                    eprintln!("ictus display: lost the X server; presenting stops");
                    break;
                }
            }
        };
        // Sleep until woken, the next frame, or the next refresh.
        let mut wake_at = next_due;
        if core.damage_pending.load(Ordering::Acquire) {
            let r = last_damage + core.refresh_ns;
            wake_at = Some(wake_at.map_or(r, |w| w.min(r)));
        }
        let timeout = wake_at.map(|t| {
            let d = t.saturating_sub(monotonic_ns()).min(100_000_000);
            Timespec { tv_sec: (d / 1_000_000_000) as i64, tv_nsec: (d % 1_000_000_000) as i64 }
        });
        let timeout = timeout.or(Some(Timespec { tv_sec: 0, tv_nsec: 100_000_000 }));
        let mut fds = vec![PollFd::new(&core.present_wake, PollFlags::IN)];
        if let Some(x) = &core.x {
            fds.push(PollFd::from_borrowed_fd(x.fd(), PollFlags::IN));
        }
        let _ = poll(&mut fds, timeout.as_ref());
        let mut b = [0u8; 8];
        let _ = rustix::io::read(core.present_wake.as_fd(), &mut b);
    }
    // Stopping: answer what waits, so nobody hangs on a server that is going.
    for f in std::mem::take(&mut *lock(&core.fences)) {
        f.answer(0, 0);
    }
}

fn find(core: &Core, xid: u32) -> Option<Arc<Win>> {
    lock(&core.windows).values().find(|w| lock(&w.st).x.is_some_and(|x| x.id == xid)).cloned()
}

fn x_event(core: &Core, e: XEvent) {
    let xid = match e {
        XEvent::Expose { xid, .. }
        | XEvent::Configure { xid, .. }
        | XEvent::Key { xid, .. }
        | XEvent::Button { xid, .. }
        | XEvent::Motion { xid, .. } => xid,
    };
    let Some(win) = find(core, xid) else { return };
    let m = match e {
        XEvent::Expose { area, .. } => {
            let mut st = lock(&win.st);
            let a = area.clip(&Surface { px: &mut [], w: st.px.w, h: st.px.h }.bounds());
            st.damage = st.damage.union(&a);
            if st.overlay.is_some() {
                st.overlay_dirty = true;
            }
            drop(st);
            core.damaged();
            Message::Expose { window: win.id, rect: a.rect() }
        }
        XEvent::Configure { rect, .. } => {
            let mut st = lock(&win.st);
            if (rect.w, rect.h) == (st.rect.w, st.rect.h) {
                if (rect.x, rect.y) == (st.rect.x, st.rect.y) {
                    return;
                }
                st.rect = rect;
            } else {
                resize(core, &mut st, rect);
                drop(st);
                core.damaged();
            }
            Message::Configure { window: win.id, rect }
        }
        XEvent::Key { press, code, state, x, y, .. } => {
            Message::Key { window: win.id, press, keycode: code, state, x, y }
        }
        XEvent::Button { press, button, state, x, y, .. } => {
            Message::Button { window: win.id, press, button, state, x, y }
        }
        XEvent::Motion { state, x, y, .. } => Message::Motion { window: win.id, state, x, y },
    };
    let mut b = Vec::with_capacity(32);
    m.encode(&mut b);
    win.outbox.push_wake(Out::Msg(b));
}
