//! `ictus-unix-loader`: the image the kernel execs for every program of an ictus Unix
//! session. It carries the emulation library (`ictus_unix_emul`), maps the program
//! the server opened, and jumps to it. Not meant to be run by hand.
#![no_std]
#![no_main]
#![allow(unsafe_code)]

core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {entry}",
    "ud2",
    entry = sym ictus_unix_emul::loader::start,
);

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    ictus_unix_emul::sys::fatal(&[b"the emulation library panicked"], 127)
}

/// Unwinding is never used (panics end the process); the symbol only satisfies
/// `core`, which is built for unwinding.
#[no_mangle]
extern "C" fn rust_eh_personality() {}

/// As above.
#[no_mangle]
extern "C" fn _Unwind_Resume() -> ! {
    ictus_unix_emul::sys::fatal(&[b"unwinding is not supported"], 127)
}

// The memory functions the compiler may call (there is no C library). `rep movsb`
// and `rep stosb` rather than loops, which the compiler would turn back into calls.

/// `memcpy`.
///
/// # Safety
/// As C's: `n` bytes valid at both, not overlapping.
#[no_mangle]
unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract; rep movsb copies rcx bytes from rsi to rdi.
    unsafe {
        core::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _, options(nostack, preserves_flags));
    }
    dst
}

/// `memmove`.
///
/// # Safety
/// As C's.
#[no_mangle]
unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize).wrapping_add(n) {
        // SAFETY: a forward copy is correct when dst does not start inside src.
        return unsafe { memcpy(dst, src, n) };
    }
    // SAFETY: copying backwards with the direction flag set, then clearing it (the
    // ABI requires it clear).
    unsafe {
        core::arch::asm!(
            "std", "rep movsb", "cld",
            inout("rcx") n => _, inout("rdi") dst.add(n - 1) => _, inout("rsi") src.add(n - 1) => _,
            options(nostack)
        );
    }
    dst
}

/// `memset`.
///
/// # Safety
/// As C's.
#[no_mangle]
unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract; rep stosb stores al rcx times at rdi.
    unsafe {
        core::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _, in("al") c as u8, options(nostack, preserves_flags));
    }
    dst
}

/// `memcmp` (and `bcmp`).
///
/// # Safety
/// As C's.
#[no_mangle]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n, within both buffers.
        let (x, y) = unsafe { (core::ptr::read_volatile(a.add(i)), core::ptr::read_volatile(b.add(i))) };
        if x != y {
            return x as i32 - y as i32;
        }
        i += 1;
    }
    0
}

/// `bcmp`.
///
/// # Safety
/// As C's.
#[no_mangle]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the same contract.
    unsafe { memcmp(a, b, n) }
}
