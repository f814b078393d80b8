//! The loader file is shared by builds: a loader another build's server still holds
//! stays, one nobody holds is removed (one test, alone in its process, since it sets
//! `XDG_RUNTIME_DIR`).

use std::os::fd::AsRawFd;

#[test]
fn a_loader_of_another_build_stays_while_a_server_holds_it() {
    let dir = std::env::temp_dir().join(format!("ictus-loader-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("XDG_RUNTIME_DIR", &dir);
    std::env::remove_var("ICTUS_UNIX_LOADER");
    let private = dir.join("ictus");
    std::fs::create_dir_all(&private).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();

    // "Another build's" loader, held by its server with a shared lock.
    let other = private.join("unix-loader-00000000deadbeef");
    std::fs::write(&other, b"another build").unwrap();
    let held = std::fs::File::open(&other).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_SH) }, 0);

    let (mine, fd) = ictus_unix_server::launch::loader_path().expect("the loader");
    assert!(mine.exists());
    assert!(other.exists(), "a loader a server still holds was removed");
    // Ours is held too: another build may not remove it now.
    let probe = std::fs::File::open(&mine).unwrap();
    // SAFETY: as above.
    let got = unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_ne!(got, 0, "our own loader is not held");

    // The other server ends: its loader goes with the next start.
    drop(held);
    let (again, _fd2) = ictus_unix_server::launch::loader_path().expect("the loader");
    assert_eq!(again, mine);
    assert!(!other.exists(), "a loader nobody holds was kept");
    drop(fd);
    let _ = std::fs::remove_dir_all(&dir);
}
