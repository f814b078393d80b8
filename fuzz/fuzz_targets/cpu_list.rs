//! Fuzz the CPU-list parser, `ictus_rt::thread::parse_cpu_list` (the kernel's `0-3,5`
//! format, as in `/sys/devices/system/cpu/online`).
//!
//! Besides never panicking (or allocating without bound: ranges are capped at the
//! largest CPU set), every CPU it returns must be below `CpuSet::MAX_CPU`, and printing
//! the list back as single CPUs must parse to the same list.
#![no_main]

use ictus_rt::thread::parse_cpu_list;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Some(cpus) = parse_cpu_list(text) else { return };
    assert!(cpus.iter().all(|&c| c < 1024 * 1024), "{cpus:?}");
    let printed = cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    assert_eq!(parse_cpu_list(&printed), Some(cpus));
});
