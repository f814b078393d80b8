//! The server's state: clients, presentations, streams and their queues, shared by
//! the loop thread (which takes records in) and the delivery thread (which hands items
//! to devices), under one priority-inheriting lock.
//!
//! Nothing here blocks: devices are opened before the lock is taken
//! ([`crate::device::open`]), and the delivery thread does its device work outside it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ictus_shm::Held;
use ictus_tactus::buffer::BufferAccount;
use ictus_tactus::policy::{Counts, LatePolicy};
use ictus_tactus::proto::{
    self, flags, item, Changed, Control, Delivered, ErrorReport, ItemHeader, PresentationStatus, Report, Status,
    StreamKind, StreamStatus,
};
use ictus_tactus::timemap::{Due, Motion, Rate, TimeMap};

use crate::audio::AudioSink;
use crate::device::Device;

/// A client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Conn {
    /// A shared-memory channel.
    Shm(u64),
    /// A socket.
    Socket(u64),
}

/// A presentation or stream, as its client numbers it.
pub type Key = (Conn, u32);

/// The most presentations per client.
pub const MAX_PRESENTATIONS: usize = 16;
/// The most streams per client.
pub const MAX_STREAMS: usize = 64;
/// The most attachments a client may have waiting for their item records.
pub const MAX_ATTACHMENTS: usize = 64;
/// The most bytes of in-line items one client may have queued.
pub const MAX_QUEUED_BYTES: u64 = 64 << 20;
/// The most items queued on one stream.
pub const MAX_QUEUED_ITEMS: usize = 16_384;
/// The most reports waiting for one client before the oldest delivery reports go.
pub const MAX_OUTBOX: usize = 65_536;

/// An item's payload.
#[derive(Debug)]
pub enum Data {
    /// Copied out of the ring (or the socket).
    Inline(Vec<u8>),
    /// A pool buffer of the client's channel, held until delivered; `len` used.
    Held(Held, usize),
}

impl Data {
    /// Bytes.
    pub fn len(&self) -> usize {
        match self {
            Data::Inline(v) => v.len(),
            Data::Held(_, n) => *n,
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copy into `dst` (the first `min(len, dst.len())` bytes); how many.
    pub fn copy_to(&self, dst: &mut [u8]) -> usize {
        match self {
            Data::Inline(v) => {
                let n = v.len().min(dst.len());
                dst[..n].copy_from_slice(&v[..n]);
                n
            }
            Data::Held(h, n) => {
                let k = (*n).min(dst.len());
                h.payload().copy_to(&mut dst[..k])
            }
        }
    }

    /// A copy of the bytes (small payloads: MIDI, data).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.copy_to(&mut v);
        v
    }
}

/// An item waiting for its time.
#[derive(Debug)]
pub struct Item {
    /// Its header.
    pub h: ItemHeader,
    /// Its payload.
    pub data: Data,
    /// When the server took it in.
    pub received: u64,
}

/// A presentation.
#[derive(Debug)]
pub struct Pres {
    /// Its time map, on its clock.
    pub map: TimeMap,
    /// The device whose clock is the presentation's clock, if any.
    pub master: Option<Arc<AudioSink>>,
}

impl Pres {
    /// The presentation clock at system time `mono`.
    pub fn clock_at(&self, mono: u64) -> u64 {
        match &self.master {
            None => mono,
            Some(a) => a.tracker().device_ns_at(mono),
        }
    }

    /// The system time of presentation clock time `c`.
    pub fn to_mono(&self, c: u64) -> u64 {
        match &self.master {
            None => c,
            Some(a) => a.tracker().mono_of_device_ns(c),
        }
    }
}

/// A stream.
#[derive(Debug)]
pub struct Stream {
    /// Its presentation's number.
    pub pres: u32,
    /// What it carries.
    pub kind: StreamKind,
    /// Report every item.
    pub report: bool,
    /// Its late policy.
    pub policy: LatePolicy,
    /// Its device.
    pub dev: Device,
    /// Items waiting, in the order received.
    pub queue: VecDeque<Item>,
    /// Buffer account.
    pub buf: BufferAccount,
    /// Delivery counts.
    pub counts: Counts,
}

/// A client.
#[derive(Debug, Default)]
pub struct Client {
    /// Pool buffers committed before their item records.
    pub attachments: VecDeque<Held>,
    /// In-line bytes queued.
    pub queued_bytes: u64,
}

/// Server-wide counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Records taken in.
    pub records: u64,
    /// Items taken in.
    pub items: u64,
    /// Records refused (each answered with an error report).
    pub refused: u64,
    /// Items handed to devices.
    pub delivered: u64,
    /// Reports dropped because a client's reply ring or outbox was full.
    pub reports_dropped: u64,
    /// Clients ever.
    pub clients: u64,
}

/// What a time map change needs from the presentation's devices: how far ahead they
/// have been given items (the change takes effect after that).
pub fn change_delay(streams: &BTreeMap<Key, Stream>, conn: Conn, pres: u32) -> Duration {
    streams
        .iter()
        .filter(|((c, _), s)| *c == conn && s.pres == pres)
        .map(|(_, s)| s.dev.lead())
        .max()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_millis(5))
}

/// The shared state.
#[derive(Debug, Default)]
pub struct Core {
    /// Clients.
    pub clients: BTreeMap<Conn, Client>,
    /// Presentations.
    pub pres: BTreeMap<Key, Pres>,
    /// Streams.
    pub streams: BTreeMap<Key, Stream>,
    /// Held pool buffers the delivery thread is done with, for the loop to release.
    pub releases: Vec<Held>,
    /// Reports for clients, sent by the loop.
    pub outbox: VecDeque<(Conn, Report)>,
    /// Stop the delivery thread.
    pub stop: bool,
    /// Counters.
    pub counters: Counters,
    /// Bumped at every change the delivery thread must look at.
    pub generation: u64,
}

/// An error to report to a client.
fn err(conn: Conn, id: u32, text: impl Into<String>) -> (Conn, Report) {
    (conn, Report::Error(ErrorReport { id, text: text.into() }))
}

/// What the loop must do after [`Core::control`].
#[derive(Debug, Default)]
pub struct Effects {
    /// Devices to close (outside the lock: closing may wait for a device thread).
    pub closed: Vec<Device>,
}

impl Core {
    /// A client connected.
    pub fn connected(&mut self, conn: Conn) {
        self.clients.insert(conn, Client::default());
        self.counters.clients += 1;
    }

    /// A client went (closed, died, or was cut off): everything of it goes. Returns
    /// its devices, to close outside the lock, and its held buffers.
    pub fn gone(&mut self, conn: Conn) -> (Vec<Device>, Vec<Held>) {
        let mut devices = Vec::new();
        let mut held = Vec::new();
        let keys: Vec<Key> = self.streams.keys().filter(|(c, _)| *c == conn).copied().collect();
        for k in keys {
            if let Some(s) = self.streams.remove(&k) {
                devices.push(s.dev);
                held.extend(s.queue.into_iter().filter_map(|i| match i.data {
                    Data::Held(h, _) => Some(h),
                    Data::Inline(_) => None,
                }));
            }
        }
        self.pres.retain(|(c, _), _| *c != conn);
        if let Some(c) = self.clients.remove(&conn) {
            held.extend(c.attachments);
        }
        self.outbox.retain(|(c, _)| *c != conn);
        self.generation += 1;
        (devices, held)
    }

    fn push_report(&mut self, conn: Conn, r: Report) {
        if self.outbox.len() >= MAX_OUTBOX {
            self.counters.reports_dropped += 1;
            return;
        }
        self.outbox.push_back((conn, r));
    }

    /// A control record other than opening a stream (which needs its device opened
    /// first: [`Core::open_stream`]). `mono` is the system time now.
    pub fn control(&mut self, conn: Conn, c: Control, mono: u64) -> Effects {
        let mut fx = Effects::default();
        self.generation += 1;
        let (report, err_report): (Option<Report>, Option<(Conn, Report)>) = match c {
            Control::OpenPresentation { id } => {
                let n = self.pres.keys().filter(|(c, _)| *c == conn).count();
                match self.pres.entry((conn, id)) {
                    std::collections::btree_map::Entry::Occupied(_) => {
                        (None, Some(err(conn, id, format!("presentation {id} is already open"))))
                    }
                    std::collections::btree_map::Entry::Vacant(_) if n >= MAX_PRESENTATIONS => {
                        (None, Some(err(conn, id, format!("at most {MAX_PRESENTATIONS} presentations per client"))))
                    }
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(Pres { map: TimeMap::new(), master: None });
                        (None, None)
                    }
                }
            }
            Control::ClosePresentation { id } => {
                let keys: Vec<Key> =
                    self.streams.iter().filter(|((c, _), s)| *c == conn && s.pres == id).map(|(k, _)| *k).collect();
                for k in keys {
                    if let Some(s) = self.streams.remove(&k) {
                        self.flush_queue_into_releases(s.queue);
                        fx.closed.push(s.dev);
                    }
                }
                self.pres.remove(&(conn, id));
                (None, None)
            }
            Control::OpenStream { id, .. } => {
                (None, Some(err(conn, id, "internal: streams are opened with their device")))
            }
            Control::CloseStream { id } => match self.streams.remove(&(conn, id)) {
                Some(s) => {
                    self.flush_queue_into_releases(s.queue);
                    fx.closed.push(s.dev);
                    (None, None)
                }
                None => (None, Some(err(conn, id, format!("no stream {id}")))),
            },
            Control::EndStream { id } => match self.streams.get_mut(&(conn, id)) {
                Some(s) => {
                    s.buf.ended = true;
                    (None, None)
                }
                None => (None, Some(err(conn, id, format!("no stream {id}")))),
            },
            Control::Status => (Some(Report::Status(self.status(conn, mono))), None),
            Control::Start { presentation, logical, at } => self.change(conn, presentation, mono, |m, t| {
                let t = t.max(at);
                m.start(t, logical).map(|()| t)
            }),
            Control::Pause { presentation } => self.change(conn, presentation, mono, |m, t| m.pause(t).map(|()| t)),
            Control::Resume { presentation } => self.change(conn, presentation, mono, |m, t| m.resume(t).map(|()| t)),
            Control::Seek { presentation, logical } => {
                self.change(conn, presentation, mono, |m, t| m.seek(t, logical).map(|_| t))
            }
            Control::Rate { presentation, rate } => self.change(conn, presentation, mono, |m, t| {
                let r = Rate::new(rate).unwrap_or(Rate::ONE);
                m.set_rate(t, r).map(|()| t)
            }),
        };
        if let Some(r) = report {
            self.push_report(conn, r);
        }
        if let Some((c, r)) = err_report {
            self.counters.refused += 1;
            self.push_report(c, r);
        }
        fx
    }

    /// Apply a time map change at the earliest instant that keeps what devices were
    /// already given right: now + the longest lead among the presentation's streams.
    fn change(
        &mut self,
        conn: Conn,
        id: u32,
        mono: u64,
        f: impl FnOnce(&mut TimeMap, u64) -> Result<u64, ictus_tactus::timemap::MapError>,
    ) -> (Option<Report>, Option<(Conn, Report)>) {
        let delay = change_delay(&self.streams, conn, id).as_nanos() as u64;
        let Some(p) = self.pres.get_mut(&(conn, id)) else {
            return (None, Some(err(conn, id, format!("no presentation {id}"))));
        };
        let now_c = p.clock_at(mono);
        // Never before the last change (a change scheduled ahead is not undone).
        let last = p.map.segments().last().map_or(0, |s| s.from);
        let t = (now_c + delay).max(last);
        match f(&mut p.map, t) {
            Ok(at) => {
                let (epoch, logical) = p.map.logical_at(at);
                let changed = Changed { presentation: id, epoch, at: p.to_mono(at), logical };
                p.map.forget_before(now_c.saturating_sub(10_000_000_000));
                (Some(Report::Changed(changed)), None)
            }
            Err(e) => (None, Some(err(conn, id, e.to_string()))),
        }
    }

    /// Open a stream whose device is `dev` (opened by the caller, outside the lock).
    /// Returns the device back if the stream cannot be opened (to close outside).
    pub fn open_stream(&mut self, conn: Conn, c: &Control, dev: Device) -> Result<(), Device> {
        let Control::OpenStream { id, presentation, kind, flags: f, policy, .. } = *c else { return Err(dev) };
        self.generation += 1;
        let n = self.streams.keys().filter(|(c, _)| *c == conn).count();
        let why = if self.streams.contains_key(&(conn, id)) {
            Some(format!("stream {id} is already open"))
        } else if n >= MAX_STREAMS {
            Some(format!("at most {MAX_STREAMS} streams per client"))
        } else if !self.pres.contains_key(&(conn, presentation)) {
            Some(format!("no presentation {presentation}"))
        } else {
            None
        };
        if let Some(why) = why {
            self.counters.refused += 1;
            self.push_report(conn, Report::Error(ErrorReport { id, text: why }));
            return Err(dev);
        }
        if f & flags::MASTER != 0 {
            if let (Device::Audio { sink, .. }, Some(p)) = (&dev, self.pres.get_mut(&(conn, presentation))) {
                if p.map.motion() == Motion::Stopped {
                    p.master = Some(sink.clone());
                } else {
                    self.push_report(
                        conn,
                        Report::Error(ErrorReport {
                            id,
                            text: "a presentation's clock is chosen before it starts; this stream follows it".into(),
                        }),
                    );
                }
            }
        }
        self.streams.insert(
            (conn, id),
            Stream {
                pres: presentation,
                kind,
                report: f & flags::REPORT != 0,
                policy: LatePolicy::from_wire(policy),
                dev,
                queue: VecDeque::new(),
                buf: BufferAccount::default(),
                counts: Counts::default(),
            },
        );
        Ok(())
    }

    fn flush_queue_into_releases(&mut self, q: VecDeque<Item>) {
        for i in q {
            if let Data::Held(h, _) = i.data {
                self.releases.push(h);
            }
        }
    }

    /// An item arrived (`attached`: its payload is the client's oldest attachment).
    /// Returns a held buffer to release at once if the item is refused.
    pub fn item(&mut self, conn: Conn, h: ItemHeader, inline: &[u8], received: u64) -> Option<Held> {
        self.counters.items += 1;
        let attached = h.flags & item::ATTACHED != 0;
        let client = self.clients.get_mut(&conn)?;
        let data = if attached {
            match client.attachments.pop_front() {
                Some(held) if held.len() >= h.len as usize => Data::Held(held, h.len as usize),
                Some(held) => {
                    let got = held.len();
                    self.refuse_item(conn, &h, format!("an item of {} bytes in an attachment of {got}", h.len));
                    return Some(held);
                }
                None => {
                    self.refuse_item(conn, &h, "an attached item without an attachment".into());
                    return None;
                }
            }
        } else {
            if client.queued_bytes + inline.len() as u64 > MAX_QUEUED_BYTES {
                self.refuse_item(conn, &h, format!("more than {MAX_QUEUED_BYTES} bytes queued in the ring's items"));
                return None;
            }
            client.queued_bytes += inline.len() as u64;
            Data::Inline(inline.to_vec())
        };
        let Some(s) = self.streams.get_mut(&(conn, h.stream)) else {
            return self.refuse_data(conn, &h, data, format!("no stream {}", h.stream));
        };
        let unit = s.kind.unit_bytes();
        let ok = match s.kind {
            StreamKind::Video { .. } => data.len() == unit,
            StreamKind::Audio { .. } => data.len() % unit == 0 && !data.is_empty(),
            StreamKind::Midi => (1..=65_536).contains(&data.len()),
            StreamKind::Data => true,
        };
        if !ok {
            let why = format!("{} bytes are not an item of a {} stream", data.len(), s.kind.name());
            return self.refuse_data(conn, &h, data, why);
        }
        if s.queue.len() >= MAX_QUEUED_ITEMS {
            return self.refuse_data(
                conn,
                &h,
                data,
                format!("more than {MAX_QUEUED_ITEMS} items queued on one stream"),
            );
        }
        let end = h.logical.saturating_add(h.duration.min(i64::MAX as u64) as i64);
        s.buf.queued(data.len() as u64, end);
        s.queue.push_back(Item { h, data, received });
        self.generation += 1;
        None
    }

    fn refuse_item(&mut self, conn: Conn, h: &ItemHeader, why: String) {
        self.counters.refused += 1;
        if let Some(s) = self.streams.get_mut(&(conn, h.stream)) {
            s.counts.refused += 1;
        }
        self.push_report(conn, Report::Error(ErrorReport { id: h.stream, text: format!("item {}: {why}", h.seq) }));
    }

    fn refuse_data(&mut self, conn: Conn, h: &ItemHeader, data: Data, why: String) -> Option<Held> {
        self.refuse_item(conn, h, why);
        match data {
            Data::Held(held, _) => Some(held),
            Data::Inline(v) => {
                if let Some(c) = self.clients.get_mut(&conn) {
                    c.queued_bytes = c.queued_bytes.saturating_sub(v.len() as u64);
                }
                None
            }
        }
    }

    /// An attachment arrived.
    pub fn attachment(&mut self, conn: Conn, held: Held) -> Option<Held> {
        match self.clients.get_mut(&conn) {
            Some(c) if c.attachments.len() < MAX_ATTACHMENTS => {
                c.attachments.push_back(held);
                None
            }
            Some(_) => {
                self.counters.refused += 1;
                self.push_report(
                    conn,
                    Report::Error(ErrorReport {
                        id: 0,
                        text: format!("more than {MAX_ATTACHMENTS} attachments without their items"),
                    }),
                );
                Some(held)
            }
            None => Some(held),
        }
    }

    /// A client's status now.
    pub fn status(&self, conn: Conn, mono: u64) -> Status {
        let mut st = Status { now: mono, ..Status::default() };
        for ((c, id), p) in &self.pres {
            if *c != conn {
                continue;
            }
            let clock = p.clock_at(mono);
            let (epoch, position) = p.map.logical_at(clock);
            st.presentations.push(PresentationStatus {
                id: *id,
                epoch,
                motion: match p.map.motion_at(clock) {
                    Motion::Stopped => 0,
                    Motion::Running => 1,
                    Motion::Paused => 2,
                },
                device_clock: p.master.is_some(),
                rate: p.map.rate().get(),
                position,
                skew_ppm: p.master.as_ref().map_or(0.0, |a| a.tracker().skew_ppm()),
            });
        }
        for ((c, id), s) in &self.streams {
            if *c != conn {
                continue;
            }
            let position = self.pres.get(&(conn, s.pres)).map_or(0, |p| p.map.logical_at(p.clock_at(mono)).1);
            let (device_bytes, device_underruns) = match &s.dev {
                Device::Audio { sink, .. } => {
                    (sink.queued_frames() * u64::from(sink.channels()) * 2, sink.stats().underruns)
                }
                _ => (0, 0),
            };
            st.streams.push(StreamStatus {
                id: *id,
                items: s.queue.len() as u32,
                bytes: s.buf.bytes,
                level_ns: s.buf.level(position),
                on_time: s.counts.on_time,
                late: s.counts.late,
                dropped: s.counts.dropped,
                flushed: s.counts.flushed,
                refused: s.counts.refused,
                underruns: s.buf.underruns,
                device_bytes,
                device_underruns,
            });
        }
        st
    }

    /// Clients that have presentations (for periodic status reports).
    pub fn clients_with_presentations(&self) -> Vec<Conn> {
        let mut v: Vec<Conn> = self.pres.keys().map(|(c, _)| *c).collect();
        v.dedup();
        v
    }

    /// Account for an item that left its queue, and queue its report.
    #[allow(clippy::too_many_arguments)]
    pub fn finished(
        &mut self,
        key: Key,
        item: Item,
        due: u64,
        handed: u64,
        presented: u64,
        flags_: u32,
        delivered_end: Option<i64>,
    ) {
        let conn = key.0;
        let bytes = item.data.len() as u64;
        if let Data::Inline(_) = item.data {
            if let Some(c) = self.clients.get_mut(&conn) {
                c.queued_bytes = c.queued_bytes.saturating_sub(bytes);
            }
        }
        let Some(s) = self.streams.get_mut(&key) else {
            if let Data::Held(h, _) = item.data {
                self.releases.push(h);
            }
            return;
        };
        s.buf.left(bytes, delivered_end);
        let report = s.report;
        if let Data::Held(h, _) = item.data {
            self.releases.push(h);
        }
        if flags_ & (proto::delivered::DROPPED | proto::delivered::FLUSHED) == 0 {
            self.counters.delivered += 1;
        }
        if report {
            self.push_report(
                conn,
                Report::Delivered(Delivered {
                    stream: key.1,
                    flags: flags_,
                    seq: item.h.seq,
                    logical: item.h.logical,
                    due,
                    received: item.received,
                    handed,
                    presented,
                    sent: item.h.sent,
                }),
            );
        }
    }

    /// A device's late report of when an item was presented (a video frame the screen
    /// had, or dropped).
    /// Stream `key`'s device is gone: tell its client, once, why.
    pub fn device_lost(&mut self, key: Key, why: &str) {
        if self.streams.contains_key(&key) {
            self.push_report(
                key.0,
                Report::Error(ErrorReport {
                    id: key.1,
                    text: format!("the device is lost ({why}); the stream's items are dropped from now on"),
                }),
            );
        }
    }

    pub fn device_report(&mut self, key: Key, d: Delivered) {
        if self.streams.get(&key).is_some_and(|s| s.report) {
            self.push_report(key.0, Report::Delivered(d));
        }
    }

    /// When the item at the head of stream `key` is due, on the system clock.
    pub fn head_due(&self, key: &Key) -> Option<(Due, u64)> {
        let s = self.streams.get(key)?;
        let i = s.queue.front()?;
        let p = self.pres.get(&(key.0, s.pres))?;
        Some(match p.map.due(i.h.epoch, i.h.logical) {
            Due::At(c) => (Due::At(c), p.to_mono(c)),
            other => (other, 0),
        })
    }
}

/// Per-client maps the loop keeps beside the core.
pub type ConnMap<T> = HashMap<Conn, T>;
