//! The Tactus toolkit (000 §7.1): a program is a set of *active objects* that ask to
//! run at logical times; the toolkit runs them early, by a lead it manages,
//! timestamps what they make and sends it to Tactus, which presents it on time.
//!
//! "The programmer can often write multimedia programs as a collection of simple
//! active objects, which request to be run at specific times. Tactus automatically
//! runs the objects early, timestamps the output, delivers it to the server, and
//! synchronizes the output with streams from other objects."
//!
//! - [`Active`]: an object; [`Cx`] is what a run sees (its logical time) and does
//!   (emit items on streams, ask for its next run).
//! - [`Agenda`]: which object runs next (pure, ordered by time then by when asked).
//! - [`Lead`]: how far ahead of the presentation objects run (pure): it grows when
//!   Tactus reports late items or underruns, and shrinks slowly while all is well, so
//!   a program runs as little ahead as the machine allows (less to undo on a seek,
//!   quicker response to input) and as much as it needs.
//! - [`Scheduler`]: objects and agenda, run up to a logical horizon (pure).
//! - [`Runner`]: a scheduler driven against a running presentation.
//!
//! Time is a parameter everywhere but in [`Runner`], so the scheduling is tested on a
//! virtual clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use crate::client::{monotonic_ns, PresentationId, StreamId, Tactus, TactusError};
use crate::proto::{Report, Status};

/// One item an object made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// The stream.
    pub stream: StreamId,
    /// Logical time (ns).
    pub logical: i64,
    /// Duration (ns).
    pub duration: u64,
    /// The payload.
    pub payload: Vec<u8>,
}

/// What an object sees and does when it runs.
#[derive(Debug)]
pub struct Cx<'a> {
    now: i64,
    next: Option<i64>,
    out: &'a mut Vec<Output>,
}

impl Cx<'_> {
    /// The logical time this run is for (not the time it runs at: it runs early).
    pub fn now(&self) -> i64 {
        self.now
    }

    /// Emit `payload` on `stream`, presented at this run's time for `duration` ns.
    pub fn emit(&mut self, stream: StreamId, duration: u64, payload: Vec<u8>) {
        self.emit_at(stream, self.now, duration, payload);
    }

    /// Emit `payload` presented at logical time `at` (at or after this run's time).
    pub fn emit_at(&mut self, stream: StreamId, at: i64, duration: u64, payload: Vec<u8>) {
        self.out.push(Output { stream, logical: at.max(self.now), duration, payload });
    }

    /// Run again at logical time `t` (later than now; otherwise right after now).
    pub fn at(&mut self, t: i64) {
        self.next = Some(t.max(self.now.saturating_add(1)));
    }

    /// Run again `d` later.
    pub fn after(&mut self, d: Duration) {
        self.at(self.now.saturating_add(d.as_nanos().min(i64::MAX as u128) as i64));
    }
}

/// An active object.
pub trait Active {
    /// Run at logical time `cx.now()`: emit what belongs to that time, and ask for the
    /// next run ([`Cx::at`], [`Cx::after`]); an object that asks nothing is done.
    fn run(&mut self, cx: &mut Cx<'_>);
}

/// Which object runs next: a queue ordered by logical time, then by the order asked.
#[derive(Debug, Default)]
pub struct Agenda {
    heap: BinaryHeap<Reverse<(i64, u64, usize)>>,
    seq: u64,
}

impl Agenda {
    /// Ask for object `obj` to run at `t`.
    pub fn ask(&mut self, t: i64, obj: usize) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, obj)));
    }

    /// The next request's time.
    pub fn next_time(&self) -> Option<i64> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Take the next request if it is at or before `horizon`.
    pub fn pop_until(&mut self, horizon: i64) -> Option<(i64, usize)> {
        match self.heap.peek() {
            Some(Reverse((t, _, _))) if *t <= horizon => self.heap.pop().map(|Reverse((t, _, o))| (t, o)),
            _ => None,
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether none are waiting.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// How far ahead of the presentation objects run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lead {
    /// The lead now.
    pub current: Duration,
    /// Never less.
    pub min: Duration,
    /// Never more.
    pub max: Duration,
    /// Factor by which trouble grows it.
    pub grow: f64,
    /// Fraction by which it shrinks per second without trouble.
    pub shrink_per_s: f64,
    /// The last trouble count seen, to count new trouble only.
    seen: u64,
}

impl Lead {
    /// A lead starting at `start`, kept in `[min, max]`.
    pub fn new(start: Duration, min: Duration, max: Duration) -> Lead {
        Lead { current: start.clamp(min, max), min, max, grow: 1.5, shrink_per_s: 0.02, seen: 0 }
    }

    /// Tactus's counts so far (late + dropped + underruns over the streams), `dt`
    /// since the last call: grow on new trouble, shrink slowly otherwise. Returns the
    /// lead.
    pub fn update(&mut self, trouble: u64, dt: Duration) -> Duration {
        if trouble > self.seen {
            self.current = self.current.mul_f64(self.grow);
        } else {
            self.current = self.current.mul_f64((1.0 - self.shrink_per_s).powf(dt.as_secs_f64()));
        }
        self.seen = trouble.max(self.seen);
        self.current = self.current.clamp(self.min, self.max);
        self.current
    }

    /// The trouble in a status report: late, dropped and underruns of every stream.
    pub fn trouble(st: &Status) -> u64 {
        st.streams.iter().map(|s| s.late + s.dropped + s.underruns + s.device_underruns).sum()
    }
}

/// Objects and their agenda.
#[derive(Default)]
pub struct Scheduler {
    objects: Vec<Option<Box<dyn Active>>>,
    agenda: Agenda,
    runs: u64,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scheduler({} objects, {} runs)", self.objects.len(), self.runs)
    }
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new() -> Scheduler {
        Scheduler::default()
    }

    /// Add an object, first run at logical time `first`.
    pub fn add(&mut self, obj: impl Active + 'static, first: i64) -> usize {
        self.objects.push(Some(Box::new(obj)));
        let i = self.objects.len() - 1;
        self.agenda.ask(first, i);
        i
    }

    /// Run every object whose time is at or before `horizon`, in time order, appending
    /// what they emit to `out`. Returns how many runs.
    pub fn run_until(&mut self, horizon: i64, out: &mut Vec<Output>) -> usize {
        let mut n = 0;
        while let Some((t, i)) = self.agenda.pop_until(horizon) {
            let Some(obj) = self.objects[i].as_mut() else { continue };
            let mut cx = Cx { now: t, next: None, out };
            obj.run(&mut cx);
            match cx.next {
                Some(next) => self.agenda.ask(next, i),
                None => self.objects[i] = None,
            }
            n += 1;
        }
        self.runs += n as u64;
        n
    }

    /// When the next run is due (logical).
    pub fn next_time(&self) -> Option<i64> {
        self.agenda.next_time()
    }

    /// Whether every object is done.
    pub fn done(&self) -> bool {
        self.agenda.is_empty()
    }

    /// Runs so far.
    pub fn runs(&self) -> u64 {
        self.runs
    }
}

/// What a [`Runner`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Items sent.
    pub sent: u64,
    /// Object runs.
    pub runs: u64,
    /// The lead at the end.
    pub lead: Duration,
    /// The most the lead reached.
    pub max_lead: Duration,
    /// Trouble (late, dropped, underruns) Tactus reported.
    pub trouble: u64,
}

/// Drives a [`Scheduler`] against presentation `p`: runs objects by the lead ahead of
/// the presentation's position, sends what they make, and adapts the lead to Tactus's
/// status reports.
#[derive(Debug)]
pub struct Runner {
    /// The presentation.
    pub p: PresentationId,
    /// The lead.
    pub lead: Lead,
    /// The presentation's logical position at a system time (from reports), and its
    /// rate: `(mono, logical, rate, running)`.
    anchor: Option<(u64, i64, f64, bool)>,
    status_every: Duration,
}

impl Runner {
    /// A runner for `p` with `lead`.
    pub fn new(p: PresentationId, lead: Lead) -> Runner {
        Runner { p, lead, anchor: None, status_every: Duration::from_millis(100) }
    }

    fn position(&self, mono: u64) -> Option<i64> {
        let (t, l, rate, running) = self.anchor?;
        if !running {
            return Some(l);
        }
        Some(l + ((mono as i64 - t as i64) as f64 * rate) as i64)
    }

    fn take(&mut self, r: &Report, stats: &mut RunStats, last: &mut Instant) {
        match r {
            Report::Status(st) => {
                if let Some(ps) = st.presentations.iter().find(|x| x.id == self.p.0) {
                    self.anchor = Some((st.now, ps.position, ps.rate, ps.motion == 1));
                }
                let trouble = Lead::trouble(st);
                stats.trouble = trouble;
                let now = Instant::now();
                self.lead.update(trouble, now - *last);
                *last = now;
            }
            // Until the first status report: the start instant and position.
            Report::Changed(c) if c.presentation == self.p.0 && self.anchor.is_none() => {
                self.anchor = Some((c.at, c.logical, 1.0, true));
            }
            _ => {}
        }
    }

    /// Start the presentation at logical `from` and run until every object is done or
    /// logical time `until` has been emitted, then wait for the presentation to reach
    /// it. Items are sent ahead by the lead.
    pub fn run(&mut self, t: &mut Tactus, s: &mut Scheduler, from: i64, until: i64) -> Result<RunStats, TactusError> {
        let mut stats = RunStats { lead: self.lead.current, max_lead: self.lead.current, ..RunStats::default() };
        let mut out = Vec::new();
        // Prime the first lead's worth before starting, so nothing starts late.
        stats.runs += s.run_until(from + self.lead.current.as_nanos() as i64, &mut out) as u64;
        for o in out.drain(..) {
            t.send(o.stream, o.logical, o.duration, &o.payload)?;
            stats.sent += 1;
        }
        t.start(self.p, from, None)?;
        let mut last = Instant::now();
        let mut next_status = Instant::now();
        loop {
            if Instant::now() >= next_status {
                t.request_status()?;
                next_status = Instant::now() + self.status_every;
            }
            for r in t.drain_reports()? {
                self.take(&r, &mut stats, &mut last);
            }
            let now = monotonic_ns();
            let Some(pos) = self.position(now) else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let horizon = (pos + self.lead.current.as_nanos() as i64).min(until);
            stats.runs += s.run_until(horizon, &mut out) as u64;
            for o in out.drain(..) {
                if o.logical <= until {
                    t.send(o.stream, o.logical, o.duration, &o.payload)?;
                    stats.sent += 1;
                }
            }
            stats.lead = self.lead.current;
            stats.max_lead = stats.max_lead.max(self.lead.current);
            let finished = s.done() || s.next_time().is_some_and(|n| n > until);
            if finished && pos >= until {
                return Ok(stats);
            }
            // Sleep until the next object is within the lead, or the next status.
            let wait = match s.next_time() {
                Some(n) if !finished => {
                    let ahead = n - self.lead.current.as_nanos() as i64 - pos;
                    Duration::from_nanos(ahead.max(0) as u64)
                }
                _ => Duration::from_nanos((until - pos).max(0) as u64),
            };
            let wait = wait.min(next_status.saturating_duration_since(Instant::now())).max(Duration::from_micros(200));
            if let Some(r) = t.next_report(wait)? {
                self.take(&r, &mut stats, &mut last);
            }
        }
    }
}

/// The demo objects of the toolkit's example (`examples/midi_animation.rs`): a ball
/// that bounces on every beat and a melody that plays a note on every beat, so that
/// what is seen and heard must stay together.
pub mod demo {
    use super::*;

    /// A ball bouncing across a `w × h` window, hitting the floor on every beat.
    #[derive(Debug)]
    pub struct Ball {
        /// The video stream.
        pub stream: StreamId,
        /// Width.
        pub w: u16,
        /// Height.
        pub h: u16,
        /// Frame period.
        pub frame: Duration,
        /// Beat period.
        pub beat: Duration,
    }

    impl Ball {
        /// The frame at logical time `t`: the ball's height follows `|sin|` of the
        /// beat phase, so it touches the floor exactly on each beat.
        pub fn draw(&self, t: i64, out: &mut Vec<u8>) {
            let (w, h) = (usize::from(self.w), usize::from(self.h));
            out.clear();
            out.resize(w * h * 4, 0);
            let phase = (t as f64 / self.beat.as_nanos() as f64).fract();
            let r = (h / 10).max(2);
            let height = (phase * std::f64::consts::PI).sin() * (h - 2 * r) as f64;
            let cy = h - r - 1 - height as usize;
            let cx = ((t as f64 / 1e9 * 40.0) as usize) % w;
            for y in cy.saturating_sub(r)..(cy + r).min(h) {
                for x in cx.saturating_sub(r)..(cx + r).min(w) {
                    let (dx, dy) = (x as i64 - cx as i64, y as i64 - cy as i64);
                    if dx * dx + dy * dy <= (r * r) as i64 {
                        out[(y * w + x) * 4..(y * w + x) * 4 + 4].copy_from_slice(&0x00ff_c020u32.to_le_bytes());
                    }
                }
            }
            // The floor flashes on the beat.
            let floor = if phase < 0.1 { 0x00ff_ffffu32 } else { 0x0040_4040 };
            for x in 0..w {
                out[((h - 1) * w + x) * 4..((h - 1) * w + x) * 4 + 4].copy_from_slice(&floor.to_le_bytes());
            }
        }
    }

    impl Active for Ball {
        fn run(&mut self, cx: &mut Cx<'_>) {
            let mut px = Vec::new();
            self.draw(cx.now(), &mut px);
            cx.emit(self.stream, self.frame.as_nanos() as u64, px);
            cx.after(self.frame);
        }
    }

    /// A note on every beat (note on, then off half a beat later), cycling a scale.
    #[derive(Debug)]
    pub struct Melody {
        /// The MIDI stream.
        pub stream: StreamId,
        /// Beat period.
        pub beat: Duration,
        /// Notes played so far.
        pub played: u32,
    }

    impl Active for Melody {
        fn run(&mut self, cx: &mut Cx<'_>) {
            const SCALE: [u8; 8] = [60, 62, 64, 65, 67, 69, 71, 72];
            let key = SCALE[self.played as usize % SCALE.len()];
            self.played += 1;
            cx.emit(self.stream, 0, vec![0x90, key, 100]);
            let off = cx.now() + (self.beat.as_nanos() / 2) as i64;
            cx.emit_at(self.stream, off, 0, vec![0x80, key, 0]);
            cx.after(self.beat);
        }
    }
}

/// Per-stream output counts, for tests and examples.
pub fn count_by_stream(out: &[Output]) -> HashMap<StreamId, usize> {
    let mut m = HashMap::new();
    for o in out {
        *m.entry(o.stream).or_default() += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::demo::{Ball, Melody};
    use super::*;

    const MS: i64 = 1_000_000;

    struct Ticker {
        s: StreamId,
        period: i64,
        left: u32,
    }
    impl Active for Ticker {
        fn run(&mut self, cx: &mut Cx<'_>) {
            cx.emit(self.s, 0, vec![self.left as u8]);
            self.left -= 1;
            if self.left > 0 {
                cx.at(cx.now() + self.period);
            }
        }
    }

    #[test]
    fn objects_run_in_time_order_up_to_the_horizon_and_stamp_their_output() {
        let mut s = Scheduler::new();
        s.add(Ticker { s: StreamId(1), period: 30 * MS, left: 4 }, 0);
        s.add(Ticker { s: StreamId(2), period: 20 * MS, left: 5 }, 10 * MS);
        let mut out = Vec::new();
        assert_eq!(s.run_until(50 * MS, &mut out), 2 + 3);
        let times: Vec<(u32, i64)> = out.iter().map(|o| (o.stream.0, o.logical / MS)).collect();
        assert_eq!(times, vec![(1, 0), (2, 10), (1, 30), (2, 30), (2, 50)]);
        out.clear();
        s.run_until(i64::MAX, &mut out);
        assert!(s.done());
        assert_eq!(s.runs(), 9);
        assert_eq!(count_by_stream(&out)[&StreamId(2)], 2);
    }

    #[test]
    fn same_time_runs_keep_the_order_asked() {
        let mut a = Agenda::default();
        a.ask(5, 2);
        a.ask(5, 1);
        a.ask(3, 9);
        assert_eq!(a.pop_until(10), Some((3, 9)));
        assert_eq!(a.pop_until(10), Some((5, 2)));
        assert_eq!(a.pop_until(4), None);
        assert_eq!(a.pop_until(5), Some((5, 1)));
        assert!(a.is_empty());
    }

    #[test]
    fn the_lead_grows_on_trouble_and_shrinks_when_all_is_well() {
        let mut l = Lead::new(Duration::from_millis(100), Duration::from_millis(20), Duration::from_secs(2));
        // Ten clean seconds: it shrinks, but not below the minimum.
        for _ in 0..100 {
            l.update(0, Duration::from_millis(100));
        }
        assert!(l.current < Duration::from_millis(90));
        let before = l.current;
        // New trouble: it grows at once.
        l.update(3, Duration::from_millis(100));
        assert!(l.current > before);
        // The same count again is not new trouble.
        let grown = l.current;
        l.update(3, Duration::from_millis(100));
        assert!(l.current < grown);
        // Bounded.
        for k in 4..100 {
            l.update(k, Duration::from_millis(1));
        }
        assert_eq!(l.current, Duration::from_secs(2));
        let mut m = Lead::new(Duration::from_millis(1), Duration::from_millis(20), Duration::from_secs(2));
        assert_eq!(m.update(0, Duration::from_secs(100)), Duration::from_millis(20));
    }

    #[test]
    fn on_a_virtual_clock_the_demo_keeps_picture_and_sound_on_the_beat() {
        let beat = Duration::from_millis(500);
        let frame = Duration::from_millis(100);
        let (v, m) = (StreamId(1), StreamId(2));
        let mut s = Scheduler::new();
        s.add(Ball { stream: v, w: 80, h: 60, frame, beat }, 0);
        s.add(Melody { stream: m, beat, played: 0 }, 0);
        // A virtual presentation advancing 10 ms per step, objects run 150 ms ahead.
        let lead = 150 * MS;
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < 2_000 * MS {
            s.run_until(pos + lead, &mut out);
            // Nothing is ever emitted for a time already past.
            assert!(out.iter().all(|o| o.logical >= pos));
            for o in out.drain(..) {
                if o.stream == m && o.payload[0] == 0x90 {
                    // Every note-on is on a beat, and a frame is due at that instant.
                    assert_eq!(o.logical % beat.as_nanos() as i64, 0);
                    assert_eq!(o.logical % frame.as_nanos() as i64, 0);
                }
            }
            pos += 10 * MS;
        }
        // The frame on a beat shows the ball on the floor with the floor lit.
        let ball = Ball { stream: v, w: 80, h: 60, frame, beat };
        let mut px = Vec::new();
        ball.draw(1_000 * MS, &mut px);
        let floor = u32::from_le_bytes(px[(59 * 80) * 4..(59 * 80) * 4 + 4].try_into().unwrap());
        assert_eq!(floor, 0x00ff_ffff);
    }
}
