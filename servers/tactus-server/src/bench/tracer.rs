//! GStreamer's own view of when its sinks presented each buffer: a tracer (GStreamer's
//! instrumentation interface, `GstTracer`, through gstreamer-rs) hooked on
//! `pad-push-pre` and `pad-push-post`. A sink renders inside the push that hands it a
//! buffer (after waiting on the pipeline clock for the buffer's time), so the push's
//! return is the moment the sink finished presenting it: for `ximagesink`, after
//! `XPutImage` and `XSync`, the same moment our display server reports (the X server
//! has the frame). The buffer's due time is GStreamer's too: the element's base time
//! plus the buffer's running time in its segment, on the pipeline's clock.

use std::sync::{Mutex, OnceLock};

use gstreamer as gst;
use gstreamer::glib;
use gstreamer::prelude::*;
use gstreamer::subclass::prelude::*;

/// One buffer presented by a watched sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Presented {
    /// Which sink (its index in the watch list).
    pub sink: usize,
    /// The buffer's stream time (its PTS), ns.
    pub pts: u64,
    /// Its due time on the pipeline clock, ns.
    pub due: u64,
    /// When the push returned, on the pipeline clock, ns.
    pub done: u64,
}

#[derive(Default)]
struct State {
    /// Sinks watched, by element name.
    sinks: Vec<String>,
    /// The clock and base time of the pipeline.
    clock: Option<(gst::Clock, u64)>,
    /// Per pushing pad (its address), the buffer in flight: (sink, pts, due).
    flight: Vec<(usize, usize, u64, u64)>,
    out: Vec<Presented>,
}

fn state() -> &'static Mutex<State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(Mutex::default)
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    state().lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

mod imp {
    use super::*;

    #[derive(Debug, Default)]
    pub struct PresentTracer;

    #[glib::object_subclass]
    impl ObjectSubclass for PresentTracer {
        const NAME: &'static str = "IctusPresentTracer";
        type Type = super::PresentTracer;
        type ParentType = gst::Tracer;
    }

    impl ObjectImpl for PresentTracer {
        fn constructed(&self) {
            self.parent_constructed();
            self.register_hook(TracerHook::PadPushPre);
            self.register_hook(TracerHook::PadPushPost);
        }
    }

    impl GstObjectImpl for PresentTracer {}

    impl TracerImpl for PresentTracer {
        fn pad_push_pre(&self, _ts: u64, pad: &gst::Pad, buffer: &gst::Buffer) {
            let Some(peer) = pad.peer() else { return };
            let Some(parent) = peer.parent_element() else { return };
            let name = parent.name();
            let mut st = lock();
            let Some(sink) = st.sinks.iter().position(|s| s.as_str() == name.as_str()) else { return };
            let Some((_, base)) = st.clock.clone() else { return };
            let Some(pts) = buffer.pts() else { return };
            let Some(seg) = peer.sticky_event::<gst::event::Segment>(0) else { return };
            let Ok(seg) = seg.segment().clone().downcast::<gst::ClockTime>() else { return };
            let Some(rt) = seg.to_running_time(pts) else { return };
            let key = pad.as_ptr() as usize;
            st.flight.retain(|f| f.0 != key);
            st.flight.push((key, sink, pts.nseconds(), base + rt.nseconds()));
        }

        fn pad_push_post(&self, _ts: u64, pad: &gst::Pad, result: Result<gst::FlowSuccess, gst::FlowError>) {
            let key = pad.as_ptr() as usize;
            let mut st = lock();
            let Some(i) = st.flight.iter().position(|f| f.0 == key) else { return };
            let (_, sink, pts, due) = st.flight.swap_remove(i);
            if result.is_err() {
                return;
            }
            let Some((clock, _)) = st.clock.clone() else { return };
            let done = clock.time().map_or(0, |t| t.nseconds());
            st.out.push(Presented { sink, pts, due, done });
        }
    }
}

glib::wrapper! {
    /// The tracer (one per process; it watches what [`watch`] names).
    pub struct PresentTracer(ObjectSubclass<imp::PresentTracer>) @extends gst::Tracer, gst::Object;
}

/// Install the tracer (once per process).
pub fn install() {
    static T: OnceLock<PresentTracer> = OnceLock::new();
    T.get_or_init(glib::Object::new::<PresentTracer>);
}

/// Watch the sinks named `sinks` of a pipeline whose clock is `clock` and base time
/// `base` (ns), forgetting what was recorded before.
pub fn watch(sinks: &[&str], clock: gst::Clock, base: u64) {
    let mut st = lock();
    st.sinks = sinks.iter().map(|s| (*s).to_owned()).collect();
    st.clock = Some((clock, base));
    st.flight.clear();
    st.out.clear();
}

/// Stop watching; what was recorded.
pub fn take() -> Vec<Presented> {
    let mut st = lock();
    st.sinks.clear();
    st.clock = None;
    std::mem::take(&mut st.out)
}
