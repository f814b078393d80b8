//! The logs of the `ictus` servers (ictus_server::log): the wording people read by
//! default, `-q` and `-v`, `RUST_LOG`, and one JSON object per event with its fields.
//!
//! Each case starts `ictus name-server` on a socket of its own with its standard error
//! in a file, waits for the socket, stops it with SIGTERM and reads what it logged.

use std::path::Path;
use std::process::Command;

use ictus_testkit::{unique, wait_until, Proc, TempDir};

/// What `ictus [flags] name-server` logs from start to a SIGTERM, with `env` set.
fn logged(flags: &[&str], env: &[(&str, &str)]) -> String {
    let dir = TempDir::new(&unique("logs"));
    let socket = dir.join("ns.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ictus"));
    cmd.args(flags).arg("name-server").arg("--socket").arg(&socket);
    cmd.env_remove("RUST_LOG").env_remove("ICTUS_LOG_FORMAT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut p = Proc::spawn_logged("name server", &mut cmd, &dir.join("stderr"));
    wait_until("the name server's socket", || Path::new(&socket).exists());
    p.sigterm();
    assert!(p.wait().success(), "the name server stops cleanly on SIGTERM:\n{}", p.log());
    p.log()
}

#[test]
fn default_lines_are_the_wording_people_read() {
    let out = logged(&[], &[]);
    assert!(out.lines().any(|l| l.starts_with("ictus name-server: serving on ")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("ictus name-server: stopped; removed ")), "{out}");
    assert!(!out.contains("pid="), "fields only from -v on:\n{out}");
}

#[test]
fn quiet_and_verbose_and_rust_log() {
    let quiet = logged(&["-q"], &[]);
    assert!(!quiet.contains("serving on"), "-q drops info:\n{quiet}");
    let verbose = logged(&["-v"], &[]);
    let serving = verbose.lines().find(|l| l.contains("serving on")).unwrap_or_else(|| panic!("{verbose}"));
    assert!(serving.contains("pid=") && serving.contains("path="), "-v adds the fields: {serving}");
    // RUST_LOG chooses over -v/-q.
    let warn_only = logged(&["-v"], &[("RUST_LOG", "warn")]);
    assert!(!warn_only.contains("serving on"), "RUST_LOG=warn drops info:\n{warn_only}");
    // A bad RUST_LOG is said, not fatal.
    let bad = logged(&[], &[("RUST_LOG", "ictus=notalevel")]);
    assert!(bad.contains("is not a valid filter") && bad.contains("serving on"), "{bad}");
}

#[test]
fn json_has_every_field() {
    let out = logged(&[], &[("ICTUS_LOG_FORMAT", "json")]);
    let events: Vec<serde_json::Value> =
        out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let serving = events
        .iter()
        .find(|e| e["message"].as_str().is_some_and(|m| m.starts_with("serving on")))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(serving["server"], "name-server");
    assert_eq!(serving["level"], "INFO");
    assert!(serving["pid"].as_u64().is_some_and(|p| p > 0), "{serving}");
    assert!(serving["path"].as_str().is_some_and(|p| p.ends_with("ns.sock")), "{serving}");
}
