//! `scripts/ceph.sh` refuses what it must, with a message that says why, without a
//! cluster: bad arguments, a directory it did not make, missing packages.

use std::path::PathBuf;
use std::process::{Command, Output};

use ictus_objstore::testcluster::script;

fn run(args: &[&str], path: Option<&str>) -> Output {
    let mut c = Command::new("/bin/bash");
    c.arg(script()).args(args);
    if let Some(p) = path {
        c.env("PATH", p);
    }
    c.output().expect("run bash")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ictus-ceph-script-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn bad_arguments_are_refused_with_the_reason() {
    let d = tmp("args");
    let ds = d.to_str().unwrap();
    for (args, says) in [
        (vec!["up", ds, "--osds", "4"], "--osds must be 1, 2 or 3"),
        (vec!["up", ds, "--osds", "-1"], "--osds must be 1, 2 or 3"),
        (vec!["up", ds, "--store", "filestore"], "--store must be bluestore or memstore"),
        (vec!["up", ds, "--timeout", "NaN"], "--timeout must be a whole number"),
        (vec!["up", ds, "--timeout", "1"], "--timeout must be 5 to 3600"),
        (vec!["up", ds, "--timeout", "99999999999999999999"], "--timeout must be 5 to 3600"),
        (vec!["up", ds, "--owner", "0"], "--owner must be a process id"),
        (vec!["up", ds, "--owner", "12ab"], "--owner must be a process id"),
        (vec!["up", ds, "--bogus"], "usage"),
        (vec!["sideways", ds], "usage"),
        (vec!["up"], "usage"),
    ] {
        let o = run(&args, None);
        assert!(!o.status.success(), "{args:?} accepted");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    assert!(!d.exists(), "a refused up made its directory");
}

#[test]
fn a_directory_it_did_not_make_is_left_alone() {
    let d = tmp("foreign");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("precious"), b"x").unwrap();
    let ds = d.to_str().unwrap();
    let o = run(&["down", ds], None);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("holds no cluster made by"), "{}", stderr(&o));
    let o = run(&["status", ds], None);
    assert!(!o.status.success());
    // `up` refuses a non-empty directory rather than mixing a cluster into it.
    let o = run(&["up", ds], None);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is not empty") || stderr(&o).contains("missing:"), "{}", stderr(&o));
    assert!(d.join("precious").exists());
    std::fs::remove_dir_all(&d).unwrap();
    // `down` of nothing is done.
    assert!(run(&["down", ds], None).status.success());
}

#[test]
fn missing_packages_are_named() {
    // A PATH with none of Ceph's programs.
    let empty = tmp("path");
    std::fs::create_dir_all(&empty).unwrap();
    let d = tmp("nopkg");
    let o = run(&["up", d.to_str().unwrap()], Some(empty.to_str().unwrap()));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("missing:") && e.contains("ceph-mon") && e.contains("ceph-common"), "{e}");
    assert!(!d.exists());
    std::fs::remove_dir_all(&empty).unwrap();
}
