//! The SIGSYS handler: the library's system-call entry (004 §3.3's "equivalent of
//! the Unix system call handler"). The seccomp filter traps every call that is not
//! done natively; the kernel delivers SIGSYS with the call's registers, and this
//! handler answers it — by itself, or by a call to the server — and writes the result
//! into the saved `rax`, so that the program resumes after its `syscall` instruction
//! as if the kernel had answered.
//!
//! Nothing here is trusted by the server: the program can overwrite this code, jump
//! into it with registers of its choosing, or replace the handler. What the library
//! may do by itself is what the filter lets its call sites do, and that is harmless
//! under any policy (see `doc/unix.md`, *Trust boundary*).

use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::conn::{self, CallError};
use crate::sys::{self, syscall6};
use crate::sysno::{self as nr, errno, ArgCheck, Class};
use crate::wire::{self, CONN_HI, COUNT_FD, HANDED_FD, INTERP_FD, PROG_FD, RESERVED_LO};
use crate::{patch, state};

/// `SIGSYS`.
pub const SIGSYS: u64 = 31;
/// `SIGTRAP`: the library's too, for the moments a call site is being patched.
pub const SIGTRAP: u64 = 5;
/// The signals the library owns, which the program may neither block nor handle
/// (its actions for them are kept virtually).
const LIBRARY_SIGNALS: u64 = (1 << (SIGSYS - 1)) | (1 << (SIGTRAP - 1));
const SI_KERNEL: i32 = 0x80;
const SA_SIGINFO: u64 = 4;
const SA_ONSTACK: u64 = 0x0800_0000;
const SA_NODEFER: u64 = 0x4000_0000;
const SA_RESTORER: u64 = 0x0400_0000;
const AT_FDCWD: i64 = -100;
const AT_EMPTY_PATH: u64 = 0x1000;
const O_CLOEXEC: u64 = 0o2000000;
const SYS_SECCOMP_CODE: i32 = 1;

// Offsets into `ucontext_t` (x86_64, the kernel's struct ucontext / sigcontext).
const GREGS: usize = 40;
const REG_R8: usize = 0;
const REG_R9: usize = 1;
const REG_R10: usize = 2;
const REG_RDI: usize = 8;
const REG_RSI: usize = 9;
const REG_RDX: usize = 12;
const REG_RAX: usize = 13;
const REG_RIP: usize = 16;

const CLONE_VM: u64 = 0x100;
const CLONE_VFORK: u64 = 0x4000;
const CLONE_THREAD: u64 = 0x10000;

/// The program's own SIGSYS and SIGTRAP actions (handler, flags, restorer, mask):
/// those signals belong to the library, so the program's `rt_sigaction` of them lands
/// here.
static VIRTUAL_SIGSYS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static VIRTUAL_SIGTRAP: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn virtual_action(sig: u64) -> Option<&'static [AtomicU64; 4]> {
    match sig {
        SIGSYS => Some(&VIRTUAL_SIGSYS),
        SIGTRAP => Some(&VIRTUAL_SIGTRAP),
        _ => None,
    }
}

core::arch::global_asm!(".globl ictus_unix_restorer", "ictus_unix_restorer:", "mov eax, 15", "syscall", "ud2",);

extern "C" {
    fn ictus_unix_restorer();
}

/// The process's umask as the library knows it: `pid << 32 | UMASK_SET | mask`, 0
/// when not known. Learned when each image starts (one thread then, nothing can
/// change it meanwhile), kept by the trapped `umask` calls, sent with every request
/// ([`wire::fd_args_word`]) so that the server need not read `/proc/PID/status` for
/// a create. Keyed by pid: a fork child, or a `vfork` child sharing this memory (not
/// its umask), lets the server read it. A thread made without `CLONE_FS` has a
/// umask of its own that this does not follow: its creates get the process's.
static UMASK: AtomicU64 = AtomicU64::new(0);
const UMASK_SET: u64 = 1 << 31;
/// `umask` calls under way; two at once (threads, a signal handler's) make the
/// kept mask unknown for the rest of the image (`UMASK_LOST`): which ended last is
/// not known.
static UMASK_CALLS: AtomicU64 = AtomicU64::new(0);
static UMASK_LOST: AtomicBool = AtomicBool::new(false);

/// Learn the umask (each new image, from [`install`]): `umask` sets and returns, so
/// it is set twice, back to what it was.
fn learn_umask() {
    // SAFETY: no pointers (umask(2)).
    let old = unsafe { syscall6(nr::UMASK, 0, 0, 0, 0, 0, 0) };
    // SAFETY: as above.
    unsafe { syscall6(nr::UMASK, old as u64, 0, 0, 0, 0, 0) };
    UMASK.store((sys::getpid() as u64) << 32 | UMASK_SET | (old as u64 & 0o777), Ordering::Release);
}

/// `umask(mask)` trapped: made, and kept.
fn umask_call(mask: u64) -> i64 {
    if UMASK_CALLS.fetch_add(1, Ordering::AcqRel) != 0 {
        UMASK_LOST.store(true, Ordering::Release);
    }
    // SAFETY: no pointers (umask(2)).
    let old = unsafe { syscall6(nr::UMASK, mask, 0, 0, 0, 0, 0) };
    let pid = state::answer(nr::GETPID) as u64;
    UMASK.store(pid << 32 | UMASK_SET | (mask & 0o777), Ordering::Release);
    UMASK_CALLS.fetch_sub(1, Ordering::AcqRel);
    old
}

/// The umask to send, if known for this process.
fn known_umask() -> Option<u32> {
    let w = UMASK.load(Ordering::Acquire);
    let ok = w & UMASK_SET != 0
        && w >> 32 == state::answer(nr::GETPID) as u64
        && UMASK_CALLS.load(Ordering::Acquire) == 0
        && !UMASK_LOST.load(Ordering::Acquire);
    ok.then_some(w as u32 & 0o777)
}

/// Install the SIGSYS and SIGTRAP handlers (each new image, by the loader).
pub fn install() -> i64 {
    learn_umask();
    let flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER | SA_RESTORER;
    let restorer = ictus_unix_restorer as *const () as usize as u64;
    let sys_act: [u64; 4] = [sigsys as *const () as usize as u64, flags, restorer, 0];
    let trap_act: [u64; 4] = [sigtrap as *const () as usize as u64, flags, restorer, 0];
    // SAFETY: valid kernel sigactions (rt_sigaction(2)), sigsetsize 8.
    unsafe {
        let r = syscall6(sys::SYS_RT_SIGACTION, SIGSYS, sys_act.as_ptr() as u64, 0, 8, 0, 0);
        if r < 0 {
            return r;
        }
        syscall6(sys::SYS_RT_SIGACTION, SIGTRAP, trap_act.as_ptr() as u64, 0, 8, 0, 0)
    }
}

unsafe fn greg(uc: *mut u8, i: usize) -> *mut u64 {
    // SAFETY: uc is the kernel's ucontext; gregs has 23 entries and i < 23.
    unsafe { uc.add(GREGS + 8 * i) as *mut u64 }
}

/// The handler the kernel calls.
///
/// # Safety
/// Called by the kernel with a valid `siginfo_t` and `ucontext_t`.
unsafe extern "C" fn sigsys(sig: i32, info: *mut u8, uc: *mut u8) {
    // SAFETY: info is the kernel's siginfo_t (si_errno at 4, si_code at 8).
    let (si_errno, si_code) = unsafe { (*(info.add(4) as *const i32), *(info.add(8) as *const i32)) };
    if si_code != SYS_SECCOMP_CODE || si_errno != wire::TRAP_DATA as i32 {
        // SAFETY: forwarding the kernel's own arguments.
        unsafe { forward(&VIRTUAL_SIGSYS, SIGSYS, sig, info, uc) };
        return;
    }
    // SAFETY: uc is the kernel's ucontext (registers at the trap).
    unsafe {
        let n = *greg(uc, REG_RAX) as u32;
        let rip = *greg(uc, REG_RIP);
        let a = [
            *greg(uc, REG_RDI),
            *greg(uc, REG_RSI),
            *greg(uc, REG_RDX),
            *greg(uc, REG_R10),
            *greg(uc, REG_R8),
            *greg(uc, REG_R9),
        ];
        if matches!(n, nr::VFORK | nr::CLONE | nr::CLONE3) && !refused(n) {
            clone_trap(uc, n, a, rip);
            return;
        }
        let r = if n == nr::RT_SIGPROCMASK { sigprocmask_in_frame(uc, a) } else { dispatch(n, a) };
        *greg(uc, REG_RAX) = r as u64;
        // Next time, this site calls the library without a trap.
        patch::maybe_patch(rip, n);
    }
}

/// The SIGTRAP handler: an `int3` of a call site being patched (see [`patch`]) does
/// what the `mov` it covers would have done; anything else is the program's.
///
/// # Safety
/// Called by the kernel with a valid `siginfo_t` and `ucontext_t`.
unsafe extern "C" fn sigtrap(sig: i32, info: *mut u8, uc: *mut u8) {
    // SAFETY: info is the kernel's siginfo_t; uc its ucontext.
    unsafe {
        if *(info.add(8) as *const i32) == SI_KERNEL {
            let rip = *greg(uc, REG_RIP);
            if let Some(n) = patch::patching_int3(rip) {
                *greg(uc, REG_RAX) = n as u64;
                *greg(uc, REG_RIP) = rip - 1 + 5;
                return;
            }
        }
        forward(&VIRTUAL_SIGTRAP, SIGTRAP, sig, info, uc);
    }
}

/// `vfork`, `clone` with `CLONE_VM` but not `CLONE_THREAD`, and every `clone3`,
/// trapped: counted if the child will share this memory (the pid on the state page
/// must not be its answer), then made from an entry of the library (the filter
/// allows them there) with the program's own registers: the handler returns to the
/// entry's `syscall`, and parent and child go back to the site from there.
unsafe fn clone_trap(uc: *mut u8, n: u32, a: [u64; 6], rip: u64) {
    let flags = match n {
        nr::VFORK => CLONE_VM | CLONE_VFORK,
        nr::CLONE => a[0],
        _ => {
            let mut f = [0u8; 8];
            if a[1] < 8 || sys::read_own(&mut f, a[0]) != 8 {
                // The kernel's answer for a struct it cannot read.
                // SAFETY: uc is the kernel's ucontext.
                unsafe { *greg(uc, REG_RAX) = -(if a[1] < 8 { errno::EINVAL } else { errno::EFAULT } as i64) as u64 };
                return;
            }
            u64::from_le_bytes(f)
        }
    };
    let shares = flags & CLONE_VM != 0 && flags & CLONE_THREAD == 0;
    let decrement = shares && flags & CLONE_VFORK != 0;
    if shares {
        state::shared_child_begin();
    }
    let target = if n == nr::VFORK { patch::maybe_patch(rip, n) } else { None };
    match target.or_else(|| patch::trampoline(rip, decrement)) {
        // SAFETY: uc is the kernel's ucontext; the entry is the library's code.
        Some(t) => unsafe {
            *greg(uc, REG_RIP) = t;
            *greg(uc, REG_RAX) = n as u64;
        },
        None => {
            if decrement {
                state::shared_child_done();
            }
            // SAFETY: as above.
            unsafe { *greg(uc, REG_RAX) = -(errno::EAGAIN as i64) as u64 };
        }
    }
}

/// Whether the policy refuses call `n` (the server's bitmap on the generation page):
/// then the library answers nothing itself, the server refuses and counts.
pub fn refused(n: u32) -> bool {
    crate::cache::refused(n)
}

/// Offset of `uc_sigmask` in the kernel's `struct ucontext` (x86_64).
const UC_SIGMASK: usize = 296;
const UNBLOCKABLE: u64 = LIBRARY_SIGNALS | (1 << (9 - 1)) | (1 << (19 - 1));

/// `rt_sigprocmask(how, set, oldset, 8)` trapped: the mask the program has is the one
/// saved in the signal frame, which `rt_sigreturn` will install when this handler
/// returns — so the change is made there (a change made with the system call here
/// would be undone by the return), minus SIGSYS, which must never be blocked.
unsafe fn sigprocmask_in_frame(uc: *mut u8, a: [u64; 6]) -> i64 {
    if a[3] != 8 {
        return -(errno::EINVAL as i64);
    }
    // SAFETY: uc is the kernel's ucontext; uc_sigmask is its 8-byte mask.
    let slot = unsafe { uc.add(UC_SIGMASK) as *mut u64 };
    // SAFETY: as above.
    let old = unsafe { core::ptr::read_unaligned(slot) };
    let mut new = old;
    if a[1] != 0 {
        let mut set = [0u8; 8];
        if sys::read_own(&mut set, a[1]) != 8 {
            return -(errno::EFAULT as i64);
        }
        let set = u64::from_le_bytes(set);
        new = match a[0] {
            0 => old | set,
            1 => old & !set,
            2 => set,
            _ => return -(errno::EINVAL as i64),
        } & !UNBLOCKABLE;
    }
    // The old mask after reading the new one: the two may be the same buffer.
    if a[2] != 0 && sys::write_own(a[2], &old.to_le_bytes()) != 8 {
        return -(errno::EFAULT as i64);
    }
    // SAFETY: as above.
    unsafe { core::ptr::write_unaligned(slot, new) };
    0
}

/// A SIGSYS or SIGTRAP that is not ours (a filter the program installed itself, a
/// breakpoint, a signal sent): to the program's own action.
unsafe fn forward(action: &[AtomicU64; 4], signo: u64, sig: i32, info: *mut u8, uc: *mut u8) {
    let handler = action[0].load(Ordering::Acquire);
    let flags = action[1].load(Ordering::Acquire);
    match handler {
        0 => {
            // SIG_DFL: end as the kernel would.
            let dfl = [0u64; 4];
            // SAFETY: a valid sigaction; then a signal to ourselves.
            unsafe {
                syscall6(sys::SYS_RT_SIGACTION, signo, dfl.as_ptr() as u64, 0, 8, 0, 0);
                syscall6(sys::SYS_TGKILL, sys::getpid() as u64, sys::gettid() as u64, signo, 0, 0, 0);
            }
        }
        1 => {}
        h => {
            if flags & SA_SIGINFO != 0 {
                // SAFETY: the program registered this function as a SA_SIGINFO handler.
                let f: extern "C" fn(i32, *mut u8, *mut u8) = unsafe { core::mem::transmute(h as usize) };
                f(sig, info, uc);
            } else {
                // SAFETY: the program registered this function as a plain handler.
                let f: extern "C" fn(i32) = unsafe { core::mem::transmute(h as usize) };
                f(sig);
            }
        }
    }
}

fn reserved(fd: u64) -> bool {
    let fd = fd as u32 as i32;
    (RESERVED_LO..1024).contains(&fd)
}

unsafe fn native(n: u32, a: [u64; 6]) -> i64 {
    // SAFETY: the caller passes the program's own arguments to the call it made.
    unsafe { syscall6(n, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

/// Copy a signal mask from the program with the library's signals removed.
unsafe fn stripped_mask(ptr: u64) -> u64 {
    // SAFETY: the program passed a sigset_t here (a bad pointer faults as in the
    // program itself).
    unsafe { core::ptr::read_unaligned(ptr as *const u64) & !LIBRARY_SIGNALS }
}

/// Answer one trapped call.
///
/// # Safety
/// `a` are the program's arguments; pointers among them are dereferenced as the
/// kernel would (a bad one faults instead of returning `EFAULT`).
pub unsafe fn dispatch(n: u32, a: [u64; 6]) -> i64 {
    if refused(n) {
        // SAFETY: the program's own arguments, not dereferenced.
        return unsafe { ask(n, a) };
    }
    if matches!(n, nr::SENDTO | nr::SENDMSG | nr::SENDMMSG) {
        // Trapped only where the view confines paths: an address or control data
        // goes to the server.
        return crate::send::emulate(n, a);
    }
    // SAFETY: each arm passes on the program's own arguments, as documented above.
    unsafe {
        match nr::class(n) {
            Class::NativeIf(check) => arg_check(n, check, a),
            Class::Library if n == nr::FCHDIR => {
                let r = native(n, a);
                if r == 0 {
                    crate::cache::cwd_changed();
                }
                r
            }
            Class::Library if state::is_state_call(n) => state::answer(n),
            Class::Library if n == nr::UMASK => umask_call(a[0]),
            // Made on the trap path only (clone_trap), never from here.
            Class::Library if matches!(n, nr::VFORK | nr::CLONE3) => -(errno::ENOSYS as i64),
            Class::Library => {
                // rt_sigsuspend(mask, size)
                if a[1] != 8 {
                    return -(errno::EINVAL as i64);
                }
                let m = stripped_mask(a[0]);
                native(n, [&m as *const u64 as u64, 8, 0, 0, 0, 0])
            }
            Class::Server => serve(n, a),
            // Trapped only when the policy hides names (the filter serves listings).
            Class::Native if n == nr::GETDENTS64 || n == nr::GETDENTS => listing(n, a),
            // Trapped only when the policy makes paths read-only (the server checks
            // the descriptor's file).
            Class::Native if n == nr::FCHMOD || n == nr::FCHOWN => fd_change(n, a),
            Class::Native if n == nr::FSETXATTR || n == nr::FREMOVEXATTR => fd_xattr(n, a),
            Class::Refused(_) | Class::Native => ask(n, a),
        }
    }
}

unsafe fn arg_check(n: u32, check: ArgCheck, a: [u64; 6]) -> i64 {
    // SAFETY: as dispatch's.
    unsafe {
        match check {
            ArgCheck::Fd0Reserved | ArgCheck::Ioctl => {
                if reserved(a[0]) {
                    // The library's own descriptors: the program cannot close, change or
                    // inspect them. close says yes (a close-everything loop goes on).
                    if n == nr::CLOSE {
                        0
                    } else {
                        -(errno::EBADF as i64)
                    }
                } else {
                    native(n, a)
                }
            }
            ArgCheck::Fd1Reserved => {
                if reserved(a[1]) {
                    -(errno::EBADF as i64)
                } else {
                    native(n, a)
                }
            }
            ArgCheck::CloseRange => {
                let (first, last) = (a[0] as u32, a[1] as u32);
                if first > last {
                    return -(errno::EINVAL as i64);
                }
                let mut r = 0;
                if first < RESERVED_LO as u32 {
                    r = native(n, [first as u64, last.min(RESERVED_LO as u32 - 1) as u64, a[2], 0, 0, 0]);
                }
                if r == 0 && last >= 1024 {
                    r = native(n, [first.max(1024) as u64, last as u64, a[2], 0, 0, 0]);
                }
                r
            }
            ArgCheck::Socket => ask(n, a),
            ArgCheck::SigmaskArg(i) => {
                let i = i as usize;
                let mut b = a;
                let m;
                if n == nr::PSELECT6 || n == nr::IO_PGETEVENTS {
                    // A pointer to { const sigset_t *ss; size_t ss_len }.
                    let mut pair = core::ptr::read_unaligned(a[i] as *const [u64; 2]);
                    if pair[0] != 0 {
                        m = stripped_mask(pair[0]);
                        pair[0] = &m as *const u64 as u64;
                    }
                    b[i] = pair.as_ptr() as u64;
                    return native(n, b);
                }
                m = stripped_mask(a[i]);
                b[i] = &m as *const u64 as u64;
                native(n, b)
            }
            ArgCheck::SigprocMask => {
                let m = stripped_mask(a[1]);
                native(n, [a[0], &m as *const u64 as u64, a[2], a[3], 0, 0])
            }
            ArgCheck::SigAction => sigaction(a),
            // Made on the trap path only (clone_trap), never from here.
            ArgCheck::CloneVm => -(errno::ENOSYS as i64),
            ArgCheck::PidZero => {
                if a[0] as u32 as i32 == sys::getpid() {
                    native(n, [0, a[1], a[2], a[3], 0, 0])
                } else {
                    -(errno::EPERM as i64)
                }
            }
        }
    }
}

unsafe fn sigaction(a: [u64; 6]) -> i64 {
    if a[3] != 8 || a[0] == 0 || a[0] > 64 || a[0] == 9 || a[0] == 19 {
        // SAFETY: an invalid request: the kernel's own answer.
        return unsafe { native(nr::RT_SIGACTION, a) };
    }
    if let Some(virt) = virtual_action(a[0]) {
        if a[2] != 0 {
            let old: [u64; 4] = core::array::from_fn(|i| virt[i].load(Ordering::Acquire));
            // SAFETY: the program passed a struct sigaction to fill.
            unsafe { core::ptr::write_unaligned(a[2] as *mut [u64; 4], old) };
        }
        if a[1] != 0 {
            // SAFETY: the program passed a struct sigaction.
            let new = unsafe { core::ptr::read_unaligned(a[1] as *const [u64; 4]) };
            for (slot, v) in virt.iter().zip(new) {
                slot.store(v, Ordering::Release);
            }
        }
        return 0;
    }
    if a[1] == 0 {
        // SAFETY: a query.
        return unsafe { native(nr::RT_SIGACTION, a) };
    }
    // SAFETY: the program passed a struct sigaction.
    let mut act = unsafe { core::ptr::read_unaligned(a[1] as *const [u64; 4]) };
    act[3] &= !LIBRARY_SIGNALS;
    // SAFETY: our copy, and the program's old-action pointer.
    unsafe { native(nr::RT_SIGACTION, [a[0], act.as_ptr() as u64, a[2], 8, 0, 0]) }
}

/// Bytes for one request or reply: the header, two paths and a little extra.
const BUF: usize = wire::REQUEST_HEADER + 2 * (wire::PATH_MAX + 1) + 512;

/// A buffer for one request, then its reply. Not zeroed (every served call has one):
/// the request's parts are copied into place after the header, the header written
/// before them, and the reply read only as far as the kernel wrote it.
type Buf = MaybeUninit<[u8; BUF]>;

/// A request being built in place, in a [`Buf`]: the first path, the second and the
/// extra bytes follow the header in that order, each copied straight from the
/// program into its place on the wire (no second copy to encode it).
struct Req {
    op: u32,
    args: [u64; 6],
    fd_args: u32,
    base: *mut u8,
    /// The first path: the program's pointer it was copied from, and its length.
    p1: Option<(u64, usize)>,
    p2: Option<usize>,
    extra: usize,
    /// The "not a link" generation read before asking ([`Req::missing_before`]).
    not_link_gen: Option<u64>,
}

impl Req {
    fn new(op: u32, args: [u64; 6], buf: &mut Buf) -> Req {
        Req {
            op,
            args,
            fd_args: 0,
            base: buf.as_mut_ptr() as *mut u8,
            p1: None,
            p2: None,
            extra: 0,
            not_link_gen: None,
        }
    }

    /// Bytes of parts written after the header.
    fn used(&self) -> usize {
        self.p1.map_or(0, |p| p.1) + self.p2.unwrap_or(0) + self.extra
    }

    /// Copy a NUL-terminated path from the program to the end of the parts:
    /// `EFAULT` for memory it cannot read (as the kernel), `ENAMETOOLONG` past
    /// `PATH_MAX`.
    unsafe fn path(&mut self, ptr: u64) -> Result<usize, i64> {
        if ptr == 0 {
            return Err(-(errno::EFAULT as i64));
        }
        let start = wire::REQUEST_HEADER + self.used();
        // Room for the path and a NUL after it (a native lookup passes it on).
        if start + wire::PATH_MAX + 1 > BUF {
            return Err(-(errno::ENAMETOOLONG as i64));
        }
        // SAFETY: start + PATH_MAX + 1 <= BUF: the copy stays inside the buffer.
        unsafe { sys::copy_str_raw(self.base.add(start), wire::PATH_MAX + 1, ptr) }
    }

    /// The first path, copied once: a second call with the same pointer (the native
    /// lookup and the failed-lookup cache had it copied already) does nothing.
    unsafe fn path1(&mut self, ptr: u64) -> Result<(), i64> {
        if self.p1.is_some_and(|(p, _)| p == ptr) {
            return Ok(());
        }
        if self.used() != 0 {
            return Err(-(errno::EINVAL as i64));
        }
        // SAFETY: as path's.
        let len = unsafe { self.path(ptr)? };
        self.p1 = Some((ptr, len));
        Ok(())
    }

    unsafe fn path2(&mut self, ptr: u64) -> Result<(), i64> {
        if self.p2.is_some() || self.extra != 0 {
            return Err(-(errno::EINVAL as i64));
        }
        // SAFETY: as path's.
        self.p2 = Some(unsafe { self.path(ptr)? });
        Ok(())
    }

    /// The first path, already copied from the program's `ptr` into `bytes`: put in
    /// its place (a copy of ours, no second read of the program's memory).
    fn path1_copied(&mut self, ptr: u64, bytes: &[u8]) -> Result<(), i64> {
        if self.used() != 0 || bytes.len() > wire::PATH_MAX {
            return Err(-(errno::EINVAL as i64));
        }
        // SAFETY: HEADER + PATH_MAX + 1 <= BUF: inside the buffer; ours, apart from
        // bytes.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(wire::REQUEST_HEADER), bytes.len()) };
        self.p1 = Some((ptr, bytes.len()));
        Ok(())
    }

    /// The first path's bytes, and a NUL written after them: the NUL-terminated
    /// string (the NUL's place belongs to the next part, not copied yet).
    fn path1_nul(&mut self) -> Option<&[u8]> {
        let (_, len) = self.p1?;
        // SAFETY: the path was copied at the header's end and len + 1 bytes from
        // there are inside the buffer (Req::path's room check).
        unsafe {
            let at = self.base.add(wire::REQUEST_HEADER);
            at.add(len).write(0);
            Some(core::slice::from_raw_parts(at, len + 1))
        }
    }

    /// Copy `len` bytes from the program as the extra part.
    unsafe fn extra(&mut self, ptr: u64, len: usize) -> Result<(), i64> {
        // SAFETY: as extra_upto's.
        unsafe { self.extra_upto(ptr, len, 512) }
    }

    /// Copy `len` (at most `max`) bytes from the program as the extra part.
    unsafe fn extra_upto(&mut self, ptr: u64, len: usize, max: usize) -> Result<(), i64> {
        if len > max || self.extra != 0 {
            return Err(-(errno::EINVAL as i64));
        }
        if ptr == 0 {
            return Err(-(errno::EFAULT as i64));
        }
        let start = wire::REQUEST_HEADER + self.used();
        if start + len > BUF {
            return Err(-(errno::EINVAL as i64));
        }
        // SAFETY: start + len <= BUF: the read stays inside the buffer.
        if unsafe { sys::read_own_raw(self.base.add(start), len, ptr) } != len as i64 {
            return Err(-(errno::EFAULT as i64));
        }
        self.extra = len;
        Ok(())
    }

    /// The bytes of a part copied in: the first path (`which` 1) or the second (2).
    fn bytes(&self, which: u8) -> &[u8] {
        let (at, len) = match which {
            1 => (0, self.p1.map_or(0, |p| p.1)),
            _ => (self.p1.map_or(0, |p| p.1), self.p2.unwrap_or(0)),
        };
        // SAFETY: the parts are inside the buffer and were written before they were
        // recorded (a path copy).
        unsafe { core::slice::from_raw_parts(self.base.add(wire::REQUEST_HEADER + at), len) }
    }

    /// Argument `i` is a directory descriptor for the path `which` (1 or 2): attach
    /// it unless the path is absolute or it is `AT_FDCWD`.
    fn dirfd(&mut self, i: usize, which: u8) {
        let has = if which == 1 { self.p1.is_some() } else { self.p2.is_some() };
        let absolute = has && self.bytes(which).first() == Some(&b'/');
        if self.args[i] as i32 as i64 != AT_FDCWD && !absolute {
            self.fd_args |= 1 << i;
        }
    }

    /// Before asking about the first path: `Some((key, None))` if it is known to be
    /// missing, `Some((key, Some(generation)))` if it may be cached after the answer,
    /// `None` if it cannot be cached (a directory descriptor attached, `/proc`, no
    /// generation page).
    fn missing_before(&mut self, follow: bool) -> Option<(u64, Option<u64>)> {
        if self.p1.is_none() || self.fd_args != 0 {
            return None;
        }
        let path = self.bytes(1);
        let key = crate::cache::key(path, follow)?;
        let generation = crate::cache::generation_for(path)?;
        self.not_link_gen = crate::cache::not_link_generation();
        if crate::cache::known_missing(key, generation) {
            return Some((key, None));
        }
        Some((key, Some(generation)))
    }

    /// After the answer: remember an `ENOENT` under the generation read before asking,
    /// unless the server said the walk went through a link (`keep` false: one byte
    /// of data with the error).
    fn missing_after(&self, cached: Option<(u64, Option<u64>)>, result: i64, keep: bool) {
        if let (Some((key, Some(generation))), true) = (cached, keep && result == -(errno::ENOENT as i64)) {
            crate::cache::remember_missing(key, generation);
        }
    }

    /// After `readlink`'s answer: remember an `EINVAL` ("not a link") too, unless the
    /// program's buffer size alone made it one.
    fn not_link_after(&self, cached: Option<(u64, Option<u64>)>, result: i64, bufsiz: u64) {
        if let (Some((key, Some(_))), Some(generation), true) =
            (cached, self.not_link_gen, result == -(errno::EINVAL as i64) && bufsiz as i32 > 0)
        {
            crate::cache::remember_missing(crate::cache::not_link(key), generation);
        }
    }

    /// Send it (the header is written before the parts now); the reply lands in
    /// `reply` — the request's own buffer, or another one where the request's parts
    /// are still needed after the answer (exec's path).
    fn send_into(&self, reply: *mut u8, cloexec: bool) -> Result<conn::Answer, i64> {
        let len = wire::REQUEST_HEADER + self.used();
        // SAFETY: the header's place at the buffer's start is BUF >= REQUEST_HEADER
        // bytes of ours; a u8 array has no alignment.
        let header = unsafe { &mut *(self.base as *mut [u8; wire::REQUEST_HEADER]) };
        wire::encode_request_header(
            header,
            self.op,
            crate::cache::cwd_generation(),
            wire::fd_args_word(self.fd_args, known_umask()),
            self.args,
            self.p1.map(|p| p.1),
            self.p2,
            self.extra,
        );
        if reply != self.base {
            // SAFETY: both buffers are BUF bytes; the request's first len are written.
            unsafe { core::ptr::copy_nonoverlapping(self.base, reply, len) };
        }
        // The descriptors named go as numbers: the server takes them from this process.
        // SAFETY: reply is a BUF-byte buffer whose first len bytes are the request.
        unsafe { conn::call_raw(reply, BUF, len, cloexec) }.map_err(|e| match e {
            CallError::NoConnection => -(errno::EMFILE as i64),
        })
    }

    /// [`Req::send_into`] the request's own buffer.
    fn send(&self, cloexec: bool) -> Result<conn::Answer, i64> {
        self.send_into(self.base, cloexec)
    }

    /// The reply's data (after [`Req::send`]).
    fn data(&self, ans: &conn::Answer) -> &[u8] {
        // SAFETY: call_raw checked the reply: its data lies inside the bytes the
        // kernel wrote into the buffer.
        unsafe { core::slice::from_raw_parts(self.base.add(ans.data_at), ans.data_len) }
    }
}

/// Ask the server about a call the library does not serve (a refusal, counted).
#[inline(never)]
unsafe fn ask(n: u32, a: [u64; 6]) -> i64 {
    let mut buf = Buf::uninit();
    let req = Req::new(n, a, &mut buf);
    match req.send(false) {
        Ok(ans) => {
            close_all(&ans);
            ans.result
        }
        Err(e) => e,
    }
}

fn close_all(ans: &conn::Answer) {
    for f in ans.fds.iter().take(ans.nfds) {
        sys::close(*f);
    }
}

/// Copy the reply's data to the program's buffer `ptr` of `cap` bytes; returns the
/// number of bytes copied, or `-EFAULT` if the program's buffer is not writable.
fn copy_out(data: &[u8], ptr: u64, cap: usize) -> i64 {
    let n = data.len().min(cap);
    if n > 0 && sys::write_own(ptr, &data[..n]) != n as i64 {
        return -(errno::EFAULT as i64);
    }
    n as i64
}

/// `fchmod(fd, mode)` / `fchown(fd, uid, gid)` served (trapped only where the policy
/// has read-only paths): the server refuses a change to a read-only file.
#[inline(never)]
fn fd_change(n: u32, a: [u64; 6]) -> i64 {
    let mut buf = Buf::uninit();
    let mut r = Req::new(n, [a[0], a[1], a[2], 0, 0, 0], &mut buf);
    r.fd_args |= 1;
    plain(&r).unwrap_or_else(|e| e)
}

/// `fsetxattr(fd, name, value, size, flags)` / `fremovexattr(fd, name)` served
/// (trapped only where the policy has read-only paths, like [`fd_change`]): the name
/// and the value are copied into the request, the server refuses a change to a
/// read-only file. A value larger than a request's room ([`XATTR_VALUE_ROOM`]) gets
/// `E2BIG` there (the kernel's own limit is 64 KiB).
#[inline(never)]
fn fd_xattr(n: u32, a: [u64; 6]) -> i64 {
    let mut buf = Buf::uninit();
    let set = n == nr::FSETXATTR;
    let size = if set { a[3] } else { 0 };
    let mut r = Req::new(n, [a[0], 0, 0, size, if set { a[4] } else { 0 }, 0], &mut buf);
    // SAFETY: the program's name pointer; a bad one is EFAULT, as natively.
    if let Err(e) = unsafe { r.path1(a[1]) } {
        return e;
    }
    if set && size > 0 {
        if size > XATTR_VALUE_ROOM as u64 {
            return -(errno::E2BIG as i64);
        }
        // SAFETY: the program's value pointer and size; a bad one is EFAULT.
        if let Err(e) = unsafe { r.extra_upto(a[2], size as usize, XATTR_VALUE_ROOM) } {
            return e;
        }
    }
    r.fd_args |= 1;
    plain(&r).unwrap_or_else(|e| e)
}

/// The largest attribute value [`fd_xattr`] carries: what a request holds after a
/// name of `XATTR_NAME_MAX` (255) bytes.
const XATTR_VALUE_ROOM: usize = 8 * 1024;

/// `getdents64(fd, dirp, count)` (or `getdents`) served: the server lists the
/// program's directory on its descriptor (the same open file, so the offset moves as
/// the kernel's would) and leaves out the names the view hides. At most what fits in
/// one reply per call; a program reads on until 0 as it would anyway.
fn listing(n: u32, a: [u64; 6]) -> i64 {
    let cap = (a[2] as u32 as usize).min(BUF - wire::REPLY_HEADER);
    let mut buf = Buf::uninit();
    let mut r = Req::new(n, [a[0], 0, cap as u64, 0, 0, 0], &mut buf);
    r.fd_args |= 1;
    let ans = match r.send(false) {
        Ok(ans) => ans,
        Err(e) => return e,
    };
    close_all(&ans);
    if ans.result <= 0 {
        return ans.result;
    }
    if ans.result as usize != ans.data_len || ans.data_len > cap {
        return -(errno::EIO as i64);
    }
    copy_out(r.data(&ans), a[1], cap)
}

unsafe fn serve(n: u32, a: [u64; 6]) -> i64 {
    let mut ts = [0i64; 4];
    // SAFETY: as dispatch's.
    let (n, a) = match unsafe { normalize(n, a, &mut ts) } {
        Ok(x) => x,
        Err(e) => return e,
    };
    if n == nr::EXECVEAT {
        if let Some(r) = known_missing(n, a) {
            return r;
        }
        // SAFETY: as dispatch's.
        return match unsafe { exec(a) } {
            Ok(r) | Err(r) => r,
        };
    }
    if lookup_path(n) {
        // SAFETY: as dispatch's.
        return unsafe { lookup(n, a) };
    }
    // SAFETY: as dispatch's.
    unsafe { ask_server(n, a, None) }
}

/// A lookup: its path copied from the program once, here; answered from the
/// failed-lookup cache, by the native lookup, or by the server (the request takes
/// this copy, no second read of the program's memory). The path's buffer is a
/// frame of its own (4 KiB): the native lookup's (8 KiB at most) goes on top of it,
/// or the request's (8.8 KiB), never both.
#[inline(never)]
unsafe fn lookup(n: u32, a: [u64; 6]) -> i64 {
    // Not zeroed: only the copied path and its NUL are read.
    let mut buf = MaybeUninit::<[u8; wire::PATH_MAX + 1]>::uninit();
    let base = buf.as_mut_ptr() as *mut u8;
    // A bad pointer or an overlong path: the kernel's answer, as the request's own
    // copy gave it before.
    // SAFETY: buf has PATH_MAX + 1 bytes; the copy writes at most PATH_MAX (one
    // more without a NUL is ENAMETOOLONG).
    let len = match unsafe { sys::copy_str_raw(base, wire::PATH_MAX + 1, a[1]) } {
        Ok(len) => len,
        Err(e) => return e,
    };
    // SAFETY: len <= PATH_MAX: the NUL goes inside buf; the first len + 1 bytes are
    // written now.
    let path_nul = unsafe {
        base.add(len).write(0);
        core::slice::from_raw_parts(base as *const u8, len + 1)
    };
    let path = &path_nul[..len];
    if let Some(v) = known_missing_path(n, a, path) {
        return v;
    }
    // SAFETY: as dispatch's; path_nul is the NUL-terminated copy of a[1].
    if let Some(v) = unsafe { crate::lookup::try_native(n, a, path_nul) } {
        return v;
    }
    // SAFETY: as dispatch's.
    unsafe { ask_server(n, a, Some(path)) }
}

/// The lookups whose path (argument 1) is copied before anything else, once, into
/// the request's place: the failed-lookup cache, the native lookup and the request
/// all read that copy.
fn lookup_path(n: u32) -> bool {
    matches!(n, nr::OPENAT | nr::NEWFSTATAT | nr::STATX | nr::FACCESSAT2 | nr::READLINKAT)
}

/// A served call; `path`: argument 1's path, copied already ([`lookup`]). Each
/// function with a request's buffer (8.8 KiB; exec's two) has a frame of its own,
/// entered from frames without one but [`lookup`]'s 4 KiB: the handler may run on a
/// small stack (Go's signal stacks, glibc's `posix_spawn` child: 32 KiB), so no two
/// of them may ever be on it at once.
#[inline(never)]
unsafe fn ask_server(n: u32, a: [u64; 6], path: Option<&[u8]>) -> i64 {
    let mut buf = Buf::uninit();
    let mut r = Req::new(n, a, &mut buf);
    if n == nr::GETCWD {
        // SAFETY: as dispatch's (no path).
        if let Some(v) = unsafe { crate::lookup::try_native(n, a, b"\0") } {
            return v;
        }
    }
    if let Some(p) = path {
        if let Err(e) = r.path1_copied(a[1], p) {
            return e;
        }
    }
    // SAFETY: as dispatch's.
    match unsafe { serve_one(&mut r) } {
        Ok(r) | Err(r) => r,
    }
}

/// The failed-lookup cache's fast path for `execve`'s program path (`execvp`'s
/// search of `$PATH`): a lookup already known to fail under the current generation
/// answers `ENOENT` here, before any request is built. Other lookups are checked on
/// the request's own copy of the path ([`ask_server`]). `None`: not known.
#[inline(never)]
fn known_missing(n: u32, a: [u64; 6]) -> Option<i64> {
    let (path, _, _) = cached_lookup(n, a)?;
    // Not zeroed (4 KiB per served lookup): only the copied bytes are read.
    let mut buf = MaybeUninit::<[u8; wire::PATH_MAX + 1]>::uninit();
    let base = buf.as_mut_ptr() as *mut u8;
    // SAFETY: buf has PATH_MAX + 1 bytes.
    let len = unsafe { sys::copy_str_raw(base, wire::PATH_MAX + 1, path) }.ok()?;
    // SAFETY: the copy wrote the first len bytes.
    known_missing_path(n, a, unsafe { core::slice::from_raw_parts(base as *const u8, len) })
}

/// The lookups the failed-lookup cache keeps: (path pointer, directory descriptor,
/// whether a final link is followed).
pub(crate) fn cached_lookup(n: u32, a: [u64; 6]) -> Option<(u64, u64, bool)> {
    const O_CREAT_OR_TMPFILE: u64 = 0o100 | 0o20000000;
    const NOFOLLOW: u64 = 0x100;
    Some(match n {
        nr::OPENAT if a[2] & O_CREAT_OR_TMPFILE == 0 => (a[1], a[0], a[2] & 0o400000 == 0),
        nr::NEWFSTATAT | nr::FACCESSAT2 => (a[1], a[0], a[3] & NOFOLLOW == 0),
        nr::STATX => (a[1], a[0], a[2] & NOFOLLOW == 0),
        nr::READLINKAT => (a[1], a[0], false),
        // execvp's search of $PATH: a program path that failed before (the server
        // publishes only a missing path, not a missing interpreter).
        nr::EXECVEAT => (a[1], a[0], a[4] & NOFOLLOW == 0),
        _ => return None,
    })
}

/// [`known_missing`] of the path `p`, already copied from the program.
pub(crate) fn known_missing_path(n: u32, a: [u64; 6], p: &[u8]) -> Option<i64> {
    let (_, dirfd, follow) = cached_lookup(n, a)?;
    if dirfd as i32 as i64 != AT_FDCWD && p.first() != Some(&b'/') {
        return None;
    }
    let key = crate::cache::key(p, follow)?;
    if crate::cache::known_missing(key, crate::cache::generation_for(p)?) {
        return Some(-(errno::ENOENT as i64));
    }
    let not_link = crate::cache::not_link_generation()?;
    (n == nr::READLINKAT && crate::cache::known_missing(crate::cache::not_link(key), not_link))
        .then_some(-(errno::EINVAL as i64))
}

/// Legacy calls become their `*at` forms here, so the server serves one form of
/// each. `ts` holds converted times that `a` may point at.
unsafe fn normalize(n: u32, a: [u64; 6], ts: &mut [i64; 4]) -> Result<(u32, [u64; 6]), i64> {
    const CWD: u64 = AT_FDCWD as u64;
    const AT_SYMLINK_NOFOLLOW: u64 = 0x100;
    const AT_REMOVEDIR: u64 = 0x200;
    Ok(match n {
        nr::OPEN => (nr::OPENAT, [CWD, a[0], a[1], a[2], 0, 0]),
        nr::CREAT => (nr::OPENAT, [CWD, a[0], 0o1101, a[1], 0, 0]),
        nr::STAT => (nr::NEWFSTATAT, [CWD, a[0], a[1], 0, 0, 0]),
        nr::LSTAT => (nr::NEWFSTATAT, [CWD, a[0], a[1], AT_SYMLINK_NOFOLLOW, 0, 0]),
        nr::ACCESS => (nr::FACCESSAT2, [CWD, a[0], a[1], 0, 0, 0]),
        nr::FACCESSAT => (nr::FACCESSAT2, [a[0], a[1], a[2], 0, 0, 0]),
        nr::READLINK => (nr::READLINKAT, [CWD, a[0], a[1], a[2], 0, 0]),
        nr::MKDIR => (nr::MKDIRAT, [CWD, a[0], a[1], 0, 0, 0]),
        nr::MKNOD => (nr::MKNODAT, [CWD, a[0], a[1], a[2], 0, 0]),
        nr::RMDIR => (nr::UNLINKAT, [CWD, a[0], AT_REMOVEDIR, 0, 0, 0]),
        nr::UNLINK => (nr::UNLINKAT, [CWD, a[0], 0, 0, 0, 0]),
        nr::RENAME => (nr::RENAMEAT2, [CWD, a[0], CWD, a[1], 0, 0]),
        nr::RENAMEAT => (nr::RENAMEAT2, [a[0], a[1], a[2], a[3], 0, 0]),
        nr::LINK => (nr::LINKAT, [CWD, a[0], CWD, a[1], 0, 0]),
        nr::SYMLINK => (nr::SYMLINKAT, [a[0], CWD, a[1], 0, 0, 0]),
        nr::CHMOD => (nr::FCHMODAT2, [CWD, a[0], a[1], 0, 0, 0]),
        nr::FCHMODAT => (nr::FCHMODAT2, [a[0], a[1], a[2], 0, 0, 0]),
        nr::CHOWN => (nr::FCHOWNAT, [CWD, a[0], a[1], a[2], 0, 0]),
        nr::LCHOWN => (nr::FCHOWNAT, [CWD, a[0], a[1], a[2], AT_SYMLINK_NOFOLLOW, 0]),
        nr::EXECVE => (nr::EXECVEAT, [CWD, a[0], a[1], a[2], 0, 0]),
        nr::UTIME => {
            // struct utimbuf { time_t actime, modtime } → two timespecs.
            if a[1] == 0 {
                (nr::UTIMENSAT, [CWD, a[0], 0, 0, 0, 0])
            } else {
                // SAFETY: the program passed a struct utimbuf.
                let t = unsafe { core::ptr::read_unaligned(a[1] as *const [i64; 2]) };
                *ts = [t[0], 0, t[1], 0];
                (nr::UTIMENSAT, [CWD, a[0], ts.as_ptr() as u64, 0, 0, 0])
            }
        }
        nr::UTIMES | nr::FUTIMESAT => {
            let (d, p, tv) = if n == nr::UTIMES { (CWD, a[0], a[1]) } else { (a[0], a[1], a[2]) };
            if tv == 0 {
                (nr::UTIMENSAT, [d, p, 0, 0, 0, 0])
            } else {
                // SAFETY: the program passed two struct timevals.
                let t = unsafe { core::ptr::read_unaligned(tv as *const [i64; 4]) };
                *ts = [t[0], t[1] * 1000, t[2], t[3] * 1000];
                (nr::UTIMENSAT, [d, p, ts.as_ptr() as u64, 0, 0, 0])
            }
        }
        _ => (n, a),
    })
}

unsafe fn serve_one(r: &mut Req) -> Result<i64, i64> {
    let n = r.op;
    let a = r.args;
    // SAFETY: every pointer read below is one the program passed for that purpose.
    unsafe {
        match n {
            nr::GETXATTR
            | nr::LGETXATTR
            | nr::LISTXATTR
            | nr::LLISTXATTR
            | nr::SETXATTR
            | nr::LSETXATTR
            | nr::REMOVEXATTR
            | nr::LREMOVEXATTR => Ok(-(errno::ENOTSUP as i64)),
            // The path was copied first (ask_server): an empty one is fstat.
            nr::NEWFSTATAT if a[3] & AT_EMPTY_PATH != 0 && r.p1.is_some_and(|p| p.1 == 0) => {
                // fstat in disguise (glibc's fstat is this): the kernel's, on the
                // program's own descriptor.
                Ok(native(nr::FSTAT, [a[0], a[2], 0, 0, 0, 0]))
            }
            nr::OPENAT => {
                r.path1(a[1])?;
                r.dirfd(0, 1);
                // O_CREAT (0o100) and O_TMPFILE (0o20000000) make names: never cached.
                let lookup = a[2] & (0o100 | 0o20000000) == 0;
                let cached = if lookup { r.missing_before(a[2] & 0o400000 == 0) } else { None };
                if let Some((_, None)) = cached {
                    return Ok(-(errno::ENOENT as i64));
                }
                let ans = r.send(a[2] & O_CLOEXEC != 0)?;
                r.missing_after(cached, ans.result, ans.data_len == 0);
                Ok(fd_result(&ans))
            }
            nr::OPENAT2 => {
                r.path1(a[1])?;
                r.dirfd(0, 1);
                if a[3] < 24 {
                    return Ok(-(errno::EINVAL as i64));
                }
                r.extra(a[2], 24)?;
                let flags = core::ptr::read_unaligned(a[2] as *const u64);
                let ans = r.send(flags & O_CLOEXEC != 0)?;
                Ok(fd_result(&ans))
            }
            nr::NEWFSTATAT | nr::STATX | nr::READLINKAT | nr::STATFS | nr::GETCWD => {
                let (out, cap) = match n {
                    nr::NEWFSTATAT => {
                        r.path1(a[1])?;
                        r.dirfd(0, 1);
                        (a[2], 144)
                    }
                    nr::STATX => {
                        r.path1(a[1])?;
                        r.dirfd(0, 1);
                        (a[4], 256)
                    }
                    nr::READLINKAT => {
                        r.path1(a[1])?;
                        r.dirfd(0, 1);
                        (a[2], a[3] as usize)
                    }
                    nr::STATFS => {
                        r.path1(a[0])?;
                        (a[1], 120)
                    }
                    _ => (a[0], a[1] as usize),
                };
                let follow = match n {
                    nr::NEWFSTATAT => Some(a[3] & 0x100 == 0),
                    nr::STATX => Some(a[2] & 0x100 == 0),
                    nr::READLINKAT => Some(false),
                    _ => None,
                };
                let cached = follow.and_then(|f| r.missing_before(f));
                if let Some((_, None)) = cached {
                    return Ok(-(errno::ENOENT as i64));
                }
                let ans = r.send(false)?;
                r.missing_after(cached, ans.result, ans.data_len == 0);
                if n == nr::READLINKAT {
                    r.not_link_after(cached, ans.result, a[3]);
                }
                close_all(&ans);
                if ans.result >= 0 {
                    let copied = copy_out(r.data(&ans), out, cap);
                    if copied < 0 || n == nr::READLINKAT || n == nr::GETCWD {
                        return Ok(copied);
                    }
                }
                Ok(ans.result)
            }
            nr::CHDIR => {
                r.path1(a[0])?;
                let ans = r.send(true)?;
                if ans.result < 0 || ans.nfds != 1 {
                    close_all(&ans);
                    return Ok(if ans.result < 0 { ans.result } else { -(errno::EIO as i64) });
                }
                let res = native(sys::SYS_FCHDIR, [ans.fds[0] as u64, 0, 0, 0, 0, 0]);
                if res == 0 {
                    crate::cache::cwd_changed();
                }
                close_all(&ans);
                Ok(res)
            }
            nr::FACCESSAT2 => {
                r.path1(a[1])?;
                r.dirfd(0, 1);
                let cached = r.missing_before(a[3] & 0x100 == 0);
                if let Some((_, None)) = cached {
                    return Ok(-(errno::ENOENT as i64));
                }
                let ans = r.send(false)?;
                close_all(&ans);
                r.missing_after(cached, ans.result, ans.data_len == 0);
                Ok(ans.result)
            }
            nr::MKDIRAT | nr::MKNODAT | nr::UNLINKAT | nr::FCHMODAT2 | nr::FCHOWNAT => {
                r.path1(a[1])?;
                r.dirfd(0, 1);
                plain(r)
            }
            nr::UTIMENSAT => {
                if a[1] != 0 {
                    r.path1(a[1])?;
                    r.dirfd(0, 1);
                } else {
                    r.fd_args |= 1;
                }
                if a[2] != 0 {
                    r.extra(a[2], 32)?;
                }
                plain(r)
            }
            nr::RENAMEAT2 | nr::LINKAT => {
                r.path1(a[1])?;
                r.path2(a[3])?;
                r.dirfd(0, 1);
                r.dirfd(2, 2);
                plain(r)
            }
            nr::SYMLINKAT => {
                r.path1(a[0])?;
                r.path2(a[2])?;
                r.dirfd(1, 2);
                plain(r)
            }
            nr::TRUNCATE => {
                r.path1(a[0])?;
                plain(r)
            }
            nr::INOTIFY_ADD_WATCH => {
                r.path1(a[1])?;
                r.fd_args |= 1;
                plain(r)
            }
            nr::CONNECT | nr::BIND => {
                let len = a[2] as usize;
                if len > 128 {
                    return Ok(-(errno::EINVAL as i64));
                }
                r.extra(a[1], len)?;
                r.fd_args |= 1;
                plain(r)
            }
            _ => plain(r),
        }
    }
}

fn plain(r: &Req) -> Result<i64, i64> {
    let ans = r.send(false)?;
    close_all(&ans);
    Ok(ans.result)
}

/// A reply that carries one descriptor: the call's result is its number here.
fn fd_result(ans: &conn::Answer) -> i64 {
    if ans.result < 0 {
        close_all(ans);
        return ans.result;
    }
    if ans.nfds != 1 {
        close_all(ans);
        return -(errno::EIO as i64);
    }
    ans.fds[0] as i64
}

/// The loader's first argument when no name is known (it names the process after
/// its first argument, then drops it before handing argv to the program).
pub const LOADER_ARGV0: &[u8] = b"ictus-unix-loader\0";

/// `execveat(dirfd, path, argv, envp, flags)`: the server resolves the program
/// through the view, opens it and its interpreter, and hands them over with the
/// loader; the library puts them where the loader looks ([`PROG_FD`], [`INTERP_FD`])
/// and execs the loader, so the new image has the library too.
#[inline(never)]
unsafe fn exec(a: [u64; 6]) -> Result<i64, i64> {
    const AT_EMPTY: u64 = AT_EMPTY_PATH;
    let mut req = Buf::uninit();
    let mut r = Req::new(nr::EXECVEAT, a, &mut req);
    // SAFETY: the program's path.
    unsafe { r.path1(a[1])? };
    r.dirfd(0, 1);
    // The reply in a buffer of its own: the path is needed after it.
    let mut reply = Buf::uninit();
    let reply = reply.as_mut_ptr() as *mut u8;
    let ans = r.send_into(reply, true)?;
    if ans.result < 0 {
        close_all(&ans);
        return Ok(ans.result);
    }
    // The argv prefix: a count byte (with EXEC_HANDS_CONNECTION), then
    // NUL-terminated strings.
    // SAFETY: call_raw checked the reply: its data lies inside what the kernel wrote.
    let data = unsafe { core::slice::from_raw_parts(reply.add(ans.data_at), ans.data_len) };
    let handed = data.first().is_some_and(|c| c & wire::EXEC_HANDS_CONNECTION != 0);
    let nfds = ans.nfds - usize::from(handed);
    if ans.nfds < 2 + usize::from(handed) {
        close_all(&ans);
        return Ok(-(errno::EIO as i64));
    }
    let (loader, prog) = (ans.fds[0], ans.fds[1]);
    let interp = if nfds == 3 { ans.fds[2] } else { -1 };
    let conn = if handed { ans.fds[nfds] } else { -1 };
    let mut prefix = [0u64; 8];
    let mut np = 0;
    if let Some((&count, mut rest)) = data.split_first() {
        while np < ((count & !wire::EXEC_HANDS_CONNECTION) as usize).min(prefix.len()) {
            let Some(end) = rest.iter().position(|&b| b == 0) else { break };
            prefix[np] = rest.as_ptr() as u64;
            np += 1;
            rest = &rest[end + 1..];
        }
    }
    // Count the program's argv.
    let argv = a[2] as *const u64;
    let mut argc = 0usize;
    // SAFETY: the program's argv array, NULL-terminated (a NULL argv is empty).
    unsafe {
        while !argv.is_null() && *argv.add(argc) != 0 {
            argc += 1;
            if argc > 1 << 20 {
                close_all(&ans);
                return Ok(-(errno::E2BIG as i64));
            }
        }
    }
    let total = 1 + np + if np > 0 { 1 + argc.saturating_sub(1) } else { argc } + 1;
    let bytes = (total * 8 + 4095) & !4095;
    // SAFETY: an anonymous private mapping (mmap(2)).
    let mem = unsafe { syscall6(sys::SYS_MMAP, 0, bytes as u64, 3, 0x22, u64::MAX, 0) };
    if mem < 0 {
        close_all(&ans);
        return Ok(-(errno::ENOMEM as i64));
    }
    let v = mem as *mut u64;
    // The path, NUL-terminated in the request's buffer (the reply went elsewhere).
    let (path, path_len) = match r.path1_nul() {
        Some(p) => (p.as_ptr(), p.len() - 1),
        None => (LOADER_ARGV0.as_ptr(), 0),
    };
    // SAFETY: v has room for `total` pointers; the strings live until execveat copies
    // them (the prefix in the reply, the path in the request, the rest in the
    // program's memory).
    unsafe {
        let mut k = 0;
        // The loader's own argv[0] is the path the program exec'd: the loader names
        // the process after it, as the kernel would have (`/proc/PID/comm`, what
        // `ps` and `pgrep` show), and drops it.
        *v.add(k) = if path_len > 0 { path as u64 } else { LOADER_ARGV0.as_ptr() as u64 };
        k += 1;
        for p in prefix.iter().take(np) {
            *v.add(k) = *p;
            k += 1;
        }
        if np > 0 {
            // A script: the interpreter gets the path as it was given, then argv[1..].
            *v.add(k) = path as u64;
            k += 1;
            for i in 1..argc {
                *v.add(k) = *argv.add(i);
                k += 1;
            }
        } else {
            for i in 0..argc {
                *v.add(k) = *argv.add(i);
                k += 1;
            }
        }
        *v.add(k) = 0;
        syscall6(sys::SYS_DUP2, prog as u64, PROG_FD as u64, 0, 0, 0, 0);
        if interp >= 0 {
            syscall6(sys::SYS_DUP2, interp as u64, INTERP_FD as u64, 0, 0, 0, 0);
        } else {
            sys::close(INTERP_FD);
        }
        sys::close(prog);
        if interp >= 0 {
            sys::close(interp);
        }
        // The new image's connection, inherited (not close-on-exec) where its loader
        // looks.
        if conn >= 0 {
            syscall6(sys::SYS_DUP2, conn as u64, HANDED_FD as u64, 0, 0, 0, 0);
            sys::close(conn);
        }
        let empty = b"\0";
        let res = syscall6(sys::SYS_EXECVEAT, loader as u64, empty.as_ptr() as u64, v as u64, a[3], AT_EMPTY, 0);
        // Only on failure do we get here.
        sys::close(loader);
        sys::close(PROG_FD);
        sys::close(INTERP_FD);
        if conn >= 0 {
            sys::close(HANDED_FD);
        }
        syscall6(sys::SYS_MUNMAP, v as u64, bytes as u64, 0, 0, 0, 0);
        Ok(res)
    }
}

const _: () = assert!(CONN_HI < PROG_FD && INTERP_FD < PROG_FD && CONN_HI <= HANDED_FD && HANDED_FD < COUNT_FD);
