//! The MIDI output library (`ictus_midi::output`) for C: a timed queue and an immediate
//! queue sent from two threads, late and out-of-order messages straight out (000 §4).

use std::ffi::c_char;

use ictus_midi::device::DeviceSpec;
use ictus_midi::output::{Close, Output, OutputOptions, PutError};
use ictus_midi::Message;
use ictus_rt::Time;

use crate::error::{guard, guard_value, ictus_error, Error, *};
use crate::{bytes, handle, out, string};

/// An open MIDI output (owning handle): close it with `ictus_midi_output_close`.
#[derive(Debug)]
pub struct ictus_midi_output {
    output: Output,
}

/// Flags of `ictus_midi_output_open`.
pub type ictus_midi_flags = u32;
/// Ask for no real-time priority (by default the output's threads ask for
/// `SCHED_FIFO` 70 and run anyway, saying so once, where it is refused).
pub const ICTUS_MIDI_TIMESHARING: ictus_midi_flags = 1;
/// A timer thread on every CPU this thread may run on (for virtual machines whose host
/// stops one CPU now and then).
pub const ICTUS_MIDI_TIMER_PER_CPU: ictus_midi_flags = 2;

/// How to close an output.
pub type ictus_midi_close = u32;
/// Send everything queued, each message at its time, then close.
pub const ICTUS_MIDI_DRAIN: ictus_midi_close = 0;
/// Send nothing more, then close.
pub const ICTUS_MIDI_DISCARD: ictus_midi_close = 1;

/// Counts of an output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ictus_midi_stats {
    /// Messages accepted.
    pub put: u64,
    /// Of those, queued to go out at their time.
    pub timed: u64,
    /// Sent at once because their time had passed.
    pub late: u64,
    /// Sent at once because they were earlier than the last timed message.
    pub out_of_order: u64,
    /// Messages written completely.
    pub sent: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Messages dropped by a discarding close.
    pub discarded: u64,
    /// Messages dropped because the device failed.
    pub write_errors: u64,
}

fn stats(s: &ictus_midi::output::OutputStats) -> ictus_midi_stats {
    ictus_midi_stats {
        put: s.put,
        timed: s.timed,
        late: s.late,
        out_of_order: s.out_of_order,
        sent: s.sent,
        bytes: s.bytes,
        discarded: s.discarded,
        write_errors: s.write_errors,
    }
}

/// The time MIDI messages are stamped with: nanoseconds of `CLOCK_MONOTONIC`.
#[no_mangle]
pub extern "C" fn ictus_midi_now_ns() -> u64 {
    guard_value(0, || ictus_rt::clock::now().as_nanos())
}

/// Open the output device `device`: `cable:NAME` (the virtual cable, always there),
/// `/dev/snd/midiCxDy` (ALSA raw MIDI), `serial:/dev/ttyX[,BAUD]`.
#[no_mangle]
pub unsafe extern "C" fn ictus_midi_output_open(
    device: *const c_char,
    flags: ictus_midi_flags,
    output: *mut *mut ictus_midi_output,
) -> ictus_error {
    guard(|| {
        let spec = string(device, "device")?;
        let slot = out(output, "output")?;
        if flags & !(ICTUS_MIDI_TIMESHARING | ICTUS_MIDI_TIMER_PER_CPU) != 0 {
            return Err(Error::invalid(format!("unknown MIDI flags {flags:#x}")));
        }
        let dev = DeviceSpec::parse(spec)
            .map_err(Error::invalid)?
            .open_output()
            .map_err(|e| Error::new(ICTUS_ERR_UNAVAILABLE, e))?;
        let mut options =
            if flags & ICTUS_MIDI_TIMESHARING != 0 { OutputOptions::timesharing() } else { OutputOptions::default() };
        if flags & ICTUS_MIDI_TIMER_PER_CPU != 0 {
            options = options.with_timer_per_cpu();
        }
        let o = Output::open(dev, options).map_err(|e| Error::new(ICTUS_ERR_OS, e))?;
        *slot = Box::into_raw(Box::new(ictus_midi_output { output: o }));
        Ok(())
    })
}

/// Queue one MIDI message (its status byte first: a complete channel, system common,
/// real-time or system-exclusive message, checked here) to go out at `time_ns`
/// (`ictus_midi_now_ns` time). A time that has passed, or one earlier than the last
/// timed message, goes out at once, as the paper's library did.
#[no_mangle]
pub unsafe extern "C" fn ictus_midi_output_put(
    output: *const ictus_midi_output,
    message: *const u8,
    len: usize,
    time_ns: u64,
) -> ictus_error {
    guard(|| {
        let o = handle(output, "output")?;
        let at = Time::from_nanos(time_ns);
        let m = Message::from_bytes(bytes(message, len, "message")?, at).map_err(Error::invalid)?;
        o.output.put(m, at).map(|_| ()).map_err(|e| match e {
            PutError::Closed => Error::new(ICTUS_ERR_CLOSED, e),
            PutError::Full(_) => Error::new(ICTUS_ERR_FULL, e),
        })
    })
}

/// The output's counts so far.
#[no_mangle]
pub unsafe extern "C" fn ictus_midi_output_stats(
    output: *const ictus_midi_output,
    out_stats: *mut ictus_midi_stats,
) -> ictus_error {
    guard(|| {
        let o = handle(output, "output")?;
        *out(out_stats, "stats")? = stats(&o.output.stats());
        Ok(())
    })
}

/// Close the output (`ICTUS_MIDI_DRAIN`: after everything queued has gone out at its
/// time; `ICTUS_MIDI_DISCARD`: at once) and release it; its threads are joined. The
/// final counts go to `final_stats` unless it is NULL. NULL `output` does nothing.
#[no_mangle]
pub unsafe extern "C" fn ictus_midi_output_close(
    output: *mut ictus_midi_output,
    how: ictus_midi_close,
    final_stats: *mut ictus_midi_stats,
) -> ictus_error {
    guard(|| {
        if output.is_null() {
            return Ok(());
        }
        let how = match how {
            ICTUS_MIDI_DRAIN => Close::Drain,
            ICTUS_MIDI_DISCARD => Close::Discard,
            other => return Err(Error::invalid(format!("{other} is not an ictus_midi_close"))),
        };
        // SAFETY: C promises `output` came from `ictus_midi_output_open` and is closed
        // once (the header's contract); it is not used again.
        let o = unsafe { Box::from_raw(output) };
        let closed = o.output.close(how);
        if !final_stats.is_null() {
            *out(final_stats, "final_stats")? = stats(&closed.stats);
        }
        Ok(())
    })
}
