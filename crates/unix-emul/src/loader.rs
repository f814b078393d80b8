//! The loader: the image the kernel execs for every program of a session (the
//! library is this image). It installs the session's seccomp filter if this is the
//! session's first process, installs the SIGSYS handler, maps the program and its
//! interpreter from the descriptors the server opened ([`PROG_FD`], [`INTERP_FD`]),
//! points the auxiliary vector at them, drops its own `argv[0]`, and jumps to the
//! interpreter (or the program, if static). So every image of the session, static
//! ones included, carries the library, at the same address.

use crate::elf::{self, ET_DYN, PT_INTERP, PT_LOAD, PT_PHDR};
use crate::handler;
use crate::sys::{self, syscall6};
use crate::wire::{self, FILTER_FD, INTERP_FD, LIB_HI, LIB_LO, PROG_FD};

const PROT_NONE: u64 = 0;
const MAP_PRIVATE: u64 = 0x02;
const MAP_FIXED: u64 = 0x10;
const MAP_ANONYMOUS: u64 = 0x20;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;
const PAGE: u64 = 4096;

const AT_NULL: u64 = 0;
const AT_PHDR: u64 = 3;
const AT_PHENT: u64 = 4;
const AT_PHNUM: u64 = 5;
const AT_BASE: u64 = 7;
const AT_ENTRY: u64 = 9;

/// Room for the session's filter: 4096 instructions (the kernel's limit).
const FILTER_MAX: usize = 4096 * 8;

struct FilterBuf(core::cell::UnsafeCell<[u8; FILTER_MAX]>);
// SAFETY: used once, by the single thread of a starting loader.
unsafe impl Sync for FilterBuf {}
static FILTER: FilterBuf = FilterBuf(core::cell::UnsafeCell::new([0; FILTER_MAX]));

/// Where an image landed.
#[derive(Debug, Clone, Copy)]
struct Mapped {
    bias: u64,
    entry: u64,
    phdr: u64,
    phnum: u64,
}

fn filter_installed() -> bool {
    // SAFETY: a system call number no kernel has; no arguments.
    unsafe { syscall6(wire::PROBE_NR, 0, 0, 0, 0, 0, 0) == -(wire::PROBE_ERRNO as i64) }
}

/// The first process of a session installs the filter the launcher left on
/// [`FILTER_FD`]. Later ones find it inherited (it cannot be removed), and ignore
/// whatever is on that descriptor.
fn install_filter() {
    if filter_installed() {
        sys::close(FILTER_FD);
        return;
    }
    let mut st = [0u64; 18];
    // SAFETY: st is a struct stat's worth of bytes (fstat(2)).
    if unsafe { syscall6(sys::SYS_FSTAT, FILTER_FD as u64, st.as_mut_ptr() as u64, 0, 0, 0, 0) } < 0 {
        sys::fatal(&[b"no seccomp filter: start programs with `ictus unix run`"], 127);
    }
    let size = st[6] as usize;
    if size == 0 || size % 8 != 0 || size > FILTER_MAX {
        sys::fatal(&[b"the seccomp filter handed over is malformed"], 127);
    }
    let buf = FILTER.0.get() as *mut u8;
    let mut got = 0;
    while got < size {
        // SAFETY: buf has FILTER_MAX bytes and got + (size - got) <= FILTER_MAX.
        let n = unsafe {
            syscall6(sys::SYS_PREAD64, FILTER_FD as u64, buf.add(got) as u64, (size - got) as u64, got as u64, 0, 0)
        };
        if n <= 0 {
            sys::fatal(&[b"reading the seccomp filter failed"], 127);
        }
        got += n as usize;
    }
    sys::close(FILTER_FD);
    #[repr(C)]
    struct Fprog {
        len: u16,
        filter: *const u8,
    }
    let prog = Fprog { len: (size / 8) as u16, filter: buf };
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) has no pointers; prog points at the filter
    // (seccomp(2), SECCOMP_SET_MODE_FILTER).
    let r = unsafe {
        syscall6(sys::SYS_PRCTL, 38, 1, 0, 0, 0, 0);
        syscall6(sys::SYS_SECCOMP, 1, 0, &prog as *const Fprog as u64, 0, 0, 0)
    };
    if r < 0 {
        let mut d = [0u8; 24];
        sys::fatal(&[b"installing the seccomp filter failed: errno ", sys::decimal(-r, &mut d)], 127);
    }
}

fn pread_exact(fd: i32, buf: &mut [u8], at: u64) -> bool {
    // SAFETY: buf is a valid slice.
    let n = unsafe { syscall6(sys::SYS_PREAD64, fd as u64, buf.as_mut_ptr() as u64, buf.len() as u64, at, 0, 0) };
    n == buf.len() as i64
}

fn mmap(addr: u64, len: u64, prot: u64, flags: u64, fd: i32, off: u64) -> i64 {
    // SAFETY: mapping anonymous memory or a file the server opened; MAP_FIXED only
    // over the range this loader reserved (mmap(2)).
    unsafe { syscall6(sys::SYS_MMAP, addr, len, prot, flags, fd as i64 as u64, off) }
}

fn fail(what: &[u8]) -> ! {
    sys::fatal(&[b"cannot load the program: ", what], 127)
}

/// How much of an image the loader reads at once: the ELF header and, nearly
/// always, the program headers after it (one `pread` where there were two).
const HEAD: usize = 1024;

/// Map an ELF image from `fd`, if `fd` is open; the flag says whether it has a
/// `PT_INTERP` (which an open [`INTERP_FD`] must match).
fn map_image(fd: i32) -> Option<(Mapped, bool)> {
    let mut head = [0u8; HEAD];
    // SAFETY: head is a valid buffer (pread(2)).
    let n = unsafe { syscall6(sys::SYS_PREAD64, fd as u64, head.as_mut_ptr() as u64, HEAD as u64, 0, 0, 0) };
    if n == -9 {
        // EBADF: nothing was opened there.
        return None;
    }
    if n < elf::EHDR_SIZE as i64 {
        fail(b"short ELF header");
    }
    let got = n as usize;
    let h = elf::parse_ehdr(&head[..elf::EHDR_SIZE]).unwrap_or_else(|_| fail(b"not an x86_64 ELF program"));
    let mut table = [0u8; elf::MAX_PHNUM * elf::PHDR_SIZE];
    let tlen = h.phnum * elf::PHDR_SIZE;
    match usize::try_from(h.phoff).ok().filter(|&at| at.checked_add(tlen).is_some_and(|end| end <= got)) {
        Some(at) => table[..tlen].copy_from_slice(&head[at..at + tlen]),
        None if !pread_exact(fd, &mut table[..tlen], h.phoff) => fail(b"program headers outside the file"),
        None => {}
    }
    let table = &table[..tlen];
    let (lo, hi) = elf::load_span(table, h.phnum).unwrap_or_else(|_| fail(b"bad segments"));
    let bias = if h.kind == ET_DYN {
        let r = mmap(0, hi - lo, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if r < 0 {
            fail(b"no room for the program");
        }
        (r as u64).wrapping_sub(lo)
    } else {
        if lo < LIB_HI && hi > LIB_LO {
            fail(b"the program's fixed addresses overlap the library's");
        }
        let r = mmap(lo, hi - lo, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if r < 0 || r as u64 != lo {
            fail(b"the program's fixed addresses are taken");
        }
        0
    };
    let mut phdr_addr = 0u64;
    let mut has_interp = false;
    for i in 0..h.phnum {
        let p = elf::phdr(table, i).unwrap_or_else(|_| fail(b"bad program header"));
        match p.kind {
            PT_PHDR => phdr_addr = p.vaddr.wrapping_add(bias),
            PT_INTERP => has_interp = true,
            PT_LOAD if p.memsz > 0 => {
                let prot = (if p.flags & 4 != 0 { 1 } else { 0 })
                    | (if p.flags & 2 != 0 { 2 } else { 0 })
                    | (if p.flags & 1 != 0 { 4 } else { 0 });
                let start = (p.vaddr & !(PAGE - 1)).wrapping_add(bias);
                let file_end = p.vaddr.wrapping_add(p.filesz).wrapping_add(bias);
                let mem_end = p.vaddr.wrapping_add(p.memsz).wrapping_add(bias);
                let file_pages_end = (file_end + PAGE - 1) & !(PAGE - 1);
                if p.filesz > 0 {
                    let r =
                        mmap(start, file_pages_end - start, prot, MAP_PRIVATE | MAP_FIXED, fd, p.offset & !(PAGE - 1));
                    if r < 0 {
                        fail(b"mapping a segment failed");
                    }
                    if p.memsz > p.filesz && prot & 2 != 0 && file_end < file_pages_end {
                        // The tail of the last file page belongs to .bss: zero it.
                        // SAFETY: a writable page this loader just mapped.
                        unsafe { core::ptr::write_bytes(file_end as *mut u8, 0, (file_pages_end - file_end) as usize) };
                    }
                }
                let anon_start = if p.filesz > 0 { file_pages_end } else { start };
                let anon_end = (mem_end + PAGE - 1) & !(PAGE - 1);
                if anon_end > anon_start {
                    let r =
                        mmap(anon_start, anon_end - anon_start, prot, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0);
                    if r < 0 {
                        fail(b"mapping .bss failed");
                    }
                }
                if phdr_addr == 0 && p.offset <= h.phoff && h.phoff < p.offset + p.filesz {
                    phdr_addr = (h.phoff - p.offset).wrapping_add(p.vaddr).wrapping_add(bias);
                }
            }
            _ => {}
        }
    }
    if phdr_addr == 0 {
        fail(b"program headers not in memory");
    }
    let m = Mapped { bias, entry: h.entry.wrapping_add(bias), phdr: phdr_addr, phnum: h.phnum as u64 };
    Some((m, has_interp))
}

/// Name the process after the last component of `path` (a C string), as the kernel
/// names it after the file an `execve` ran: the kernel named it after the loader.
///
/// # Safety
/// `path` is null or a NUL-terminated string (the loader's `argv[0]`).
unsafe fn name_process(path: *const u8) {
    if path.is_null() {
        return;
    }
    let (mut i, mut base) = (0usize, 0usize);
    // SAFETY: a NUL-terminated string; PATH_MAX bounds the walk.
    unsafe {
        while *path.add(i) != 0 && i < crate::wire::PATH_MAX {
            if *path.add(i) == b'/' {
                base = i + 1;
            }
            i += 1;
        }
        if i > base && *path.add(i) == 0 {
            // PR_SET_NAME copies at most 16 bytes and ends them with a NUL (prctl(2)).
            syscall6(sys::SYS_PRCTL, 15, path.add(base) as u64, 0, 0, 0, 0);
        }
    }
}

/// The loader's entry, from `_start` with the initial stack pointer.
///
/// # Safety
/// `sp` is the stack the kernel built for this image (argc, argv, envp, auxv).
pub unsafe extern "C" fn start(sp: *mut u64) -> ! {
    install_filter();
    if handler::install() < 0 {
        sys::fatal(&[b"installing the SIGSYS handler failed"], 127);
    }
    crate::cache::map_generation();
    crate::lookup::map_counts();
    crate::state::map();
    crate::patch::map_table();
    crate::conn::adopt_handed();
    let Some((prog, needs_interp)) = map_image(PROG_FD) else {
        sys::fatal(&[b"no program to load: start programs with `ictus unix run`"], 127);
    };
    sys::close(PROG_FD);
    let interp = map_image(INTERP_FD).map(|(m, _)| {
        sys::close(INTERP_FD);
        m
    });
    if needs_interp && interp.is_none() {
        fail(b"the program needs an interpreter and none was opened");
    }
    // SAFETY: the kernel's stack layout: argc, argv[argc], NULL, envp..., NULL, auxv.
    unsafe {
        let argc = *sp as usize;
        let argv = sp.add(1);
        let mut p = argv.add(argc + 1);
        while *p != 0 {
            p = p.add(1);
        }
        let mut aux = p.add(1);
        while *aux != AT_NULL {
            let v = aux.add(1);
            match *aux {
                AT_PHDR => *v = prog.phdr,
                AT_PHENT => *v = elf::PHDR_SIZE as u64,
                AT_PHNUM => *v = prog.phnum,
                AT_ENTRY => *v = prog.entry,
                AT_BASE => *v = interp.map_or(0, |m| m.bias),
                _ => {}
            }
            aux = aux.add(2);
        }
        name_process(*argv as *const u8);
        // Drop the loader's own argv[0]: the argv, envp and auxv arrays move down one
        // word over it, so the stack pointer stays where the kernel put it (16-byte
        // aligned, as the ABI requires at entry).
        let end = aux.add(2);
        let words = end.offset_from(argv.add(1)) as usize;
        core::ptr::copy(argv.add(1), argv, words);
        *sp = argc.saturating_sub(1) as u64;
        let new_sp = sp;
        let entry = interp.map_or(prog.entry, |m| m.entry);
        core::arch::asm!(
            "mov rsp, rdi",
            "xor ebp, ebp",
            "xor edx, edx",
            "jmp rsi",
            in("rdi") new_sp,
            in("rsi") entry,
            options(noreturn)
        );
    }
}
