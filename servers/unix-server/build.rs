//! Builds `ictus-unix-loader`, the image every program of a session runs in: the
//! emulation library (`crates/unix-emul`) and `loader/main.rs`, as a static, non-PIE
//! executable without a C runtime, linked at the library's fixed address
//! (`ictus_unix_emul::wire::LIB_LO`), so the one seccomp filter of a session
//! recognises the library's call sites in every process.
//!
//! It is built here with `rustc` directly because it must be `panic = "abort"`
//! (a `no_std` executable cannot unwind), which Cargo cannot set for one target of a
//! workspace whose other crates unwind. The server embeds the result.
use std::path::PathBuf;
use std::process::Command;

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed");
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let emul = manifest.join("../../crates/unix-emul/src");
    let common = [
        "--edition",
        "2021",
        "-C",
        "panic=abort",
        "-C",
        "opt-level=2",
        // No debug information: the loader is written to a file and compared with
        // this copy at every start (900 KB with it, ~200 KB without); its symbols
        // stay, for profiles.
        "-C",
        "debuginfo=0",
        "-C",
        "relocation-model=static",
        // Baseline x86-64 (SSE2, no VEX encodings): the patched path saves exactly the
        // x87/SSE state the library can touch (fxsave64).
        "-C",
        "target-cpu=x86-64",
    ];
    run(Command::new(&rustc)
        .args(common)
        .args(["--crate-type", "rlib", "--crate-name", "ictus_unix_emul", "--cap-lints", "allow", "--out-dir"])
        .arg(&out)
        .arg(emul.join("lib.rs")));
    let loader = out.join("ictus-unix-loader");
    run(Command::new(&rustc)
        .args(common)
        .args(["--crate-type", "bin", "--crate-name", "ictus_unix_loader", "--cap-lints", "allow", "-L"])
        .arg(&out)
        .arg("--extern")
        .arg(format!("ictus_unix_emul={}", out.join("libictus_unix_emul.rlib").display()))
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib", "-C", "link-arg=-static"])
        // Nor the debug information of `core` and the builtins linked in.
        .args(["-C", "strip=debuginfo"])
        .args(["-C", "link-arg=-Wl,--image-base=0x5000000", "-C", "link-arg=-Wl,--build-id=none"])
        .arg("-o")
        .arg(&loader)
        .arg(manifest.join("loader/main.rs")));
    println!("cargo:rustc-env=ICTUS_UNIX_LOADER_BUILT={}", loader.display());
    println!("cargo:rerun-if-changed=loader/main.rs");
    println!("cargo:rerun-if-changed=../../crates/unix-emul/src");
    for f in [
        "lib.rs",
        "cache.rs",
        "conn.rs",
        "elf.rs",
        "handler.rs",
        "loader.rs",
        "patch.rs",
        "state.rs",
        "sys.rs",
        "sysno.rs",
        "wire.rs",
    ] {
        println!("cargo:rerun-if-changed=../../crates/unix-emul/src/{f}");
    }
}
