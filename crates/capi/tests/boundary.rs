//! The boundary's promises, checked on the library itself: every entry point runs in
//! the panic guard, and bad arguments from C are errors, never a crash.

use std::ffi::CStr;
use std::ptr;

use ictus::*;

/// Every `extern "C"` function's body begins by entering `guard` or `guard_value`
/// (`catch_unwind`), so a panic anywhere below can never unwind into C.
#[test]
fn every_entry_point_runs_in_the_panic_guard() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("src") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("extern \"C\" fn ") {
            let after = &rest[at..];
            let name: String = after["extern \"C\" fn ".len()..].chars().take_while(|c| *c != '(').collect();
            // The body: from the first `{` after the signature.
            let body_start = after.find(") -> ").map_or(0, |i| i).max(after.find(')').unwrap_or(0));
            let open = after[body_start..].find('{').expect("a body") + body_start;
            // The first statement, past comments.
            let mut first = after[open + 1..].trim_start();
            while first.starts_with("//") {
                first = first[first.find('\n').unwrap_or(first.len())..].trim_start();
            }
            assert!(
                first.starts_with("guard(") || first.starts_with("guard_value("),
                "{}: `{name}` does not begin with guard(..) or guard_value(..): {}",
                path.display(),
                &first[..first.len().min(80)]
            );
            checked += 1;
            rest = &after[open..];
        }
    }
    assert!(checked > 50, "found only {checked} entry points");
}

fn last() -> String {
    // SAFETY: ictus_last_error returns a NUL-terminated string, never NULL.
    unsafe { CStr::from_ptr(ictus_last_error()) }.to_string_lossy().into_owned()
}

#[test]
fn null_pointers_and_bad_constants_are_errors() {
    // SAFETY: every call below passes NULLs or bad values on purpose; the library must
    // refuse them without touching memory.
    unsafe {
        assert_eq!(ictus_space_task(ptr::null_mut()), ICTUS_ERR_INVALID_ARGUMENT);
        assert!(last().contains("NULL"), "{}", last());
        assert_eq!(ictus_port_allocate(ptr::null(), ptr::null_mut()), ICTUS_ERR_INVALID_ARGUMENT);
        let mut space = ptr::null_mut();
        assert_eq!(ictus_space_new(&mut space), ICTUS_OK);
        let mut port = 0;
        assert_eq!(ictus_port_allocate_with_send(space, &mut port), ICTUS_OK);
        let mut msg = ptr::null_mut();
        assert_eq!(ictus_message_new(1, ptr::null(), 5, &mut msg), ICTUS_ERR_INVALID_ARGUMENT, "NULL data, length 5");
        assert_eq!(ictus_message_new(1, ptr::null(), 0, &mut msg), ICTUS_OK);
        assert_eq!(ictus_message_add_right(msg, port, 99), ICTUS_ERR_INVALID_ARGUMENT);
        assert!(last().contains("99 is not an ictus_disposition"), "{}", last());
        assert_eq!(ictus_send(space, 0x7777, msg, 0), ICTUS_ERR_INVALID_DEST);
        assert_eq!(ictus_send(space, port, msg, 0), ICTUS_OK);
        let mut r = ptr::null_mut();
        assert_eq!(ictus_received_new(&mut r), ICTUS_OK);
        assert_eq!(ictus_receive(space, port, r, 0), ICTUS_OK);
        assert_eq!(ictus_received_id(r), 1);
        assert_eq!(ictus_receive(space, port, r, 0), ICTUS_ERR_TIMED_OUT);
        let (mut name, mut kind) = (0, 0);
        assert_eq!(ictus_received_take_reply(r, &mut name, &mut kind), ICTUS_ERR_NOT_FOUND);
        assert_eq!(ictus_received_right(r, 3, &mut name, &mut kind), ICTUS_ERR_NOT_FOUND);
        assert!(ictus_received_data(ptr::null(), ptr::null_mut()).is_null());
        assert_eq!(ictus_received_id(ptr::null()), 0);
        assert_eq!(ictus_name_lookup(ptr::null(), c"x".as_ptr(), &mut name), ICTUS_ERR_INVALID_ARGUMENT);
        let bad_utf8 = [0xffu8, 0];
        let mut out = ptr::null_mut();
        assert_eq!(ictus_midi_output_open(bad_utf8.as_ptr().cast(), 0, &mut out), ICTUS_ERR_INVALID_ARGUMENT);
        assert!(last().contains("UTF-8"), "{}", last());
        assert_eq!(ictus_midi_output_open(c"cable:x".as_ptr(), 0x80, &mut out), ICTUS_ERR_INVALID_ARGUMENT);
        assert_eq!(ictus_midi_output_close(ptr::null_mut(), 0, ptr::null_mut()), ICTUS_OK);
        assert_eq!(ictus_shm_client_fd(ptr::null()), -1);
        // Freeing NULL is allowed everywhere.
        ictus_space_free(ptr::null_mut());
        ictus_message_free(ptr::null_mut());
        ictus_received_free(ptr::null_mut());
        ictus_name_client_free(ptr::null_mut());
        ictus_shm_client_free(ptr::null_mut());
        ictus_shm_server_free(ptr::null_mut());
        ictus_received_free(r);
        ictus_message_free(msg);
        assert_eq!(ictus_port_destroy(space, port), ICTUS_OK);
        ictus_space_free(space);
    }
}

#[test]
fn strerror_names_every_value_and_survives_any_int() {
    for code in [-1, 0, 7, 19, 20, i32::MAX, i32::MIN] {
        // SAFETY: ictus_strerror returns a static NUL-terminated string for any int.
        let s = unsafe { CStr::from_ptr(ictus_strerror(code)) }.to_str().expect("UTF-8");
        assert!(!s.is_empty());
    }
    // SAFETY: as above.
    assert_eq!(unsafe { CStr::from_ptr(ictus_strerror(0)) }.to_bytes(), b"success");
    // SAFETY: a static NUL-terminated string.
    assert_eq!(unsafe { CStr::from_ptr(ictus_version()) }.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn a_shared_memory_channel_from_c_calls() {
    // SAFETY: handles from this library, used on one thread, freed once.
    unsafe {
        let mut space = ptr::null_mut();
        assert_eq!(ictus_space_new(&mut space), ICTUS_OK);
        let mut server = ptr::null_mut();
        assert_eq!(ictus_shm_server_new(space, &mut server), ICTUS_OK);
        let service = ictus_shm_server_service(server);
        let server_addr = server as usize;
        // The server answers on its own thread: each record back with its tag plus one.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        let t = std::thread::spawn(move || {
            let server = server_addr as *mut ictus_shm_server;
            let mut buf = [0u8; 64];
            let mut answered = 0;
            while !d.load(std::sync::atomic::Ordering::Relaxed) {
                let mut ready = 0;
                assert_eq!(ictus_shm_server_wait(server, 5_000_000, &mut ready), ICTUS_OK);
                loop {
                    let mut ev = ictus_shm_event::default();
                    let e = ictus_shm_server_next(server, &mut ev, buf.as_mut_ptr(), 4);
                    if e == ICTUS_ERR_BUFFER_TOO_SMALL {
                        // Kept for the next call with a larger buffer.
                        assert_eq!(ictus_shm_server_next(server, &mut ev, buf.as_mut_ptr(), buf.len()), ICTUS_OK);
                    } else {
                        assert_eq!(e, ICTUS_OK);
                    }
                    match ev.kind {
                        ICTUS_SHM_NONE => break,
                        ICTUS_SHM_RECORD => {
                            let e = ictus_shm_server_send(server, ev.client, ev.tag + 1, buf.as_ptr(), ev.len);
                            assert_eq!(e, ICTUS_OK);
                            answered += 1;
                        }
                        _ => {}
                    }
                }
            }
            answered
        });
        let mut client_space = ptr::null_mut();
        assert_eq!(ictus_space_new(&mut client_space), ICTUS_OK);
        let mut fd = -1;
        assert_eq!(ictus_port_send_right_fd(space, service, &mut fd), ICTUS_OK);
        let mut svc = 0;
        assert_eq!(ictus_port_insert_send_fd(client_space, fd, &mut svc), ICTUS_OK);
        let mut client = ptr::null_mut();
        assert_eq!(ictus_shm_client_connect(client_space, svc, ptr::null(), &mut client), ICTUS_OK);
        assert!(ictus_shm_client_fd(client) >= 0);
        for i in 0..100u32 {
            let data = format!("record {i}");
            assert_eq!(ictus_shm_client_send(client, i, data.as_ptr(), data.len(), 10_000_000_000), ICTUS_OK);
            let (mut tag, mut len) = (0u32, 0usize);
            let mut small = [0u8; 2];
            let e = ictus_shm_client_recv(client, 10_000_000_000, &mut tag, small.as_mut_ptr(), small.len(), &mut len);
            assert_eq!(e, ICTUS_ERR_BUFFER_TOO_SMALL, "{}", last());
            assert_eq!(len, data.len(), "the length needed");
            let mut buf = [0u8; 64];
            let e = ictus_shm_client_recv(client, 10_000_000_000, &mut tag, buf.as_mut_ptr(), buf.len(), &mut len);
            assert_eq!(e, ICTUS_OK, "{}", last());
            assert_eq!((tag, &buf[..len]), (i + 1, data.as_bytes()), "the same reply, kept for the retry");
        }
        ictus_shm_client_free(client);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(t.join().expect("server thread"), 100);
        ictus_shm_server_free(server);
        ictus_space_free(client_space);
        ictus_space_free(space);
    }
}
