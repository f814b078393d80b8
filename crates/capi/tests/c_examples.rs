//! The C and C++ examples, built with the system compiler against libictus through its
//! pkg-config file (`ictus.pc.in`, filled in for this build tree), and run: plain, and
//! under AddressSanitizer (whose leak checker also runs at exit).
//!
//! - `pingpong.c` / `pingpong.cpp`: two processes, a thousand calls;
//! - `names.c`: register, look up, send through the looked-up right, list, unregister,
//!   against a name server this test runs;
//! - `shm_echo.c`: two processes, a thousand records over a shared-memory channel, the
//!   server waiting in poll(2) on its descriptor;
//! - `midi_play.c`: a scale onto a virtual cable whose receiving end this test holds,
//!   every note checked on arrival.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use ictus_midi::device::cable::CableIn;
use ictus_midi::device::Device;
use ictus_testkit::{unique, NameServer};

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo put libictus.so and libictus.a for this build (beside this test's
/// binary, in `deps/`, or one level up).
fn libdir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps").to_path_buf();
    for dir in [deps.clone(), deps.parent().expect("profile dir").to_path_buf()] {
        if dir.join("libictus.so").exists() && dir.join("libictus.a").exists() {
            return dir;
        }
    }
    panic!("libictus.so and libictus.a are not beside {}: build the crate (cargo build -p ictus-c)", exe.display());
}

struct Build {
    dir: PathBuf,
    cflags: Vec<String>,
    libs: Vec<String>,
    libdir: PathBuf,
}

/// The pkg-config file for this build tree, and what `pkg-config` makes of it.
fn build() -> &'static Build {
    static BUILD: OnceLock<Build> = OnceLock::new();
    BUILD.get_or_init(|| {
        // Under cargo's directory for integration tests' files, not /tmp: a TempDir in
        // this static would never be dropped, and every run would leave one behind.
        // One directory per run (the process id), removed by the next run's start.
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-examples");
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join(std::process::id().to_string());
        std::fs::create_dir_all(&dir).expect("create the examples' build directory");
        let libdir = libdir();
        let pc = std::fs::read_to_string(manifest().join("ictus.pc.in"))
            .expect("ictus.pc.in")
            .replace("@PREFIX@", &manifest().display().to_string())
            .replace("@LIBDIR@", &libdir.display().to_string())
            .replace("@INCLUDEDIR@", &manifest().join("include").display().to_string())
            .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
        std::fs::write(dir.join("ictus.pc"), pc).expect("write ictus.pc");
        let pkg = |what: &str| -> Vec<String> {
            let out = Command::new("pkg-config")
                .arg(what)
                .arg("ictus")
                .env("PKG_CONFIG_PATH", &dir)
                .output()
                .expect("pkg-config (Debian package pkg-config; scripts/setup.sh installs it)");
            assert!(out.status.success(), "pkg-config {what} ictus: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).expect("UTF-8").split_whitespace().map(String::from).collect()
        };
        let modversion = pkg("--modversion");
        assert_eq!(modversion, [env!("CARGO_PKG_VERSION")]);
        Build { cflags: pkg("--cflags"), libs: pkg("--libs"), libdir, dir }
    })
}

/// Compile one example (C or C++), optionally with AddressSanitizer.
fn compile(source: &str, asan: bool) -> PathBuf {
    let b = build();
    let src = manifest().join("examples").join(source);
    let cpp = source.ends_with(".cpp");
    let stem = Path::new(source).file_stem().unwrap().to_string_lossy().into_owned();
    let exe = b.dir.join(format!("{stem}{}{}", if cpp { "_cpp" } else { "" }, if asan { "_asan" } else { "" }));
    let mut cmd = Command::new(if cpp { "c++" } else { "cc" });
    cmd.args(if cpp { ["-std=c++17"] } else { ["-std=c11"] })
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-g", "-D_GNU_SOURCE"])
        .arg(format!("-I{}", manifest().join("examples/c").display()))
        .args(&b.cflags)
        .arg(&src);
    if asan {
        cmd.args(["-fsanitize=address", "-fno-omit-frame-pointer"]);
    }
    cmd.args(&b.libs).arg(format!("-Wl,-rpath,{}", b.libdir.display())).arg("-o").arg(&exe);
    let out = cmd.output().expect("the system C compiler (cc, c++)");
    assert!(out.status.success(), "compiling {source}:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// Run an example with a watchdog; its output, which must say it succeeded.
fn run(exe: &Path, args: &[&str]) -> String {
    let mut child = Command::new(exe)
        .args(args)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:exitcode=86")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the example");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("{} hung; killed it\n{}", exe.display(), show(&out));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "{} failed: {}\n{}", exe.display(), out.status, show(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn show(out: &Output) -> String {
    format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The README's C example is `examples/c/hello.c`, word for word; it builds and runs.
#[test]
fn the_readme_example_is_hello_c_and_runs() {
    let readme = std::fs::read_to_string(manifest().join("../../README.md")).expect("README.md");
    let at = readme.find("## From C and C++").expect("the README's C section");
    let start = readme[at..].find("```c\n").expect("a C block") + at + "```c\n".len();
    let block = &readme[start..start + readme[start..].find("```\n").expect("the block's end")];
    let file = std::fs::read_to_string(manifest().join("examples/c/hello.c")).expect("hello.c");
    assert!(block == file, "README.md's C example and crates/capi/examples/c/hello.c differ: change both");
    for asan in [false, true] {
        let out = run(&compile("c/hello.c", asan), &[]);
        assert_eq!(out, "received id 7: hello from C\n");
    }
}

fn pingpong(source: &str, asan: bool) {
    let exe = compile(source, asan);
    let out = run(&exe, &[]);
    assert!(out.contains("1000 round trips"), "{out}");
}

#[test]
fn ping_pong_between_two_processes_in_c() {
    pingpong("c/pingpong.c", false);
}

#[test]
fn ping_pong_between_two_processes_in_c_under_asan() {
    pingpong("c/pingpong.c", true);
}

#[test]
fn ping_pong_between_two_processes_in_cpp() {
    pingpong("cpp/pingpong.cpp", false);
}

#[test]
fn ping_pong_between_two_processes_in_cpp_under_asan() {
    pingpong("cpp/pingpong.cpp", true);
}

fn shm_echo(asan: bool) {
    let exe = compile("c/shm_echo.c", asan);
    let out = run(&exe, &[]);
    assert!(out.contains("1000 records echoed over a shared-memory channel"), "{out}");
}

#[test]
fn an_echo_over_a_shared_memory_channel_in_c() {
    shm_echo(false);
}

#[test]
fn an_echo_over_a_shared_memory_channel_in_c_under_asan() {
    shm_echo(true);
}

fn names(asan: bool) {
    let ns = NameServer::start();
    let exe = compile("c/names.c", asan);
    let out = run(&exe, &[&ns.socket().display().to_string()]);
    assert!(out.contains("received id 42: found you"), "{out}");
    assert!(out.contains("looking up no-such-name: not found (no name \"no-such-name\" is registered"), "{out}");
    assert!(out.lines().any(|l| l == "c-example"), "listed while registered: {out}");
    assert!(!ns.has("c-example"), "unregistered at the end");
}

#[test]
fn a_name_server_lookup_in_c() {
    names(false);
}

#[test]
fn a_name_server_lookup_in_c_under_asan() {
    names(true);
}

fn midi(asan: bool) {
    let name = unique("capi-midi");
    let mut cable = CableIn::open(&name).expect("the cable's receiving end");
    let exe = compile("c/midi_play.c", asan);
    // The cable holds a few datagrams (a MIDI IN's buffer): read while the player plays.
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut buf = [0u8; 256];
        while bytes.len() < 48 {
            match cable.read(&mut buf, Some(Duration::from_secs(60))) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) => panic!("reading the cable after {} bytes: {e}", bytes.len()),
            }
        }
        bytes
    });
    let out = run(&exe, &[&format!("cable:{name}")]);
    assert!(out.contains("played 16 messages (48 bytes)"), "{out}");
    assert!(out.contains("a stray data byte: invalid argument"), "{out}");
    let bytes = reader.join().expect("reader");
    let scale = [60u8, 62, 64, 65, 67, 69, 71, 72];
    let want: Vec<u8> = scale.iter().flat_map(|&k| [0x90, k, 100, 0x80, k, 0]).collect();
    assert_eq!(bytes, want, "the scale, note on and off, in order");
}

#[test]
fn a_midi_player_onto_the_virtual_cable_in_c() {
    midi(false);
}

#[test]
fn a_midi_player_onto_the_virtual_cable_in_c_under_asan() {
    midi(true);
}
