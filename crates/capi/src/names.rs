//! The name server's client (`ictus-name-api`) for C.

use std::ffi::c_char;

use ictus_ipc::Name;
use ictus_name_api::{Client, ClientError, ConnectError};

use crate::error::{guard, guard_value, ictus_error, Error, *};
use crate::ports::{ictus_name, ictus_space};
use crate::{buffer, handle, out, string};

/// A connection to the name server (owning handle), in one space: rights it looks up
/// are put there.
#[derive(Debug)]
pub struct ictus_name_client {
    client: Client,
}

fn connect_error(e: ConnectError) -> Error {
    // No name server listening is the common case, and its message says what to do.
    Error::new(ICTUS_ERR_UNAVAILABLE, e)
}

fn client_error(e: ClientError) -> Error {
    let code = match &e {
        ClientError::InvalidName(_) => ICTUS_ERR_INVALID_ARGUMENT,
        ClientError::NotARight(_) => ICTUS_ERR_INVALID_RIGHT,
        ClientError::NameExists(_) => ICTUS_ERR_EXISTS,
        ClientError::NotFound(_) => ICTUS_ERR_NOT_FOUND,
        ClientError::NotOwner(_) | ClientError::QuotaExceeded => ICTUS_ERR_DENIED,
        ClientError::BadRight => ICTUS_ERR_INVALID_RIGHT,
        ClientError::Full => ICTUS_ERR_NO_SPACE,
        ClientError::ServerDied => ICTUS_ERR_SERVER_DIED,
        ClientError::TimedOut => ICTUS_ERR_TIMED_OUT,
        _ => ICTUS_ERR_OS,
    };
    Error::new(code, e)
}

/// Connect to the name server at `socket_path`, or (NULL) through this process's
/// bootstrap right or the default socket (`$XDG_RUNTIME_DIR/ictus/name-server.sock`).
#[no_mangle]
pub unsafe extern "C" fn ictus_name_client_connect(
    space: *const ictus_space,
    socket_path: *const c_char,
    client: *mut *mut ictus_name_client,
) -> ictus_error {
    guard(|| {
        let s = handle(space, "space")?;
        let slot = out(client, "client")?;
        let c = if socket_path.is_null() {
            Client::connect(&s.space)
        } else {
            Client::connect_socket(&s.space, std::path::Path::new(string(socket_path, "socket_path")?))
        }
        .map_err(connect_error)?;
        *slot = Box::into_raw(Box::new(ictus_name_client { client: c }));
        Ok(())
    })
}

/// Release a name server connection (NULL is allowed).
#[no_mangle]
pub unsafe extern "C" fn ictus_name_client_free(client: *mut ictus_name_client) {
    guard_value((), || crate::free(client))
}

/// Look `name` up; `*right` gets a send right to the port registered under it, in the
/// client's space. The right is the caller's: deallocate it when done.
#[no_mangle]
pub unsafe extern "C" fn ictus_name_lookup(
    client: *const ictus_name_client,
    name: *const c_char,
    right: *mut ictus_name,
) -> ictus_error {
    guard(|| {
        let c = handle(client, "client")?;
        let name = string(name, "name")?;
        let slot = out(right, "right")?;
        *slot = c.client.lookup(name).map_err(client_error)?.0;
        Ok(())
    })
}

/// Register a send right made from `right` (a receive or send right of the client's
/// space) under `name`. The registration dies with the port.
#[no_mangle]
pub unsafe extern "C" fn ictus_name_register(
    client: *const ictus_name_client,
    name: *const c_char,
    right: ictus_name,
) -> ictus_error {
    guard(|| {
        let c = handle(client, "client")?;
        c.client.register(string(name, "name")?, Name(right)).map_err(client_error)
    })
}

/// Unregister `name` (registered by this task).
#[no_mangle]
pub unsafe extern "C" fn ictus_name_unregister(client: *const ictus_name_client, name: *const c_char) -> ictus_error {
    guard(|| {
        let c = handle(client, "client")?;
        c.client.unregister(string(name, "name")?).map_err(client_error)
    })
}

/// The registered names, each followed by a newline, NUL-terminated, into `buf` of
/// `cap` bytes; `*len` gets the length without the NUL. If `buf` is too small
/// (`ICTUS_ERR_BUFFER_TOO_SMALL`), `*len` gets the length needed and nothing is written.
#[no_mangle]
pub unsafe extern "C" fn ictus_name_list(
    client: *const ictus_name_client,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> ictus_error {
    guard(|| {
        let c = handle(client, "client")?;
        let len = out(len, "len")?;
        let names = c.client.list().map_err(client_error)?;
        let mut text = String::new();
        for n in names {
            text.push_str(&n);
            text.push('\n');
        }
        *len = text.len();
        let buf = buffer(buf.cast::<u8>(), cap, "buf")?;
        if buf.len() < text.len() + 1 {
            return Err(Error::new(
                ICTUS_ERR_BUFFER_TOO_SMALL,
                format!("the list needs {} bytes with its NUL; the buffer has {}", text.len() + 1, buf.len()),
            ));
        }
        buf[..text.len()].copy_from_slice(text.as_bytes());
        buf[text.len()] = 0;
        Ok(())
    })
}
