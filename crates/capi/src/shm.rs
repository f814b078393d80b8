//! Shared-memory channels (`ictus-shm`) for C: a client and a server, records copied in
//! and out at the boundary, each end's pollable descriptor for the caller's event loop.

use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use ictus_ipc::Name;
use ictus_shm::{
    Client, ClientId, ClientOptions, ConnectError, Event, Geometry, Next, RecvError, ReplyError, SendError, Server,
    ServerConfig, SleepMode, WaitConfig,
};

use crate::error::{guard, guard_value, ictus_error, Error, *};
use crate::ports::{ictus_name, ictus_space, ICTUS_NAME_NULL};
use crate::{buffer, bytes, handle, handle_mut, out, timeout};

/// The client end of a channel (owning handle).
#[derive(Debug)]
pub struct ictus_shm_client {
    client: Client,
}

/// The server end of channels (owning handle): a service port clients connect to.
#[derive(Debug)]
pub struct ictus_shm_server {
    server: Server,
}

/// What a client asks for. Zeroes take the defaults (64 KiB rings, no pool, 20 µs of
/// spinning before blocking, 10 s to connect).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ictus_shm_options {
    /// Bytes of the request ring (a power of two).
    pub request_ring: u64,
    /// Bytes of the reply ring (a power of two).
    pub reply_ring: u64,
    /// Buffers in the pool (0: none).
    pub pool_slots: u32,
    /// Bytes of each pool buffer.
    pub pool_slot_size: u32,
    /// How long to spin before blocking, in nanoseconds (negative: never spin).
    pub spin_ns: i64,
    /// How long connecting may take, in nanoseconds (0: the default).
    pub timeout_ns: i64,
}

/// What `ictus_shm_server_next` found.
pub type ictus_shm_kind = u32;
/// Nothing to handle now.
pub const ICTUS_SHM_NONE: ictus_shm_kind = 0;
/// A client opened a channel.
pub const ICTUS_SHM_OPENED: ictus_shm_kind = 1;
/// A channel closed (its client closed it, died, or was cut off).
pub const ICTUS_SHM_CLOSED: ictus_shm_kind = 2;
/// A record from a client.
pub const ICTUS_SHM_RECORD: ictus_shm_kind = 3;

/// One thing a server handles.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ictus_shm_event {
    /// `ICTUS_SHM_NONE`, `_OPENED`, `_CLOSED` or `_RECORD`.
    pub kind: ictus_shm_kind,
    /// The client's id (never reused by a server).
    pub client: u64,
    /// The record's tag.
    pub tag: u32,
    /// The record's length (copied into the caller's buffer).
    pub len: usize,
    /// For `ICTUS_SHM_OPENED`: the client's pid and uid as the kernel verified them.
    pub pid: u32,
    /// See `pid`.
    pub uid: u32,
}

fn send_error(e: SendError) -> Error {
    let code = match &e {
        SendError::Full => ICTUS_ERR_FULL,
        SendError::TooLarge { .. } => ICTUS_ERR_TOO_LARGE,
        SendError::NoPool => ICTUS_ERR_INVALID_ARGUMENT,
        SendError::TimedOut => ICTUS_ERR_TIMED_OUT,
        SendError::Closed(_) => ICTUS_ERR_CLOSED,
    };
    Error::new(code, e)
}

fn recv_error(e: RecvError) -> Error {
    let code = match &e {
        RecvError::TimedOut => ICTUS_ERR_TIMED_OUT,
        RecvError::Closed(_) => ICTUS_ERR_CLOSED,
    };
    Error::new(code, e)
}

fn reply_error(e: ReplyError) -> Error {
    let code = match &e {
        ReplyError::Full => ICTUS_ERR_FULL,
        ReplyError::TooLarge { .. } => ICTUS_ERR_TOO_LARGE,
        ReplyError::NoClient => ICTUS_ERR_CLOSED,
    };
    Error::new(code, e)
}

/// Ask the server behind `service` (a send right of `space`) for a channel. `options`
/// may be NULL for the defaults.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_client_connect(
    space: *const ictus_space,
    service: ictus_name,
    options: *const ictus_shm_options,
    client: *mut *mut ictus_shm_client,
) -> ictus_error {
    guard(|| {
        let s = handle(space, "space")?;
        let slot = out(client, "client")?;
        let o = if options.is_null() { ictus_shm_options::default() } else { *handle(options, "options")? };
        let mut opts = ClientOptions::default();
        if o.request_ring != 0 || o.reply_ring != 0 || o.pool_slots != 0 {
            let d = opts.geometry;
            let or = |v: u64, d: u64| if v == 0 { d } else { v };
            opts.geometry = Geometry::new(
                or(o.request_ring, d.request.cap),
                or(o.reply_ring, d.reply.cap),
                o.pool_slots,
                o.pool_slot_size,
            )
            .map_err(Error::invalid)?;
        }
        if o.spin_ns != 0 {
            opts.wait.spin = timeout(o.spin_ns).unwrap_or(Duration::ZERO);
        }
        if o.timeout_ns > 0 {
            opts.timeout = Duration::from_nanos(o.timeout_ns as u64);
        }
        let c = Client::connect(&s.space, Name(service), opts).map_err(|e| match e {
            ConnectError::Refused(why) => {
                Error::new(ICTUS_ERR_DENIED, format!("the server refused the channel: {why}"))
            }
            other => Error::new(ICTUS_ERR_UNAVAILABLE, other),
        })?;
        *slot = Box::into_raw(Box::new(ictus_shm_client { client: c }));
        Ok(())
    })
}

/// Close the channel (NULL is allowed); the server sees it closed.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_client_free(client: *mut ictus_shm_client) {
    guard_value((), || crate::free(client))
}

/// Send a copy of `len` bytes as one record tagged `tag`, waiting at most `timeout_ns`
/// while the request ring is full.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_client_send(
    client: *mut ictus_shm_client,
    tag: u32,
    data: *const u8,
    len: usize,
    timeout_ns: i64,
) -> ictus_error {
    guard(|| {
        let c = handle_mut(client, "client")?;
        let data = bytes(data, len, "data")?;
        c.client.send_wait(tag, data, timeout(timeout_ns)).map_err(send_error)
    })
}

/// Receive the next reply, waiting at most `timeout_ns`: its tag into `*tag`, its bytes
/// into `buf` (`cap` bytes), its length into `*len`. If `buf` is too small
/// (`ICTUS_ERR_BUFFER_TOO_SMALL`), `*len` gets the length needed and the reply stays
/// for the next call.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_client_recv(
    client: *mut ictus_shm_client,
    timeout_ns: i64,
    tag: *mut u32,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> ictus_error {
    guard(|| {
        let c = handle_mut(client, "client")?;
        let (tag, len) = (out(tag, "tag")?, out(len, "len")?);
        let buf = buffer(buf, cap, "buf")?;
        let reply = c.client.recv(timeout(timeout_ns)).map_err(recv_error)?;
        let payload = reply.payload();
        *len = payload.len();
        if payload.len() > buf.len() {
            let needed = payload.len();
            // Not consumed: the next receive returns it again.
            std::mem::forget(reply);
            return Err(Error::new(ICTUS_ERR_BUFFER_TOO_SMALL, format!("the reply has {needed} bytes")));
        }
        payload.copy_to(buf);
        *tag = reply.tag();
        Ok(())
    })
}

/// The client's pollable descriptor (borrowed: do not close it): readable when a reply
/// may be waiting after `ictus_shm_client_arm`, or the server is gone. -1 for NULL.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_client_fd(client: *const ictus_shm_client) -> c_int {
    guard_value(-1, || handle(client, "client").map_or(-1, |c| c.client.as_fd().as_raw_fd()))
}

/// Before waiting on the descriptor: announce the wait. 0 if a reply is already there
/// (do not wait: receive), 1 if the caller may wait, -1 for NULL.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_client_arm(client: *mut ictus_shm_client) -> c_int {
    guard_value(-1, || handle_mut(client, "client").map_or(-1, |c| c_int::from(c.client.arm())))
}

// ----- the server ---------------------------------------------------------------------

/// A channel server with a new service port in `space`: give clients send rights to it
/// (`ictus_shm_server_service`; register it with the name server). It sleeps in epoll,
/// so its descriptor can join the caller's event loop.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_server_new(
    space: *const ictus_space,
    server: *mut *mut ictus_shm_server,
) -> ictus_error {
    guard(|| {
        let s = handle(space, "space")?;
        let slot = out(server, "server")?;
        let config = ServerConfig { sleep: SleepMode::Poll, wait: WaitConfig::default(), ..ServerConfig::default() };
        let srv = Server::new(&s.space, config).map_err(|e| Error::new(ICTUS_ERR_OS, e))?;
        *slot = Box::into_raw(Box::new(ictus_shm_server { server: srv }));
        Ok(())
    })
}

/// Close every channel and the service port (NULL is allowed).
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_server_free(server: *mut ictus_shm_server) {
    guard_value((), || crate::free(server))
}

/// The service port (a receive right of the server's space).
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_server_service(server: *const ictus_shm_server) -> ictus_name {
    guard_value(ICTUS_NAME_NULL, || handle(server, "server").map_or(ICTUS_NAME_NULL, |s| s.server.service().0))
}

/// Wait at most `timeout_ns` until there is something to handle; `*ready` gets 1 if
/// there is, 0 if the time ran out.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_server_wait(
    server: *mut ictus_shm_server,
    timeout_ns: i64,
    ready: *mut c_int,
) -> ictus_error {
    guard(|| {
        let s = handle_mut(server, "server")?;
        let ready = out(ready, "ready")?;
        *ready = c_int::from(s.server.wait(timeout(timeout_ns)).map_err(|e| Error::new(ICTUS_ERR_OS, e))?);
        Ok(())
    })
}

/// The next thing to handle, without waiting, into `*event`: a channel opened or
/// closed, or a record whose bytes are copied into `buf` (`cap` bytes) and consumed
/// (`event->kind` is `ICTUS_SHM_NONE` when there is nothing). If `buf` is too small for
/// a record (`ICTUS_ERR_BUFFER_TOO_SMALL`), `event->len` says how much is needed and the
/// record stays for the next call.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_server_next(
    server: *mut ictus_shm_server,
    event: *mut ictus_shm_event,
    buf: *mut u8,
    cap: usize,
) -> ictus_error {
    guard(|| {
        let s = handle_mut(server, "server")?;
        let ev = out(event, "event")?;
        let buf = buffer(buf, cap, "buf")?;
        *ev = ictus_shm_event::default();
        match s.server.try_next() {
            None => Ok(()),
            Some(Next::Event(Event::Opened { client, credentials, .. })) => {
                *ev = ictus_shm_event {
                    kind: ICTUS_SHM_OPENED,
                    client: client.0,
                    pid: credentials.pid,
                    uid: credentials.uid,
                    ..ictus_shm_event::default()
                };
                Ok(())
            }
            Some(Next::Event(Event::Closed { client, .. })) => {
                *ev = ictus_shm_event { kind: ICTUS_SHM_CLOSED, client: client.0, ..ictus_shm_event::default() };
                Ok(())
            }
            Some(Next::Record(r)) => {
                let payload = r.payload();
                *ev = ictus_shm_event {
                    kind: ICTUS_SHM_RECORD,
                    client: r.client().0,
                    tag: r.tag(),
                    len: payload.len(),
                    ..ictus_shm_event::default()
                };
                if payload.len() > buf.len() {
                    let needed = payload.len();
                    r.retry_later();
                    return Err(Error::new(ICTUS_ERR_BUFFER_TOO_SMALL, format!("the record has {needed} bytes")));
                }
                payload.copy_to(buf);
                Ok(())
            }
        }
    })
}

/// Send a copy of `len` bytes to `client`'s reply ring, tagged `tag` (an answer, or an
/// event it did not ask for). `ICTUS_ERR_FULL` if the client is not reading.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_server_send(
    server: *mut ictus_shm_server,
    client: u64,
    tag: u32,
    data: *const u8,
    len: usize,
) -> ictus_error {
    guard(|| {
        let s = handle_mut(server, "server")?;
        let data = bytes(data, len, "data")?;
        s.server.send_to(ClientId(client), tag, data).map_err(reply_error)
    })
}

/// The server's pollable descriptor (borrowed: do not close it): readable when a
/// channel request, a hang-up or (after `ictus_shm_server_arm`) a record may be waiting.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_server_fd(server: *const ictus_shm_server) -> c_int {
    guard_value(-1, || handle(server, "server").map_or(-1, |s| s.server.as_fd().as_raw_fd()))
}

/// Before waiting on the descriptor: 0 if there is already something to handle, 1 if
/// the caller may wait, -1 for NULL.
#[no_mangle]
pub unsafe extern "C" fn ictus_shm_server_arm(server: *mut ictus_shm_server) -> c_int {
    guard_value(-1, || handle_mut(server, "server").map_or(-1, |s| c_int::from(s.server.arm())))
}
