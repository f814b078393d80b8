//! Patching hot system-call sites (004 §3.3: the library answers without a trap).
//!
//! A site is the 7 bytes `b8 NN NN NN NN 0f 05` — `mov eax, NR; syscall` — with which
//! glibc, Go's runtime and most static programs make their calls. The first time one
//! traps (SIGSYS), the library rewrites its first five bytes into
//! `ff 24 25 LO HI` — `jmp qword ptr [0x050fHHLL]` — an indirect jump through slot `k`
//! of a table at [`PATCH_TABLE`] (`0x050f0000 + 8k`). The table's address is chosen so
//! that the displacement's two high bytes are `0f 05`: the bytes after the patch are
//! the original `syscall`, so a thread that had already executed the `mov` when the
//! site changed still finds a `syscall` at `site + 5` (and traps as before), and a
//! jump to `site + 5` from elsewhere still makes the call. Nothing but the five bytes
//! of one instruction changes, and the instruction boundaries at `site` and
//! `site + 5` stay boundaries.
//!
//! **Cross-modifying code.** Other threads may be executing the site while it
//! changes. The five bytes are written as Linux's `text_poke_bp` does: an `int3` over
//! the first byte, a core-serializing `membarrier` on every thread of the process
//! (`MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE`), the other four bytes, another
//! serialization, then the first byte of the jump and a last serialization. A thread
//! that meets the `int3` meanwhile gets SIGTRAP; the library's handler sees the site
//! is being patched, does what the `mov` would have done (`eax = NR`) and resumes at
//! the `syscall`. No thread can decode a half-written instruction. Only pages that
//! are executable, readable and not writable are patched (never a JIT's), and only
//! while their protection can be raised to add writing for the moment of the change.
//!
//! **What the jump reaches.** Entry `k` (32 bytes, in the library's code, so calls
//! made from it pass the filter's instruction-pointer test) loads the address of slot
//! `k` into `r11` and jumps to the slot's handler:
//!
//! - `pid`, `const` (the state page, [`crate::state`]): `getpid` and the uid/gid calls
//!   read a word and jump back — no trap, no system call.
//! - `generic`: everything else the library serves. It steps over the red zone,
//!   saves the flags, takes a stack of the library's own pool (a thread's stack may be
//!   small: Go's goroutines), saves the argument registers and the x87/SSE state
//!   (`fxsave64`: the library is built for baseline x86-64, so that is all it can
//!   touch), calls [`crate::handler::dispatch`] as the SIGSYS handler would, restores
//!   everything and jumps back with the result in `rax`. Like the kernel, it changes
//!   only `rax`, `rcx` (the return address, as `syscall` leaves it) and `r11`; flags,
//!   every other register, the vector state and the red zone are preserved.
//! - `vfork`: counts the memory-sharing child (see [`crate::state`]) and makes the
//!   call from the entry's own `syscall` (offset 11), whose return (offset 13) the
//!   parent and the child both take, to the `post` of the slot: the parent takes the
//!   count back down, the child touches nothing (it shares the parent's stack), and
//!   both jump back to the site.
//!
//! The same entries serve the trap path of `clone3` and of `clone`/`vfork` from sites
//! that are not patched: the SIGSYS handler points the program's saved instruction
//! pointer at an entry's `syscall`, so the call is made from the library's code with
//! the program's own registers, and the child — on a new stack or on its parent's —
//! returns to the site without touching memory.
//!
//! **Which sites, when.** A site is patched at its first trap. Slots are handed out in
//! order, so an image's patches share a page or two of the slots and entries. (Patching
//! at the second trap was measured: fewer `mprotect`s and `membarrier`s per compile,
//! more traps, no CPU gain shown; a site that runs twice would pay two traps. Not kept.)
//!
//! None of this is policy (the trust boundary is the filter, Landlock and the server):
//! a program that rewrites the table, the slots or the entries breaks only itself.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU16, AtomicU64, AtomicUsize, Ordering};

use crate::sys::{self, syscall6};
use crate::sysno::{self as nr, Class};
use crate::wire::{LIB_HI, LIB_LO, PATCH_SLOTS, PATCH_TABLE};
use crate::{handler, state};

/// One slot: what entry `k` does. Read by the entries' assembly at fixed offsets.
#[repr(C, align(64))]
struct Slot {
    /// What the slot is for: the site's address (a patched site), or the address after
    /// a `syscall` with a tag (a trampoline of the trap path); 0: free.
    key: AtomicU64,
    /// Where to go back to (offset 8).
    ret: AtomicU64,
    /// The handler the entry jumps to (offset 16).
    handler: AtomicU64,
    /// Where the entry's `syscall` returns to (offset 24).
    post: AtomicU64,
    /// The call's number (offset 32).
    nr: AtomicU64,
    /// `const`: the state word; `vfork`: the entry's `syscall` (offset 40).
    field: AtomicU64,
    _pad: [u64; 2],
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    key: AtomicU64::new(0),
    ret: AtomicU64::new(0),
    handler: AtomicU64::new(0),
    post: AtomicU64::new(0),
    nr: AtomicU64::new(0),
    field: AtomicU64::new(0),
    _pad: [0; 2],
};

/// The slots (the entries' assembly addresses them as `ictus_slots + 64 k`).
static SLOTS: [Slot; PATCH_SLOTS] = [FREE; PATCH_SLOTS];

/// Size of one entry.
const ENTRY: u64 = 32;
/// Offset of an entry's `syscall`.
const ENTRY_SYSCALL: u64 = 11;

/// Library stacks for the generic path: bit `i` set while stack `i` is in use or
/// does not exist yet.
static BUSY: AtomicU64 = AtomicU64::new(u64::MAX);
/// Top of stack `i` (16-byte aligned), 0 until made.
static TOPS: [AtomicU64; STACKS] = [const { AtomicU64::new(0) }; STACKS];
/// Stacks made so far.
static MADE: AtomicI32 = AtomicI32::new(0);
const STACKS: usize = 32;
/// Each stack, and a guard page below it.
const STACK_SIZE: u64 = 1 << 20;

/// The table is mapped (the loader, each image).
static TABLE: AtomicBool = AtomicBool::new(false);
/// Patching is off for this image (something it needs is missing).
static OFF: AtomicBool = AtomicBool::new(false);
/// One patcher at a time (a try-lock: a signal handler that traps while its thread
/// patches must not wait for itself).
static PATCHING: AtomicBool = AtomicBool::new(false);
/// The process that registered for `membarrier`'s core serialization.
static SYNC_PID: AtomicI32 = AtomicI32::new(0);

const TAG_PLAIN: u64 = 1 << 62;
const TAG_DEC: u64 = 1 << 61;
const FILLING: u64 = 1 << 63;

/// Registers the generic path saves for [`ictus_patched`], in this order.
#[repr(C)]
struct Frame {
    rdi: u64,
    rsi: u64,
    rdx: u64,
    r10: u64,
    r8: u64,
    r9: u64,
    slot: u64,
    /// In: the pool stack's index (-1: the program's stack). Out: the result.
    rax: u64,
}

core::arch::global_asm!(
    // The entries: 2048 of 32 bytes.
    ".pushsection .text.ictus_entries,\"ax\",@progbits",
    ".balign 32",
    ".globl ictus_entries",
    "ictus_entries:",
    ".set ictus_k, 0",
    ".rept {n}",
    "lea r11, [rip + {slots} + 64*ictus_k]",
    "jmp qword ptr [r11 + 16]",
    "syscall",
    "lea r11, [rip + {slots} + 64*ictus_k]",
    "jmp qword ptr [r11 + 24]",
    ".balign 32, 0xcc",
    ".set ictus_k, ictus_k + 1",
    ".endr",
    ".popsection",
    // getpid: the pid word's low half, unless zero.
    ".globl ictus_h_pid",
    "ictus_h_pid:",
    "mov ecx, dword ptr [{state}]",
    "jrcxz 1f",
    "mov eax, ecx",
    "mov rcx, qword ptr [r11 + 8]",
    "jmp rcx",
    "1: jmp ictus_h_generic",
    // uid and gid: the word is value + 1, unless zero.
    ".globl ictus_h_const",
    "ictus_h_const:",
    "mov rcx, qword ptr [r11 + 40]",
    "mov rcx, qword ptr [rcx]",
    "jrcxz 1f",
    "lea rax, [rcx - 1]",
    "mov rcx, qword ptr [r11 + 8]",
    "jmp rcx",
    "1: jmp ictus_h_generic",
    // vfork: one more memory-sharing child in flight, the pid cleared; then the call
    // from the entry's syscall.
    ".globl ictus_h_vfork",
    "ictus_h_vfork:",
    "lea rsp, [rsp - 128]",
    "pushfq",
    "mov rax, qword ptr [{state}]",
    "2: mov rcx, rax",
    "shr rcx, 32",
    "inc rcx",
    "shl rcx, 32",
    "lock cmpxchg qword ptr [{state}], rcx",
    "jnz 2b",
    "popfq",
    "lea rsp, [rsp + 128]",
    "mov rcx, qword ptr [r11 + 40]",
    "mov eax, dword ptr [r11 + 32]",
    "jmp rcx",
    // After an entry's syscall: back to the site.
    ".globl ictus_post_plain",
    "ictus_post_plain:",
    "mov rcx, qword ptr [r11 + 8]",
    "jmp rcx",
    // ... and the parent of a vfork-like child (rax != 0) takes the count back down.
    // The child (rax == 0) touches no memory: it runs on its parent's stack or on a
    // new one the program gave it.
    ".globl ictus_post_decrement",
    "ictus_post_decrement:",
    "mov rcx, rax",
    "jrcxz 1f",
    "lea rsp, [rsp - 128]",
    "pushfq",
    "lock sub dword ptr [{state} + 4], 1",
    "popfq",
    "lea rsp, [rsp + 128]",
    "1: mov rcx, qword ptr [r11 + 8]",
    "jmp rcx",
    // Everything else: the library's dispatcher, on a stack of its own.
    ".globl ictus_h_generic",
    "ictus_h_generic:",
    // Below the red zone, with a word for the return address; flags and rdx saved.
    "lea rsp, [rsp - 136]",
    "pushfq",
    "push rdx",
    "cld",
    // Take a free stack of the pool (rcx = index, rdx = its top)...
    "mov rax, qword ptr [rip + {busy}]",
    "2: mov rcx, rax",
    "not rcx",
    "bsf rcx, rcx",
    "jz 4f",
    "mov rdx, rax",
    "bts rdx, rcx",
    "lock cmpxchg qword ptr [rip + {busy}], rdx",
    "jnz 2b",
    "lea rdx, [rip + {tops}]",
    "mov rdx, qword ptr [rdx + rcx*8]",
    "jmp 5f",
    // ... or, with none free, stay on the program's.
    "4: mov rcx, -1",
    "lea rdx, [rsp - 64]",
    "and rdx, -16",
    "5: mov rax, rsp",
    "mov rsp, rdx",
    "push rax",
    "push rcx",
    "push rbp",
    "mov rbp, rsp",
    "mov rdx, qword ptr [rax]",
    "sub rsp, 512",
    "and rsp, -64",
    "fxsave64 [rsp]",
    "sub rsp, 64",
    "mov [rsp], rdi",
    "mov [rsp + 8], rsi",
    "mov [rsp + 16], rdx",
    "mov [rsp + 24], r10",
    "mov [rsp + 32], r8",
    "mov [rsp + 40], r9",
    "mov [rsp + 48], r11",
    "mov [rsp + 56], rcx",
    "mov rdi, rsp",
    "call {entry}",
    "mov rdi, [rsp]",
    "mov rsi, [rsp + 8]",
    "mov r10, [rsp + 24]",
    "mov r8, [rsp + 32]",
    "mov r9, [rsp + 40]",
    "mov r11, [rsp + 48]",
    "mov rax, [rsp + 56]",
    "add rsp, 64",
    "fxrstor64 [rsp]",
    "mov rsp, rbp",
    "pop rbp",
    "pop rcx",
    "pop rdx",
    // The return address into the program's stack, then back onto it, then the pool
    // stack is free again (not before: nobody may write it while it is in use).
    "mov r11, qword ptr [r11 + 8]",
    "mov qword ptr [rdx + 16], r11",
    "mov rsp, rdx",
    "test rcx, rcx",
    "js 6f",
    "lock btr qword ptr [rip + {busy}], rcx",
    "6: pop rdx",
    "popfq",
    "pop rcx",
    "lea rsp, [rsp + 128]",
    "jmp rcx",
    n = const PATCH_SLOTS,
    slots = sym SLOTS,
    state = const state::PID_WORD,
    busy = sym BUSY,
    tops = sym TOPS,
    entry = sym ictus_patched,
);

extern "C" {
    static ictus_entries: u8;
    fn ictus_h_pid();
    fn ictus_h_const();
    fn ictus_h_vfork();
    fn ictus_h_generic();
    fn ictus_post_plain();
    fn ictus_post_decrement();
}

fn addr(f: unsafe extern "C" fn()) -> u64 {
    f as *const () as usize as u64
}

fn entry(k: usize) -> u64 {
    // SAFETY: only the symbol's address is taken.
    (unsafe { &ictus_entries } as *const u8 as u64) + ENTRY * k as u64
}

/// The generic path's call into the dispatcher, on a library stack.
///
/// # Safety
/// Called by `ictus_h_generic` with its frame.
unsafe extern "C" fn ictus_patched(f: *mut Frame) {
    // SAFETY: the frame the assembly built, alive for this call.
    let f = unsafe { &mut *f };
    // SAFETY: the slot address the entry loaded.
    let slot = unsafe { &*(f.slot as *const Slot) };
    let n = slot.nr.load(Ordering::Relaxed) as u32;
    let on_program_stack = f.rax as i64 == -1;
    let a = [f.rdi, f.rsi, f.rdx, f.r10, f.r8, f.r9];
    // SAFETY: the program's own call, as the SIGSYS handler would answer it.
    f.rax = unsafe { handler::dispatch(n, a) } as u64;
    if on_program_stack {
        // Every stack of the pool was busy: make one more for next time.
        grow_pool();
    }
}

/// Map the jump table (the loader, in each new image). Without it nothing is patched.
pub fn map_table() {
    let len = (PATCH_SLOTS * 8) as u64;
    // SAFETY: an anonymous private mapping at the table's fixed address, which this
    // fresh image does not use (MAP_FIXED_NOREPLACE fails rather than replace).
    let p = unsafe { syscall6(sys::SYS_MMAP, PATCH_TABLE, len, 3, 0x22 | 0x10_0000, u64::MAX, 0) };
    TABLE.store(p as u64 == PATCH_TABLE, Ordering::Release);
}

fn table(k: usize) -> &'static AtomicU64 {
    // SAFETY: the table is mapped (checked by callers) and k < PATCH_SLOTS.
    unsafe { &*((PATCH_TABLE + 8 * k as u64) as *const AtomicU64) }
}

/// Make one more stack for the pool; false if none could be made.
fn grow_pool() -> bool {
    let i = MADE.fetch_add(1, Ordering::AcqRel);
    if i as usize >= STACKS {
        MADE.store(STACKS as i32, Ordering::Release);
        return false;
    }
    let len = STACK_SIZE + 4096;
    // SAFETY: a new anonymous mapping, then its lowest page made a guard (mmap(2),
    // mprotect(2)); MAP_NORESERVE|MAP_STACK (0x4000|0x20000): touched pages only.
    let base = unsafe { syscall6(sys::SYS_MMAP, 0, len, 3, 0x22 | 0x4000 | 0x20000, u64::MAX, 0) };
    if base < 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { syscall6(sys::SYS_MPROTECT, base as u64, 4096, 0, 0, 0, 0) };
    TOPS[i as usize].store(base as u64 + len, Ordering::Release);
    BUSY.fetch_and(!(1u64 << i), Ordering::AcqRel);
    true
}

/// Slots are handed out in order (`NEXT`), so an image's few patched sites share a
/// page or two of [`SLOTS`] and of the entries' code, where slots spread by a hash
/// each touched a page of their own (a fault to read the zero page, another to write
/// it: two per patch, in every new image). `INDEX` finds them by key.
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Open addressing by the key's hash: slot index + 1, 0 empty.
static INDEX: [AtomicU16; INDEX_LEN] = [const { AtomicU16::new(0) }; INDEX_LEN];
const INDEX_LEN: usize = 2 * PATCH_SLOTS;
const _: () = assert!(INDEX_LEN.is_power_of_two() && PATCH_SLOTS < u16::MAX as usize);

fn hash(key: u64, len: usize) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - len.trailing_zeros())) as usize
}

/// The slot whose key is `key`, if any.
fn find(key: u64) -> Option<usize> {
    let h = hash(key, INDEX_LEN);
    for i in 0..INDEX_LEN {
        match INDEX[(h + i) % INDEX_LEN].load(Ordering::Acquire) {
            0 => return None,
            v if SLOTS[v as usize - 1].key.load(Ordering::Acquire) == key => return Some(v as usize - 1),
            _ => {}
        }
    }
    None
}

/// A free slot for `key`, reserved (its key has [`FILLING`] until [`publish`]).
fn claim(key: u64) -> Option<usize> {
    let k = NEXT.fetch_add(1, Ordering::AcqRel);
    if k >= PATCH_SLOTS {
        NEXT.store(PATCH_SLOTS, Ordering::Release);
        return None;
    }
    SLOTS[k].key.store(key | FILLING, Ordering::Release);
    let h = hash(key, INDEX_LEN);
    // Never full: twice as many places as slots.
    (0..INDEX_LEN)
        .find(|i| {
            INDEX[(h + i) % INDEX_LEN].compare_exchange(0, k as u16 + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        })
        .map(|_| k)
}

fn publish(k: usize, key: u64) {
    table(k).store(entry(k), Ordering::Release);
    SLOTS[k].key.store(key, Ordering::Release);
}

/// A slot whose entry makes a call from the library's code and returns to `ret`:
/// the trap path of `clone3`, and of `clone`/`vfork` from sites not patched.
/// `decrement`: the parent takes the memory-sharing count back down. Returns the
/// address of the entry's `syscall`.
pub fn trampoline(ret: u64, decrement: bool) -> Option<u64> {
    if !TABLE.load(Ordering::Acquire) {
        return None;
    }
    let key = ret | if decrement { TAG_DEC } else { TAG_PLAIN };
    let k = match find(key) {
        Some(k) => k,
        None => {
            // Two threads may both make one for the same key: both are right.
            let k = claim(key)?;
            let s = &SLOTS[k];
            s.ret.store(ret, Ordering::Relaxed);
            let post = if decrement { addr(ictus_post_decrement) } else { addr(ictus_post_plain) };
            s.post.store(post, Ordering::Relaxed);
            s.handler.store(addr(ictus_h_generic), Ordering::Relaxed);
            publish(k, key);
            k
        }
    };
    Some(entry(k) + ENTRY_SYSCALL)
}

/// What a patched site of call `n` jumps to; `None`: not patched.
fn handler_for(n: u32) -> Option<(u64, u64)> {
    if handler::refused(n) {
        // The server answers (and counts) refusals: the generic path asks it.
        return Some((addr(ictus_h_generic), 0));
    }
    if state::is_state_call(n) {
        if !state::mapped() {
            return Some((addr(ictus_h_generic), 0));
        }
        return Some(match state::field(n) {
            Some(w) => (addr(ictus_h_const), w),
            None => (addr(ictus_h_pid), 0),
        });
    }
    match n {
        // Exec replaces the image: nothing to gain. clone3 and clone are never
        // patched: which of them needs counting depends on arguments read on the trap
        // path. rt_sigprocmask traps only for some arguments (and changes the signal
        // frame there).
        nr::EXECVE | nr::EXECVEAT | nr::CLONE | nr::CLONE3 => None,
        nr::VFORK if state::mapped() => Some((addr(ictus_h_vfork), 0)),
        nr::VFORK => None,
        _ => match nr::class(n) {
            Class::Server | Class::Refused(_) | Class::Library => Some((addr(ictus_h_generic), 0)),
            Class::Native | Class::NativeIf(_) => None,
        },
    }
}

const PROT_RX: u64 = 5;
const PROT_RWX: u64 = 7;
const MEMBARRIER_PRIVATE_EXPEDITED_SYNC_CORE: u64 = 1 << 5;
const MEMBARRIER_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: u64 = 1 << 6;

/// Every thread of the process executes a core-serializing instruction before it
/// next runs user code (membarrier(2)).
fn sync_cores() {
    // SAFETY: no pointers.
    unsafe { syscall6(sys::SYS_MEMBARRIER, MEMBARRIER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0, 0, 0, 0) };
}

/// The site of call `n` that just trapped, `syscall` ending at `rip`: patch it so that
/// its next calls reach the library without a trap. Returns the slot's entry
/// `syscall` for `vfork` (the trapped call can go through it at once).
pub fn maybe_patch(rip: u64, n: u32) -> Option<u64> {
    if OFF.load(Ordering::Relaxed) || !TABLE.load(Ordering::Acquire) {
        return None;
    }
    let site = rip.checked_sub(7)?;
    if (LIB_LO..LIB_HI).contains(&site) || (LIB_LO..LIB_HI).contains(&rip) {
        return None;
    }
    let (h, field) = handler_for(n)?;
    if find(site).is_some() {
        return None;
    }
    // The seven bytes before `rip`: its page held the `syscall` just made, but the
    // `mov` may begin on the page before, and code may be execute-only (protection
    // keys): each page is probed before it is read (one cheap call, where
    // process_vm_readv cost several times more on every trap).
    if !sys::page_readable(site) || ((rip - 1) >> 12 != site >> 12 && !sys::page_readable(rip - 1)) {
        return None;
    }
    // SAFETY: both pages the seven bytes lie on were just found readable (another
    // thread of the program may unmap them meanwhile: its own doing, as under the
    // kernel's copy).
    let code: [u8; 7] = core::array::from_fn(|i| unsafe { core::ptr::read_volatile((site + i as u64) as *const u8) });
    let want = [0xb8, n as u8, (n >> 8) as u8, (n >> 16) as u8, (n >> 24) as u8, 0x0f, 0x05];
    if code != want {
        return None;
    }
    if PATCHING.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return None;
    }
    let r = patch_locked(site, n, h, field);
    PATCHING.store(false, Ordering::Release);
    r
}

fn patch_locked(site: u64, n: u32, h: u64, field: u64) -> Option<u64> {
    if find(site).is_some() {
        return None;
    }
    // Writable code (a JIT's) is the program's to change, not ours.
    if sys::write_own(site, &[0xb8]) != -14 {
        return None;
    }
    if MADE.load(Ordering::Acquire) == 0 && !(grow_pool() && grow_pool()) {
        OFF.store(true, Ordering::Relaxed);
        return None;
    }
    let pid = sys::getpid();
    if SYNC_PID.load(Ordering::Relaxed) != pid {
        // SAFETY: no pointers.
        let r =
            unsafe { syscall6(sys::SYS_MEMBARRIER, MEMBARRIER_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0, 0, 0, 0) };
        if r != 0 {
            OFF.store(true, Ordering::Relaxed);
            return None;
        }
        SYNC_PID.store(pid, Ordering::Relaxed);
    }
    let k = claim(site)?;
    let s = &SLOTS[k];
    s.ret.store(site + 7, Ordering::Relaxed);
    s.handler.store(h, Ordering::Relaxed);
    s.nr.store(n as u64, Ordering::Relaxed);
    let vfork = h == addr(ictus_h_vfork);
    let post = if vfork { addr(ictus_post_decrement) } else { addr(ictus_post_plain) };
    s.post.store(post, Ordering::Relaxed);
    s.field.store(if vfork { entry(k) + ENTRY_SYSCALL } else { field }, Ordering::Relaxed);
    // Published before the int3 goes in: the SIGTRAP handler finds the site by it.
    publish(k, site);
    let first = site & !4095;
    let last = (site + 4) & !4095;
    let len = last + 4096 - first;
    // SAFETY: adding write to pages of the program's code for the time of the change;
    // they are executable and readable (the call came from there and was read).
    if unsafe { syscall6(sys::SYS_MPROTECT, first, len, PROT_RWX, 0, 0, 0) } != 0 {
        return None;
    }
    let p = site as *mut u8;
    let t = (PATCH_TABLE + 8 * k as u64) as u32;
    // SAFETY: the five bytes of the `mov` at `site`, writable now; every other thread
    // meets either the old instruction, the int3 or the new one (see the module doc).
    unsafe {
        core::ptr::write_volatile(p, 0xcc);
        sync_cores();
        core::ptr::write_volatile(p.add(1), 0x24);
        core::ptr::write_volatile(p.add(2), 0x25);
        core::ptr::write_volatile(p.add(3), t as u8);
        core::ptr::write_volatile(p.add(4), (t >> 8) as u8);
        sync_cores();
        core::ptr::write_volatile(p, 0xff);
        sync_cores();
        syscall6(sys::SYS_MPROTECT, first, len, PROT_RX, 0, 0, 0);
    }
    Some(entry(k) + ENTRY_SYSCALL)
}

/// A SIGTRAP at `rip`: if `rip - 1` is a site being patched (its first byte is the
/// `int3`), the call's number, which the `mov` it replaces would have put in `eax`.
pub fn patching_int3(rip: u64) -> Option<u32> {
    let site = rip.checked_sub(1)?;
    let k = find(site)?;
    Some(SLOTS[k].nr.load(Ordering::Acquire) as u32)
}

/// Patched sites and trampolines so far (for tests and the stats).
pub fn slots_used() -> usize {
    SLOTS.iter().filter(|s| s.key.load(Ordering::Relaxed) != 0).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_handed_out_in_order_and_found_by_key() {
        let keys: Vec<u64> = (0..40u64).map(|i| 0x5555_0000_0000 + 7 * i).collect();
        let got: Vec<usize> = keys.iter().map(|&k| claim(k).expect("a slot")).collect();
        for w in got.windows(2) {
            assert_eq!(w[1], w[0] + 1, "in order");
        }
        for (&k, &slot) in keys.iter().zip(&got) {
            assert_eq!(find(k), None, "not found while filling");
            publish_key_only(slot, k);
            assert_eq!(find(k), Some(slot));
        }
        assert_eq!(find(0x5555_0000_0001), None);
    }

    /// [`publish`] without the table (not mapped in a test).
    fn publish_key_only(k: usize, key: u64) {
        SLOTS[k].key.store(key, Ordering::Release);
    }
}
