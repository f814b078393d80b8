//! Declares the `loom` cfg, under which the protocol core is built on loom's atomics
//! (the model check of `ictus-shm`).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
