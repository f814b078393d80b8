//! Spaces, ports and rights, messages: the nucleus (`ictus-ipc`) for C.

use std::ffi::c_int;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

use ictus_ipc::{
    CallError, Credentials, Disposition, Message, Name, OolBuffer, PortArg, ReceiveError, ReceiveOptions, Received,
    RightKind, RightsError, SendError, SendOptions, Space,
};

use crate::error::{guard, guard_value, ictus_error, Error, Result, *};
use crate::{bytes, handle, handle_mut, out, timeout};

/// A port name: an index into a task's space, meaningful only there. `ICTUS_NAME_NULL`
/// is no port.
pub type ictus_name = u32;

/// No port.
pub const ICTUS_NAME_NULL: ictus_name = 0;

/// How a message takes a right from the sender's space (Mach's dispositions).
pub type ictus_disposition = u32;
/// Move the receive right: the sender loses it; queued messages go with it.
pub const ICTUS_MOVE_RECEIVE: ictus_disposition = 1;
/// Move one user reference of a send right.
pub const ICTUS_MOVE_SEND: ictus_disposition = 2;
/// Copy a send right; the sender keeps its references.
pub const ICTUS_COPY_SEND: ictus_disposition = 3;
/// Make a new send right from a receive right.
pub const ICTUS_MAKE_SEND: ictus_disposition = 4;
/// Make a new send-once right from a receive right.
pub const ICTUS_MAKE_SEND_ONCE: ictus_disposition = 5;
/// Move a send-once right.
pub const ICTUS_MOVE_SEND_ONCE: ictus_disposition = 6;

/// The kind of a right a name denotes or a message delivered.
pub type ictus_right_kind = u32;
/// A send right.
pub const ICTUS_RIGHT_SEND: ictus_right_kind = 1;
/// A send-once right.
pub const ICTUS_RIGHT_SEND_ONCE: ictus_right_kind = 2;
/// A receive right.
pub const ICTUS_RIGHT_RECEIVE: ictus_right_kind = 3;
/// A dead name.
pub const ICTUS_RIGHT_DEAD_NAME: ictus_right_kind = 4;
/// A port set.
pub const ICTUS_RIGHT_PORT_SET: ictus_right_kind = 5;

/// Who sent a message, as the kernel verified it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ictus_credentials {
    /// Process id.
    pub pid: u32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// A task's name space (owning handle). Threads may share one.
#[derive(Debug)]
pub struct ictus_space {
    pub(crate) space: Space,
}

/// An outgoing message (owning handle): an id, in-line data, rights, out-of-line
/// regions and a reply right.
#[derive(Debug)]
pub struct ictus_message {
    msg: Message,
}

/// A received message (owning handle), reused by every receive into it.
#[derive(Debug)]
pub struct ictus_received {
    pub(crate) r: Received,
}

pub(crate) fn disposition(d: ictus_disposition) -> Result<Disposition> {
    Ok(match d {
        ICTUS_MOVE_RECEIVE => Disposition::MoveReceive,
        ICTUS_MOVE_SEND => Disposition::MoveSend,
        ICTUS_COPY_SEND => Disposition::CopySend,
        ICTUS_MAKE_SEND => Disposition::MakeSend,
        ICTUS_MAKE_SEND_ONCE => Disposition::MakeSendOnce,
        ICTUS_MOVE_SEND_ONCE => Disposition::MoveSendOnce,
        other => return Err(Error::invalid(format!("{other} is not an ictus_disposition"))),
    })
}

fn kind(k: RightKind) -> ictus_right_kind {
    match k {
        RightKind::Send => ICTUS_RIGHT_SEND,
        RightKind::SendOnce => ICTUS_RIGHT_SEND_ONCE,
        RightKind::Receive => ICTUS_RIGHT_RECEIVE,
        RightKind::DeadName => ICTUS_RIGHT_DEAD_NAME,
        RightKind::PortSet => ICTUS_RIGHT_PORT_SET,
    }
}

fn creds(c: Credentials) -> ictus_credentials {
    ictus_credentials { pid: c.pid, uid: c.uid, gid: c.gid }
}

pub(crate) fn rights(e: RightsError) -> Error {
    let code = match &e {
        RightsError::InvalidName(_) => ICTUS_ERR_INVALID_NAME,
        RightsError::InvalidRight(_) => ICTUS_ERR_INVALID_RIGHT,
        RightsError::InvalidValue => ICTUS_ERR_INVALID_ARGUMENT,
        RightsError::UrefsOverflow(_) | RightsError::NoSpace => ICTUS_ERR_NO_SPACE,
        RightsError::NameExists(_) => ICTUS_ERR_EXISTS,
        RightsError::Os(_) => ICTUS_ERR_OS,
    };
    Error::new(code, e)
}

pub(crate) fn send_error(e: SendError) -> Error {
    let code = match &e {
        SendError::InvalidDest(_) => ICTUS_ERR_INVALID_DEST,
        SendError::InvalidRight(_) => ICTUS_ERR_INVALID_RIGHT,
        SendError::TimedOut => ICTUS_ERR_TIMED_OUT,
        SendError::TooLarge { .. } => ICTUS_ERR_TOO_LARGE,
        SendError::Invalid(_) | SendError::Ool(_) => ICTUS_ERR_INVALID_ARGUMENT,
        SendError::Os(_) => ICTUS_ERR_OS,
    };
    Error::new(code, e)
}

pub(crate) fn receive_error(e: ReceiveError) -> Error {
    let code = match &e {
        ReceiveError::InvalidName(_) => ICTUS_ERR_INVALID_NAME,
        ReceiveError::TimedOut => ICTUS_ERR_TIMED_OUT,
        ReceiveError::PortDied => ICTUS_ERR_PORT_DIED,
        ReceiveError::PortChanged => ICTUS_ERR_PORT_CHANGED,
        ReceiveError::TooLarge { .. } => ICTUS_ERR_TOO_LARGE,
        ReceiveError::Malformed { .. } => ICTUS_ERR_MALFORMED,
        ReceiveError::Os(_) => ICTUS_ERR_OS,
    };
    Error::new(code, e)
}

pub(crate) fn call_error(e: CallError) -> Error {
    match e {
        CallError::Send(e) => send_error(e),
        CallError::Receive(e) => receive_error(e),
        CallError::ServerDied => Error::new(ICTUS_ERR_SERVER_DIED, CallError::ServerDied),
    }
}

/// The one path of the calls that make a right (inside their `guard`): the space, the out-slot (checked
/// before anything is made, so that a NULL slot leaks nothing), then `make`, its name
/// written to `*name`.
fn make_name(
    space: *const ictus_space,
    name: *mut ictus_name,
    make: impl FnOnce(&Space) -> std::result::Result<Name, RightsError>,
) -> Result<()> {
    let s = handle(space, "space")?;
    let slot = out(name, "name")?;
    *slot = make(&s.space).map_err(rights)?.0;
    Ok(())
}

/// The one path of the calls that hand out a descriptor: as [`make_name`], the
/// descriptor (the caller's to close) written to `*fd`.
fn make_fd(
    space: *const ictus_space,
    fd: *mut c_int,
    make: impl FnOnce(&Space) -> std::result::Result<OwnedFd, RightsError>,
) -> Result<()> {
    let s = handle(space, "space")?;
    let slot = out(fd, "fd")?;
    *slot = make(&s.space).map_err(rights)?.into_raw_fd();
    Ok(())
}

/// The one path of the calls that change a right and return nothing else.
fn on_space(space: *const ictus_space, f: impl FnOnce(&Space) -> std::result::Result<(), RightsError>) -> Result<()> {
    f(&handle(space, "space")?.space).map_err(rights)
}

fn give<T>(value: T, to: *mut *mut T, what: &str) -> Result<()> {
    let slot = out(to, what)?;
    *slot = Box::into_raw(Box::new(value));
    Ok(())
}

// ----- spaces -------------------------------------------------------------------------

/// The process's own space (Mach's `mach_task_self()`), as an owning handle: free it
/// with `ictus_space_free` (the space itself lives on while the process does).
#[no_mangle]
pub unsafe extern "C" fn ictus_space_task(space: *mut *mut ictus_space) -> ictus_error {
    guard(|| give(ictus_space { space: Space::task() }, space, "space"))
}

/// A new, empty space (owning handle), for an in-process server or a test.
#[no_mangle]
pub unsafe extern "C" fn ictus_space_new(space: *mut *mut ictus_space) -> ictus_error {
    guard(|| give(ictus_space { space: Space::new() }, space, "space"))
}

/// Release a space handle (NULL is allowed). Rights in the space die with its last
/// handle, unless it is the task's own space.
#[no_mangle]
pub unsafe extern "C" fn ictus_space_free(space: *mut ictus_space) {
    guard_value((), || crate::free(space))
}

// ----- ports and rights ---------------------------------------------------------------

/// Allocate a port; `*name` gets its receive right.
#[no_mangle]
pub unsafe extern "C" fn ictus_port_allocate(space: *const ictus_space, name: *mut ictus_name) -> ictus_error {
    guard(|| make_name(space, name, Space::allocate_port))
}

/// Allocate a port with a send right under the same name.
#[no_mangle]
pub unsafe extern "C" fn ictus_port_allocate_with_send(
    space: *const ictus_space,
    name: *mut ictus_name,
) -> ictus_error {
    guard(|| make_name(space, name, Space::allocate_port_with_send))
}

/// Allocate a port set; move ports into it with `ictus_port_move_member`, receive from
/// it as from a port.
#[no_mangle]
pub unsafe extern "C" fn ictus_port_set_allocate(space: *const ictus_space, name: *mut ictus_name) -> ictus_error {
    guard(|| make_name(space, name, Space::allocate_port_set))
}

/// Move the receive right `member` into the port set `set` (`ICTUS_NAME_NULL`: out of
/// any set).
#[no_mangle]
pub unsafe extern "C" fn ictus_port_move_member(
    space: *const ictus_space,
    member: ictus_name,
    set: ictus_name,
) -> ictus_error {
    guard(|| on_space(space, |s| s.move_member(Name(member), Name(set))))
}

/// Release one user reference of the right(s) `name` denotes (Mach's
/// `mach_port_deallocate`).
#[no_mangle]
pub unsafe extern "C" fn ictus_port_deallocate(space: *const ictus_space, name: ictus_name) -> ictus_error {
    guard(|| on_space(space, |s| s.deallocate(Name(name))))
}

/// Destroy every right `name` denotes; a receive right's port dies (its senders see a
/// dead name).
#[no_mangle]
pub unsafe extern "C" fn ictus_port_destroy(space: *const ictus_space, name: ictus_name) -> ictus_error {
    guard(|| on_space(space, |s| s.destroy(Name(name))))
}

/// A descriptor that is readable when a message waits on the receive right or port set
/// `name`, for `poll`, `epoll` or an event loop; then receive with a zero time-out. The
/// caller owns it: close it.
#[no_mangle]
pub unsafe extern "C" fn ictus_port_pollable_fd(
    space: *const ictus_space,
    name: ictus_name,
    fd: *mut c_int,
) -> ictus_error {
    guard(|| make_fd(space, fd, |s| s.pollable_fd(Name(name))))
}

/// A descriptor for a send right to `name`'s port (a send right, or a receive right it
/// makes one from), to give to another process outside ictus's messages: by
/// inheritance (clear its close-on-exec flag) or `SCM_RIGHTS`. The caller owns it.
#[no_mangle]
pub unsafe extern "C" fn ictus_port_send_right_fd(
    space: *const ictus_space,
    name: ictus_name,
    fd: *mut c_int,
) -> ictus_error {
    guard(|| make_fd(space, fd, |s| s.send_right_fd(Name(name))))
}

/// Take a send right from a descriptor (from `ictus_port_send_right_fd` in another
/// process) into the space. The descriptor is consumed, also on failure; it must be a
/// port's socket.
#[no_mangle]
pub unsafe extern "C" fn ictus_port_insert_send_fd(
    space: *const ictus_space,
    fd: c_int,
    name: *mut ictus_name,
) -> ictus_error {
    guard(|| {
        if fd < 0 {
            return Err(Error::invalid(format!("descriptor {fd}")));
        }
        let s = handle(space, "space")?;
        let slot = out(name, "name")?;
        // SAFETY: the caller hands us `fd` to own (the header's contract: consumed).
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        *slot = s.space.insert_send_fd(owned).map_err(rights)?.0;
        Ok(())
    })
}

/// In a process started with a bootstrap right (`ICTUS_BOOTSTRAP_FD` in its
/// environment): take it into the space. `ICTUS_ERR_NOT_FOUND` if there is none.
#[no_mangle]
pub unsafe extern "C" fn ictus_bootstrap_take(space: *const ictus_space, name: *mut ictus_name) -> ictus_error {
    guard(|| {
        let s = handle(space, "space")?;
        let slot = out(name, "name")?;
        match s.space.take_bootstrap().map_err(rights)? {
            Some(n) => {
                *slot = n.0;
                Ok(())
            }
            None => Err(Error::new(ICTUS_ERR_NOT_FOUND, "this process was given no bootstrap right")),
        }
    })
}

// ----- outgoing messages --------------------------------------------------------------

/// A message with this id and a copy of `len` bytes of in-line data (`data` may be
/// NULL when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn ictus_message_new(
    id: i32,
    data: *const u8,
    len: usize,
    msg: *mut *mut ictus_message,
) -> ictus_error {
    guard(|| {
        let data = bytes(data, len, "data")?.to_vec();
        give(ictus_message { msg: Message::new(id, data) }, msg, "msg")
    })
}

/// Release a message (NULL is allowed). Rights it names stay in the space.
#[no_mangle]
pub unsafe extern "C" fn ictus_message_free(msg: *mut ictus_message) {
    guard_value((), || crate::free(msg))
}

/// Replace the message's id and in-line data.
#[no_mangle]
pub unsafe extern "C" fn ictus_message_set(
    msg: *mut ictus_message,
    id: i32,
    data: *const u8,
    len: usize,
) -> ictus_error {
    guard(|| {
        let m = handle_mut(msg, "msg")?;
        let data = bytes(data, len, "data")?;
        m.msg.id = id;
        m.msg.data.clear();
        m.msg.data.extend_from_slice(data);
        Ok(())
    })
}

/// Add a right to the message's body, taken by `disposition` when the message is sent.
#[no_mangle]
pub unsafe extern "C" fn ictus_message_add_right(
    msg: *mut ictus_message,
    name: ictus_name,
    disposition: ictus_disposition,
) -> ictus_error {
    guard(|| {
        let m = handle_mut(msg, "msg")?;
        m.msg.ports.push(PortArg::new(Name(name), crate::ports::disposition(disposition)?));
        Ok(())
    })
}

/// Give the message a reply right (`ICTUS_NAME_NULL` removes it). A call supplies its
/// own: leave it empty for `ictus_call`.
#[no_mangle]
pub unsafe extern "C" fn ictus_message_set_reply(
    msg: *mut ictus_message,
    name: ictus_name,
    disposition: ictus_disposition,
) -> ictus_error {
    guard(|| {
        let m = handle_mut(msg, "msg")?;
        m.msg.reply = match name {
            ICTUS_NAME_NULL => None,
            n => Some(PortArg::new(Name(n), crate::ports::disposition(disposition)?)),
        };
        Ok(())
    })
}

/// Add an out-of-line region holding a copy of `len` bytes: sealed when sent, so nobody
/// can change what the receiver maps. (A region written in place is
/// `ictus_message_add_region`.)
#[no_mangle]
pub unsafe extern "C" fn ictus_message_add_region_copy(
    msg: *mut ictus_message,
    data: *const u8,
    len: usize,
) -> ictus_error {
    guard(|| {
        let m = handle_mut(msg, "msg")?;
        let data = bytes(data, len, "data")?;
        let buf = OolBuffer::from_slice(data).map_err(|e| Error::new(ICTUS_ERR_OS, e))?;
        m.msg.ool.push(buf);
        Ok(())
    })
}

/// Add an out-of-line region of `len` bytes to write in place (zero copies: a frame is
/// written once, then sealed and moved by the send). `*data` gets its memory, writable
/// until the message is sent or freed.
#[no_mangle]
pub unsafe extern "C" fn ictus_message_add_region(
    msg: *mut ictus_message,
    len: usize,
    data: *mut *mut u8,
) -> ictus_error {
    guard(|| {
        let m = handle_mut(msg, "msg")?;
        let slot = out(data, "data")?;
        let mut buf = OolBuffer::new(len).map_err(|e| Error::new(ICTUS_ERR_OS, e))?;
        *slot = buf.as_mut_ptr();
        m.msg.ool.push(buf);
        Ok(())
    })
}

// ----- received messages --------------------------------------------------------------

/// A message buffer to receive into (owning handle), reused by every receive.
#[no_mangle]
pub unsafe extern "C" fn ictus_received_new(received: *mut *mut ictus_received) -> ictus_error {
    guard(|| give(ictus_received { r: Received::new() }, received, "received"))
}

/// Release a received message (NULL is allowed). Rights it brought stay in the space:
/// they are the caller's (see `ictus_received_right`).
#[no_mangle]
pub unsafe extern "C" fn ictus_received_free(received: *mut ictus_received) {
    guard_value((), || crate::free(received))
}

/// The message's id (0 for NULL).
#[no_mangle]
pub unsafe extern "C" fn ictus_received_id(received: *const ictus_received) -> i32 {
    guard_value(0, || handle(received, "received").map_or(0, |r| r.r.id))
}

/// The message's in-line data; `*len` gets its length. Borrowed: valid until the next
/// receive into `received` or its release. NULL for a NULL `received`.
#[no_mangle]
pub unsafe extern "C" fn ictus_received_data(received: *const ictus_received, len: *mut usize) -> *const u8 {
    guard_value(std::ptr::null(), || {
        let Ok(r) = handle(received, "received") else { return std::ptr::null() };
        let data = r.r.data();
        if let Ok(l) = out(len, "len") {
            *l = data.len();
        }
        data.as_ptr()
    })
}

/// Who sent the message, as the kernel verified it.
#[no_mangle]
pub unsafe extern "C" fn ictus_received_sender(
    received: *const ictus_received,
    sender: *mut ictus_credentials,
) -> ictus_error {
    guard(|| {
        let r = handle(received, "received")?;
        *out(sender, "sender")? = creds(r.r.sender);
        Ok(())
    })
}

/// The receive right the message came to (a member, when received from a set).
#[no_mangle]
pub unsafe extern "C" fn ictus_received_port(received: *const ictus_received) -> ictus_name {
    guard_value(ICTUS_NAME_NULL, || handle(received, "received").map_or(ICTUS_NAME_NULL, |r| r.r.port.0))
}

/// The message's reply right: `*name` and `*kind`. The right is the caller's: send the
/// reply to it (a send-once right is used up by that), or deallocate it.
/// `ICTUS_ERR_NOT_FOUND` if the message has none (or it was taken already).
#[no_mangle]
pub unsafe extern "C" fn ictus_received_take_reply(
    received: *mut ictus_received,
    name: *mut ictus_name,
    kind: *mut ictus_right_kind,
) -> ictus_error {
    guard(|| {
        let r = handle_mut(received, "received")?;
        let name = out(name, "name")?;
        let kind = out(kind, "kind")?;
        let reply =
            r.r.reply.take().ok_or_else(|| Error::new(ICTUS_ERR_NOT_FOUND, "the message has no reply right"))?;
        *name = reply.name.0;
        *kind = crate::ports::kind(reply.kind);
        Ok(())
    })
}

/// How many rights the message's body brought.
#[no_mangle]
pub unsafe extern "C" fn ictus_received_right_count(received: *const ictus_received) -> usize {
    guard_value(0, || handle(received, "received").map_or(0, |r| r.r.ports.len()))
}

/// The `index`th right the body brought: its name in the space (the caller's) and kind.
#[no_mangle]
pub unsafe extern "C" fn ictus_received_right(
    received: *const ictus_received,
    index: usize,
    name: *mut ictus_name,
    kind: *mut ictus_right_kind,
) -> ictus_error {
    guard(|| {
        let r = handle(received, "received")?;
        let (name, kind) = (out(name, "name")?, out(kind, "kind")?);
        let right = r.r.ports.get(index).ok_or_else(|| Error::new(ICTUS_ERR_NOT_FOUND, format!("no right {index}")))?;
        *name = right.name.0;
        *kind = crate::ports::kind(right.kind);
        Ok(())
    })
}

/// How many out-of-line regions the message brought.
#[no_mangle]
pub unsafe extern "C" fn ictus_received_region_count(received: *const ictus_received) -> usize {
    guard_value(0, || handle(received, "received").map_or(0, |r| r.r.ool.len()))
}

/// The `index`th out-of-line region, mapped read-only: `*data`, `*len`. Borrowed: valid
/// until the next receive into `received` or its release. Its contents cannot change:
/// the sender sealed it.
#[no_mangle]
pub unsafe extern "C" fn ictus_received_region(
    received: *const ictus_received,
    index: usize,
    data: *mut *const u8,
    len: *mut usize,
) -> ictus_error {
    guard(|| {
        let r = handle(received, "received")?;
        let (data, len) = (out(data, "data")?, out(len, "len")?);
        let region = r.r.ool.get(index).ok_or_else(|| Error::new(ICTUS_ERR_NOT_FOUND, format!("no region {index}")))?;
        *data = region.as_ptr();
        *len = region.len();
        Ok(())
    })
}

// ----- send, receive, call ------------------------------------------------------------

/// After a successful send the message's rights have gone as their dispositions say;
/// it keeps its id and data for the next send.
fn sent(m: &mut ictus_message) {
    m.msg.ports.clear();
    m.msg.reply = None;
}

/// Send `msg` to `dest` (a send or send-once right, or a receive right: its own port),
/// waiting at most `timeout_ns` while the queue is full. Rights move only if the send
/// succeeds; out-of-line regions leave the message either way.
#[no_mangle]
pub unsafe extern "C" fn ictus_send(
    space: *const ictus_space,
    dest: ictus_name,
    msg: *mut ictus_message,
    timeout_ns: i64,
) -> ictus_error {
    guard(|| {
        let s = handle(space, "space")?;
        let m = handle_mut(msg, "msg")?;
        s.space.send(Name(dest), &mut m.msg, SendOptions { timeout: timeout(timeout_ns) }).map_err(send_error)?;
        sent(m);
        Ok(())
    })
}

/// Receive the next message from the receive right or port set `name` into
/// `received`, waiting at most `timeout_ns`. A malformed message is destroyed and
/// reported (`ICTUS_ERR_MALFORMED`); the next receive goes on.
#[no_mangle]
pub unsafe extern "C" fn ictus_receive(
    space: *const ictus_space,
    name: ictus_name,
    received: *mut ictus_received,
    timeout_ns: i64,
) -> ictus_error {
    guard(|| {
        let s = handle(space, "space")?;
        let r = handle_mut(received, "received")?;
        let opts = ReceiveOptions { timeout: timeout(timeout_ns), populate_ool: false };
        s.space.receive(Name(name), &mut r.r, opts).map_err(receive_error)
    })
}

/// Send the request `msg` (with no reply right of its own) to `dest` and wait for the
/// reply into `reply`, for at most `timeout_ns` each way. A server that dies or drops
/// the request ends the call at once with `ICTUS_ERR_SERVER_DIED`.
#[no_mangle]
pub unsafe extern "C" fn ictus_call(
    space: *const ictus_space,
    dest: ictus_name,
    msg: *mut ictus_message,
    reply: *mut ictus_received,
    timeout_ns: i64,
) -> ictus_error {
    guard(|| {
        let s = handle(space, "space")?;
        let m = handle_mut(msg, "msg")?;
        let r = handle_mut(reply, "reply")?;
        let t = timeout(timeout_ns);
        let recv = ReceiveOptions { timeout: t, populate_ool: false };
        s.space.call(Name(dest), &mut m.msg, &mut r.r, SendOptions { timeout: t }, recv).map_err(call_error)?;
        sent(m);
        Ok(())
    })
}
