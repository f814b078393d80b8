//! The session's seccomp filter, built from [`ictus_unix_emul::sysno::class`] and the
//! policy. Installed once by the session's first loader; every process of the
//! session inherits it across fork, clone and exec, and no process can remove it.
//!
//! What it decides, for every system call of every thread:
//! - another architecture (i386 `int 0x80`) or an x32 number: refused outright;
//! - [`Class::Native`] calls: allowed, from anywhere (the host kernel does them);
//! - argument checks ([`ArgCheck`]): allowed, or sent to the library;
//! - "to the library": allowed if the call comes from the library's own code (the
//!   instruction pointer is inside `[LIB_LO, LIB_HI)`), else trapped to it;
//! - everything else (paths, exec, refusals, unknown numbers): trapped (SIGSYS with
//!   [`wire::TRAP_DATA`]) to the library, which asks the server.
//!
//! Pure: produces bytes, makes no system call.

use ictus_unix_emul::sysno::{self, ArgCheck, Class};
use ictus_unix_emul::wire;

const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_TRAP: u32 = 0x0003_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541c;

const LD_W_ABS: u16 = 0x20;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGE_K: u16 = 0x35;
const JMP_JGT_K: u16 = 0x25;
const JMP_JSET_K: u16 = 0x45;
const CLONE_VM: u32 = 0x100;
const CLONE_THREAD: u32 = 0x10000;
const RET_K: u16 = 0x06;

const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_IP_LO: u32 = 8;
const OFF_IP_HI: u32 = 12;
const fn arg_lo(i: u8) -> u32 {
    16 + 8 * i as u32
}
const fn arg_hi(i: u8) -> u32 {
    20 + 8 * i as u32
}

/// What the policy changes in the filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterPolicy {
    /// Network families other than `AF_UNIX` allowed.
    pub network: bool,
    /// `AF_UNIX` datagram sockets allowed (the view is the host's tree — see
    /// [`Policy::confines_paths`](crate::policy::Policy::confines_paths) — or
    /// addressed sends are served).
    pub unix_datagrams: bool,
    /// Sends whose destination or control data the filter cannot see are served
    /// (the view confines paths, so the kernel's resolution of an `AF_UNIX` path is
    /// not the view's): `sendto` with an address, `sendmsg` and `sendmmsg` are
    /// trapped from anywhere — and end the process when they come from the
    /// library's code, which never makes them (it sends with `sendto` and no
    /// address): a program that jumps there is hostile. `sendto` without an
    /// address stays native.
    pub served_sends: bool,
    /// Directory listings (`getdents`, `getdents64`) are served, so the names the
    /// view hides are left out of them (the policy hides something).
    pub served_listings: bool,
    /// `fchmod`, `fchown`, `fsetxattr` and `fremovexattr` (which take only a
    /// descriptor) are served, so a file at
    /// a read-only view path keeps its mode and owner (the policy has read-only
    /// paths). Trapped from anywhere, the library's code included.
    pub served_fd_changes: bool,
    /// Read-only lookups (`openat` without a write, create, truncate or `O_TMPFILE`
    /// flag, `newfstatat`, `statx`, `faccessat2` without `W_OK`, `readlinkat`,
    /// `getcwd`) are
    /// allowed from the library's code: the view confines nothing they could reveal
    /// (see `ictus_unix_emul::lookup`). From anywhere else, and in every other form,
    /// they are trapped as before.
    pub native_lookups: bool,
    /// With `native_lookups`: nothing in the view is read-only, so `faccessat2` with
    /// `W_OK` is allowed from the library's code too (the kernel's answer is the
    /// server's).
    pub native_write_access: bool,
    /// Calls the policy refuses besides the table's own refusals (trapped, so the
    /// server can count them and answer the policy's errno).
    pub refused: Vec<u32>,
}

/// The argument tests of the library's native lookups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    /// `openat(dirfd, path, flags, mode)`: no flag that writes, creates or truncates.
    OpenReadOnly,
    /// `faccessat2(dirfd, path, mode, flags)`: no `W_OK` (an `ro` line answers it).
    AccessNoWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Allow,
    Trap,
    Lib,
    Check(ArgCheck),
    /// To the library's code only with read-only arguments; else trapped.
    LibIf(Lookup),
    /// `sendto`: allowed without an address (argument 4 null), else trapped.
    SendTo,
    /// `sendto` the policy refuses: the library's code only, without an address.
    SendToLib,
    /// Trapped from the program; the process is killed if it comes from the
    /// library's code (which never makes it).
    NotFromLib,
}

fn action(nr: u32, p: &FilterPolicy) -> Act {
    if p.served_sends {
        match nr {
            sysno::SENDMSG | sysno::SENDMMSG => return Act::NotFromLib,
            sysno::SENDTO if p.refused.contains(&nr) => return Act::SendToLib,
            sysno::SENDTO => return Act::SendTo,
            _ => {}
        }
    }
    if p.refused.contains(&nr) {
        // Refused to the program; the library's own calls stay allowed (they are
        // harmless: a refusal of a native call is policy for the program, and the
        // library needs getpid and friends to reach the server at all).
        return match sysno::class(nr) {
            Class::Native | Class::NativeIf(_) | Class::Library => Act::Lib,
            Class::Server | Class::Refused(_) => Act::Trap,
        };
    }
    if p.served_listings && (nr == sysno::GETDENTS || nr == sysno::GETDENTS64) {
        // Trapped from anywhere, the library's code included, like every served call.
        return Act::Trap;
    }
    if p.served_fd_changes && matches!(nr, sysno::FCHMOD | sysno::FCHOWN | sysno::FSETXATTR | sysno::FREMOVEXATTR) {
        return Act::Trap;
    }
    if p.native_lookups {
        match nr {
            sysno::NEWFSTATAT | sysno::STATX | sysno::READLINKAT | sysno::GETCWD => return Act::Lib,
            sysno::OPENAT => return Act::LibIf(Lookup::OpenReadOnly),
            sysno::FACCESSAT2 if p.native_write_access => return Act::Lib,
            sysno::FACCESSAT2 => return Act::LibIf(Lookup::AccessNoWrite),
            _ => {}
        }
    }
    if nr == sysno::EXECVEAT {
        // The library execs the loader itself (by descriptor); Landlock confines
        // exec to the loader. From the program, execveat is served like execve.
        return Act::Lib;
    }
    match sysno::class(nr) {
        Class::Native => Act::Allow,
        Class::NativeIf(ArgCheck::Socket) if p.network && p.unix_datagrams => Act::Allow,
        Class::NativeIf(c) => Act::Check(c),
        Class::Library => Act::Lib,
        Class::Server | Class::Refused(_) => Act::Trap,
    }
}

#[derive(Debug, Clone, Copy)]
enum Ins {
    Ld(u32),
    /// Jump if equal / greater-or-equal / greater to one of two labels close ahead.
    J(u16, u32, usize, usize),
    Ja(usize),
    Ret(u32),
    Label(usize),
}

/// Return `inside` if the instruction pointer is in the library's range
/// `[LIB_LO, LIB_HI)`, else `outside`.
fn from_lib(a: &mut Asm, inside: u32, outside: u32) {
    let hi_ok = a.label();
    let lo_ok = a.label();
    let out = a.label();
    let inn = a.label();
    a.push(Ins::Ld(OFF_IP_HI));
    a.push(Ins::J(JMP_JEQ_K, (wire::LIB_LO >> 32) as u32, hi_ok, out));
    a.at(hi_ok);
    a.push(Ins::Ld(OFF_IP_LO));
    a.push(Ins::J(JMP_JGE_K, wire::LIB_LO as u32, lo_ok, out));
    a.at(lo_ok);
    a.push(Ins::J(JMP_JGE_K, wire::LIB_HI as u32, out, inn));
    a.at(inn);
    a.push(Ins::Ret(inside));
    a.at(out);
    a.push(Ins::Ret(outside));
}

struct Asm {
    ins: Vec<Ins>,
    labels: usize,
}

impl Asm {
    fn label(&mut self) -> usize {
        self.labels += 1;
        self.labels - 1
    }
    fn at(&mut self, l: usize) {
        self.ins.push(Ins::Label(l));
    }
    fn push(&mut self, i: Ins) {
        self.ins.push(i);
    }

    /// Resolve labels into offsets. Conditional jumps must reach within 255.
    fn assemble(self) -> Result<Vec<u8>, String> {
        let mut pos = vec![usize::MAX; self.labels];
        let mut n = 0;
        for i in &self.ins {
            match i {
                Ins::Label(l) => pos[*l] = n,
                _ => n += 1,
            }
        }
        let mut out = Vec::with_capacity(n * 8);
        let mut pc = 0usize;
        let mut emit = |code: u16, jt: u8, jf: u8, k: u32| {
            out.extend_from_slice(&code.to_le_bytes());
            out.push(jt);
            out.push(jf);
            out.extend_from_slice(&k.to_le_bytes());
        };
        for i in &self.ins {
            match *i {
                Ins::Label(_) => continue,
                Ins::Ld(off) => emit(LD_W_ABS, 0, 0, off),
                Ins::Ret(v) => emit(RET_K, 0, 0, v),
                Ins::Ja(l) => {
                    let d = pos[l].checked_sub(pc + 1).ok_or("backward jump")?;
                    emit(JMP_JA, 0, 0, d as u32);
                }
                Ins::J(code, k, t, f) => {
                    let dt = pos[t].checked_sub(pc + 1).ok_or("backward jump")?;
                    let df = pos[f].checked_sub(pc + 1).ok_or("backward jump")?;
                    if dt > 255 || df > 255 {
                        return Err(format!("conditional jump too far at {pc}"));
                    }
                    emit(code, dt as u8, df as u8, k);
                }
            }
            pc += 1;
        }
        if pc > 4096 {
            return Err(format!("{pc} instructions, over the kernel's 4096"));
        }
        Ok(out)
    }
}

/// Build the filter; returns the `struct sock_filter` array as bytes.
pub fn build(p: &FilterPolicy) -> Vec<u8> {
    build_checked(p).expect("the filter builder's own layout keeps every jump in range")
}

fn build_checked(p: &FilterPolicy) -> Result<Vec<u8>, String> {
    let mut a = Asm { ins: Vec::new(), labels: 0 };
    let allow = a.label();
    let trap = a.label();
    let lib = a.label();
    let kill = a.label();
    let arch_ok = a.label();
    let not_probe = a.label();
    let probe = a.label();
    let native_abi = a.label();
    let enosys = a.label();
    let check_labels: Vec<(ArgCheck, usize)> = [
        ArgCheck::Fd0Reserved,
        ArgCheck::Fd1Reserved,
        ArgCheck::CloseRange,
        ArgCheck::Ioctl,
        ArgCheck::Socket,
        ArgCheck::SigmaskArg(3),
        ArgCheck::SigmaskArg(4),
        ArgCheck::SigmaskArg(5),
        ArgCheck::SigprocMask,
        ArgCheck::SigAction,
        ArgCheck::PidZero,
        ArgCheck::CloneVm,
    ]
    .into_iter()
    .map(|c| (c, a.label()))
    .collect();
    let lookup_labels: Vec<(Lookup, usize)> =
        [Lookup::OpenReadOnly, Lookup::AccessNoWrite].into_iter().map(|c| (c, a.label())).collect();
    let send_to = a.label();
    let send_to_lib = a.label();
    let not_from_lib = a.label();
    let label_of = |act: Act| match act {
        Act::SendTo => send_to,
        Act::SendToLib => send_to_lib,
        Act::NotFromLib => not_from_lib,
        Act::Allow => allow,
        Act::Trap => trap,
        Act::Lib => lib,
        Act::Check(c) => check_labels.iter().find(|(k, _)| *k == c).map(|(_, l)| *l).unwrap_or(trap),
        Act::LibIf(c) => lookup_labels.iter().find(|(k, _)| *k == c).map(|(_, l)| *l).unwrap_or(trap),
    };

    a.push(Ins::Ld(OFF_ARCH));
    a.push(Ins::J(JMP_JEQ_K, AUDIT_ARCH_X86_64, arch_ok, kill));
    a.at(kill);
    a.push(Ins::Ret(RET_KILL_PROCESS));
    a.at(arch_ok);
    a.push(Ins::Ld(OFF_NR));
    a.push(Ins::J(JMP_JEQ_K, wire::PROBE_NR, probe, not_probe));
    a.at(probe);
    a.push(Ins::Ret(RET_ERRNO | wire::PROBE_ERRNO as u32));
    a.at(not_probe);
    a.push(Ins::J(JMP_JGE_K, 0x4000_0000, enosys, native_abi));
    a.at(enosys);
    a.push(Ins::Ret(RET_ERRNO | sysno::errno::ENOSYS as u32));
    a.at(native_abi);

    // Ranges of numbers with the same action, then a binary search over them.
    let mut ranges: Vec<(u32, Act)> = Vec::new();
    for nr in 0..=sysno::MAX_KNOWN {
        let act = if nr == sysno::MAX_KNOWN { Act::Trap } else { action(nr, p) };
        if ranges.last().map(|r| r.1) != Some(act) {
            ranges.push((nr, act));
        }
    }
    fn tree(a: &mut Asm, r: &[(u32, Act)], label_of: &dyn Fn(Act) -> usize) {
        if r.len() == 1 {
            a.push(Ins::Ja(label_of(r[0].1)));
            return;
        }
        let mid = r.len() / 2;
        let right = a.label();
        let go_right = a.label();
        let left = a.label();
        a.push(Ins::J(JMP_JGE_K, r[mid].0, go_right, left));
        a.at(go_right);
        a.push(Ins::Ja(right));
        a.at(left);
        tree(a, &r[..mid], label_of);
        a.at(right);
        tree(a, &r[mid..], label_of);
    }
    tree(&mut a, &ranges, &label_of);

    a.at(allow);
    a.push(Ins::Ret(RET_ALLOW));
    a.at(trap);
    a.push(Ins::Ret(RET_TRAP | wire::TRAP_DATA as u32));

    for (check, l) in &check_labels {
        a.at(*l);
        let ok = a.label();
        let to_lib = a.label();
        let no = a.label();
        let reserved_range = |a: &mut Asm, off: u32, ok: usize, to_lib: usize| {
            let in_lo = a.label();
            a.push(Ins::Ld(off));
            a.push(Ins::J(JMP_JGE_K, wire::RESERVED_LO as u32, in_lo, ok));
            a.at(in_lo);
            a.push(Ins::J(JMP_JGE_K, 1024, ok, to_lib));
        };
        let null_ptr = |a: &mut Asm, i: u8, ok: usize, not_null: usize| {
            let lo_zero = a.label();
            a.push(Ins::Ld(arg_lo(i)));
            a.push(Ins::J(JMP_JEQ_K, 0, lo_zero, not_null));
            a.at(lo_zero);
            a.push(Ins::Ld(arg_hi(i)));
            a.push(Ins::J(JMP_JEQ_K, 0, ok, not_null));
        };
        match *check {
            ArgCheck::Fd0Reserved => reserved_range(&mut a, arg_lo(0), ok, to_lib),
            ArgCheck::Fd1Reserved => reserved_range(&mut a, arg_lo(1), ok, to_lib),
            ArgCheck::Ioctl => {
                let not_sti = a.label();
                let not_linux = a.label();
                let refuse = a.label();
                a.push(Ins::Ld(arg_lo(1)));
                a.push(Ins::J(JMP_JEQ_K, TIOCSTI, refuse, not_sti));
                a.at(not_sti);
                a.push(Ins::J(JMP_JEQ_K, TIOCLINUX, refuse, not_linux));
                a.at(refuse);
                a.push(Ins::Ret(RET_ERRNO | sysno::errno::EPERM as u32));
                a.at(not_linux);
                reserved_range(&mut a, arg_lo(0), ok, to_lib);
            }
            ArgCheck::CloseRange => {
                let first_low = a.label();
                a.push(Ins::Ld(arg_lo(0)));
                a.push(Ins::J(JMP_JGT_K, 1023, ok, first_low));
                a.at(first_low);
                a.push(Ins::Ld(arg_lo(1)));
                a.push(Ins::J(JMP_JGE_K, wire::RESERVED_LO as u32, to_lib, ok));
            }
            ArgCheck::Socket => {
                // AF_UNIX (1): stream and seqpacket always; datagrams (SOCK_DGRAM 2,
                // and SOCK_RAW 3, which AF_UNIX makes a datagram socket) only if the
                // view allows them. Types with bit 1 or 3 set (0xa) are neither
                // stream (1) nor seqpacket (5); the flags above 0xf are ignored.
                let unix = a.label();
                a.push(Ins::Ld(arg_lo(0)));
                a.push(Ins::J(JMP_JEQ_K, 1, unix, if p.network { ok } else { no }));
                a.at(unix);
                if p.unix_datagrams {
                    a.push(Ins::Ja(ok));
                } else {
                    a.push(Ins::Ld(arg_lo(1)));
                    a.push(Ins::J(JMP_JSET_K, 0xa, no, ok));
                }
            }
            ArgCheck::SigmaskArg(i) => null_ptr(&mut a, i, ok, to_lib),
            ArgCheck::SigprocMask => {
                let set = a.label();
                null_ptr(&mut a, 1, ok, set);
                a.at(set);
                a.push(Ins::Ld(arg_lo(0)));
                a.push(Ins::J(JMP_JEQ_K, 1, ok, to_lib));
            }
            ArgCheck::SigAction => {
                // SIGSYS and SIGTRAP are the library's: even a query goes to it.
                let other = a.label();
                let not_trap = a.label();
                a.push(Ins::Ld(arg_lo(0)));
                a.push(Ins::J(JMP_JEQ_K, 31, to_lib, other));
                a.at(other);
                a.push(Ins::J(JMP_JEQ_K, 5, to_lib, not_trap));
                a.at(not_trap);
                null_ptr(&mut a, 1, ok, to_lib);
            }
            ArgCheck::CloneVm => {
                let vm = a.label();
                a.push(Ins::Ld(arg_lo(0)));
                a.push(Ins::J(JMP_JSET_K, CLONE_VM, vm, ok));
                a.at(vm);
                a.push(Ins::J(JMP_JSET_K, CLONE_THREAD, ok, to_lib));
            }
            ArgCheck::PidZero => {
                null_ptr(&mut a, 0, ok, no);
            }
        }
        a.at(ok);
        a.push(Ins::Ret(RET_ALLOW));
        a.at(no);
        a.push(Ins::Ret(RET_TRAP | wire::TRAP_DATA as u32));
        a.at(to_lib);
        a.push(Ins::Ja(lib));
    }
    for (check, l) in &lookup_labels {
        // The flags are an `int` (the kernel ignores the upper half); the library's
        // code range is checked after.
        let (arg, bits) = match check {
            Lookup::OpenReadOnly => (2, wire::NATIVE_OPEN_WRITE_BITS as u32),
            Lookup::AccessNoWrite => (2, wire::NATIVE_ACCESS_WRITE_BIT as u32),
        };
        let to_lib = a.label();
        let no = a.label();
        a.at(*l);
        a.push(Ins::Ld(arg_lo(arg)));
        a.push(Ins::J(JMP_JSET_K, bits, no, to_lib));
        a.at(no);
        a.push(Ins::Ret(RET_TRAP | wire::TRAP_DATA as u32));
        a.at(to_lib);
        a.push(Ins::Ja(lib));
    }
    // sendto: an address (a pointer in argument 4) is trapped; none is native (or,
    // if the policy refuses sendto, the library's only).
    for (l, to_lib) in [(send_to, false), (send_to_lib, true)] {
        let lo_zero = a.label();
        let none = a.label();
        let addressed = a.label();
        a.at(l);
        a.push(Ins::Ld(arg_lo(4)));
        a.push(Ins::J(JMP_JEQ_K, 0, lo_zero, addressed));
        a.at(lo_zero);
        a.push(Ins::Ld(arg_hi(4)));
        a.push(Ins::J(JMP_JEQ_K, 0, none, addressed));
        a.at(none);
        if to_lib {
            a.push(Ins::Ja(lib));
        } else {
            a.push(Ins::Ret(RET_ALLOW));
        }
        a.at(addressed);
        a.push(Ins::Ret(RET_TRAP | wire::TRAP_DATA as u32));
    }
    // sendmsg/sendmmsg under served sends: trapped, or killed from the library's code.
    a.at(not_from_lib);
    from_lib(&mut a, RET_KILL_PROCESS, RET_TRAP | wire::TRAP_DATA as u32);
    // From the library's own code: allowed; from anywhere else: trapped to it.
    a.at(lib);
    from_lib(&mut a, RET_ALLOW, RET_TRAP | wire::TRAP_DATA as u32);

    a.assemble()
}

/// A tiny classic-BPF interpreter for the tests: runs `prog` on a `seccomp_data`.
#[cfg(test)]
pub(crate) fn run(prog: &[u8], nr: u32, ip: u64, args: [u64; 6]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&AUDIT_ARCH_X86_64.to_le_bytes());
    data[8..16].copy_from_slice(&ip.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    let mut acc = 0u32;
    let mut pc = 0usize;
    loop {
        let i = &prog[pc * 8..pc * 8 + 8];
        let code = u16::from_le_bytes([i[0], i[1]]);
        let (jt, jf) = (i[2] as usize, i[3] as usize);
        let k = u32::from_le_bytes([i[4], i[5], i[6], i[7]]);
        pc += 1;
        match code {
            LD_W_ABS => acc = u32::from_le_bytes(data[k as usize..k as usize + 4].try_into().unwrap()),
            RET_K => return k,
            JMP_JA => pc += k as usize,
            JMP_JEQ_K => pc += if acc == k { jt } else { jf },
            JMP_JGE_K => pc += if acc >= k { jt } else { jf },
            JMP_JGT_K => pc += if acc > k { jt } else { jf },
            JMP_JSET_K => pc += if acc & k != 0 { jt } else { jf },
            _ => panic!("unknown instruction {code:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_unix_emul::sysno as nr;

    const LIB: u64 = wire::LIB_LO + 0x4000;
    const PROG: u64 = 0x5555_5555_0000;
    const TRAP: u32 = RET_TRAP | wire::TRAP_DATA as u32;

    #[test]
    fn every_number_gets_the_tables_answer() {
        let p = FilterPolicy {
            network: true,
            unix_datagrams: true,
            served_listings: false,
            served_fd_changes: false,
            native_lookups: false,
            native_write_access: false,
            served_sends: false,
            refused: vec![],
        };
        let f = build(&p);
        for n in 0..sysno::MAX_KNOWN + 20 {
            let got = run(&f, n, PROG, [0; 6]);
            let want = match sysno::class(n) {
                _ if n == nr::EXECVEAT => TRAP,
                Class::Native | Class::NativeIf(_) => RET_ALLOW,
                _ => TRAP,
            };
            // Argument checks with all-zero arguments are allowed (fd 0, null masks).
            assert_eq!(got, want, "syscall {n}");
        }
        assert_eq!(run(&f, 0x4000_0002, PROG, [0; 6]), RET_ERRNO | 38);
        assert_eq!(run(&f, wire::PROBE_NR, PROG, [0; 6]), RET_ERRNO | wire::PROBE_ERRNO as u32);
    }

    #[test]
    fn the_library_alone_gets_its_calls() {
        let f = build(&FilterPolicy::default());
        assert_eq!(run(&f, nr::RT_SIGSUSPEND, PROG, [1, 8, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::RT_SIGSUSPEND, LIB, [1, 8, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::RT_SIGSUSPEND, wire::LIB_HI, [1, 8, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::RT_SIGSUSPEND, wire::LIB_LO - 1, [1, 8, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::RT_SIGSUSPEND, LIB | (1 << 32), [1, 8, 0, 0, 0, 0]), TRAP);
        // Path calls and exec are never the library's to make, even from its code.
        assert_eq!(run(&f, nr::EXECVEAT, LIB, [0; 6]), RET_ALLOW);
        assert_eq!(run(&f, nr::EXECVEAT, PROG, [0; 6]), TRAP);
        for n in [nr::OPENAT, nr::EXECVE, nr::MOUNT, nr::PTRACE, nr::IO_URING_SETUP] {
            assert_eq!(run(&f, n, LIB, [0; 6]), TRAP, "{n}");
        }
    }

    #[test]
    fn argument_checks() {
        let f = build(&FilterPolicy::default());
        let r = wire::RESERVED_LO as u64;
        assert_eq!(run(&f, nr::CLOSE, PROG, [5, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::CLOSE, PROG, [r, 0, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::CLOSE, PROG, [1023, 0, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::CLOSE, LIB, [1023, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::CLOSE, PROG, [1024, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::DUP2, PROG, [1, 1021, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::DUP3, PROG, [1021, 5, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::CLOSE_RANGE, PROG, [3, u32::MAX as u64, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::CLOSE_RANGE, PROG, [3, 100, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::CLOSE_RANGE, PROG, [2000, 3000, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::IOCTL, PROG, [0, TIOCSTI as u64, 0, 0, 0, 0]), RET_ERRNO | 1);
        assert_eq!(run(&f, nr::IOCTL, LIB, [0, TIOCSTI as u64, 0, 0, 0, 0]), RET_ERRNO | 1);
        assert_eq!(run(&f, nr::IOCTL, PROG, [0, 0x5401, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::SOCKET, PROG, [2, 1, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::SOCKET, LIB, [2, 1, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::SOCKET, PROG, [1, 1, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::RT_SIGPROCMASK, PROG, [0, 0x1000, 0, 8, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::RT_SIGPROCMASK, PROG, [1, 0x1000, 0, 8, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::RT_SIGPROCMASK, PROG, [0, 0, 0x1000, 8, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::RT_SIGPROCMASK, PROG, [2, 1 << 32, 0, 8, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::RT_SIGACTION, PROG, [2, 0, 0x1000, 8, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::RT_SIGACTION, PROG, [2, 0x1000, 0, 8, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::RT_SIGACTION, PROG, [31, 0, 0x1000, 8, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::RT_SIGACTION, PROG, [5, 0, 0x1000, 8, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::RT_SIGACTION, LIB, [5, 0x1000, 0, 8, 0, 0]), RET_ALLOW);
        // clone: threads and fork-like children are native; a child sharing the
        // memory but not a thread (vfork-like) goes to the library.
        let (vm, thread, vfork) = (0x100u64, 0x10000u64, 0x4000u64);
        assert_eq!(run(&f, nr::CLONE, PROG, [0x11, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::CLONE, PROG, [vm | thread | 0xf00, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::CLONE, PROG, [vm | vfork | 0x11, 0, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::CLONE, LIB, [vm | vfork | 0x11, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::CLONE3, PROG, [0x1000, 88, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::CLONE3, LIB, [0x1000, 88, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::VFORK, PROG, [0; 6]), TRAP);
        assert_eq!(run(&f, nr::GETPID, PROG, [0; 6]), TRAP);
        assert_eq!(run(&f, nr::GETPID, LIB, [0; 6]), RET_ALLOW);
        assert_eq!(run(&f, nr::PPOLL, PROG, [0, 0, 0, 0x1000, 8, 0]), TRAP);
        assert_eq!(run(&f, nr::PPOLL, PROG, [0, 0, 0, 0, 8, 0]), RET_ALLOW);
        assert_eq!(run(&f, nr::PRLIMIT64, PROG, [77, 7, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&f, nr::PRLIMIT64, LIB, [77, 7, 0, 0, 0, 0]), TRAP);
    }

    #[test]
    fn unix_datagram_sockets_only_where_the_view_is_the_hosts() {
        const NONBLOCK_CLOEXEC: u64 = 0o4000 | 0o2000000;
        for network in [false, true] {
            let confined = build(&FilterPolicy {
                network,
                unix_datagrams: false,
                served_listings: false,
                served_fd_changes: false,
                native_lookups: false,
                native_write_access: false,
                served_sends: false,
                refused: vec![],
            });
            let open = build(&FilterPolicy {
                network,
                unix_datagrams: true,
                served_listings: false,
                served_fd_changes: false,
                native_lookups: false,
                native_write_access: false,
                served_sends: false,
                refused: vec![],
            });
            for n in [nr::SOCKET, nr::SOCKETPAIR] {
                for (ty, datagram) in [(1u64, false), (5, false), (2, true), (3, true), (10, true), (0xf, true)] {
                    for t in [ty, ty | NONBLOCK_CLOEXEC] {
                        let want = if datagram { TRAP } else { RET_ALLOW };
                        assert_eq!(run(&confined, n, PROG, [1, t, 0, 0, 0, 0]), want, "{n} type {t:#x}");
                        // From the library's code too: the library makes none itself.
                        assert_eq!(run(&confined, n, LIB, [1, t, 0, 0, 0, 0]), want, "{n} type {t:#x}");
                        assert_eq!(run(&open, n, PROG, [1, t, 0, 0, 0, 0]), RET_ALLOW, "{n} type {t:#x}");
                    }
                }
                // Other families: as the network says, datagrams or not.
                let inet = if network { RET_ALLOW } else { TRAP };
                assert_eq!(run(&confined, n, PROG, [2, 2, 0, 0, 0, 0]), inet);
                assert_eq!(run(&open, n, PROG, [2, 2, 0, 0, 0, 0]), inet);
            }
        }
    }

    #[test]
    fn addressed_sends_are_served_where_the_view_confines_paths() {
        let native = build(&FilterPolicy::default());
        let served = build(&FilterPolicy { served_sends: true, unix_datagrams: true, ..FilterPolicy::default() });
        let refusing = build(&FilterPolicy {
            served_sends: true,
            unix_datagrams: true,
            refused: vec![nr::SENDTO, nr::SENDMSG],
            ..FilterPolicy::default()
        });
        let addr = [3, 0x1000, 10, 0, 0x2000, 110];
        let none = [3, 0x1000, 10, 0, 0, 0];
        let high = [3, 0x1000, 10, 0, 1 << 32, 110];
        // Where the view is the host's, the kernel's resolution is the view's.
        for n in [nr::SENDTO, nr::SENDMSG, nr::SENDMMSG] {
            assert_eq!(run(&native, n, PROG, addr), RET_ALLOW, "{n}");
        }
        // sendto: an address is trapped from anywhere, the library's code included.
        assert_eq!(run(&served, nr::SENDTO, PROG, none), RET_ALLOW);
        assert_eq!(run(&served, nr::SENDTO, LIB, none), RET_ALLOW);
        for args in [addr, high] {
            assert_eq!(run(&served, nr::SENDTO, PROG, args), TRAP);
            assert_eq!(run(&served, nr::SENDTO, LIB, args), TRAP);
            assert_eq!(run(&refusing, nr::SENDTO, LIB, args), TRAP);
        }
        // Refused to the program: the library still reaches the server, without an address.
        assert_eq!(run(&refusing, nr::SENDTO, PROG, none), TRAP);
        assert_eq!(run(&refusing, nr::SENDTO, LIB, none), RET_ALLOW);
        // sendmsg, sendmmsg: trapped from the program, fatal from the library's code.
        for f in [&served, &refusing] {
            for n in [nr::SENDMSG, nr::SENDMMSG] {
                assert_eq!(run(f, n, PROG, none), TRAP, "{n}");
                assert_eq!(run(f, n, LIB, none), RET_KILL_PROCESS, "{n}");
                assert_eq!(run(f, n, wire::LIB_HI, none), TRAP, "{n}");
                assert_eq!(run(f, n, LIB | (1 << 32), none), TRAP, "{n}");
            }
        }
        // Datagram sockets are back.
        assert_eq!(run(&served, nr::SOCKET, PROG, [1, 2, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&served, 47, PROG, none), RET_ALLOW);
    }

    #[test]
    fn descriptor_changes_are_served_only_where_something_is_read_only() {
        let plain = build(&FilterPolicy::default());
        let read_only = build(&FilterPolicy { served_fd_changes: true, ..FilterPolicy::default() });
        for n in [nr::FCHMOD, nr::FCHOWN, nr::FSETXATTR, nr::FREMOVEXATTR] {
            assert_eq!(run(&plain, n, PROG, [3, 0o600, 0, 0, 0, 0]), RET_ALLOW, "{n}");
            assert_eq!(run(&read_only, n, PROG, [3, 0o600, 0, 0, 0, 0]), TRAP, "{n}");
            // Not from the library's code either: a program jumping there gains nothing.
            assert_eq!(run(&read_only, n, LIB, [3, 0o600, 0, 0, 0, 0]), TRAP, "{n}");
        }
    }

    #[test]
    fn listings_are_served_only_where_something_is_hidden() {
        let plain = build(&FilterPolicy::default());
        let hiding = build(&FilterPolicy { served_listings: true, ..FilterPolicy::default() });
        for n in [nr::GETDENTS, nr::GETDENTS64] {
            assert_eq!(run(&plain, n, PROG, [3, 0x1000, 4096, 0, 0, 0]), RET_ALLOW, "{n}");
            assert_eq!(run(&hiding, n, PROG, [3, 0x1000, 4096, 0, 0, 0]), TRAP, "{n}");
            // Not even the library's code lists a directory by itself.
            assert_eq!(run(&hiding, n, LIB, [3, 0x1000, 4096, 0, 0, 0]), TRAP, "{n}");
        }
        assert_eq!(run(&hiding, nr::READ, PROG, [3, 0x1000, 4096, 0, 0, 0]), RET_ALLOW);
    }

    #[test]
    fn native_lookups_only_from_the_library_and_only_read_only() {
        let plain = build(&FilterPolicy::default());
        let native = build(&FilterPolicy { native_lookups: true, ..FilterPolicy::default() });
        const O_WRONLY: u64 = 1;
        const O_RDWR: u64 = 2;
        const O_CREAT: u64 = 0o100;
        const O_TRUNC: u64 = 0o1000;
        const O_TMPFILE: u64 = 0o20200000;
        const O_CLOEXEC_PATH_DIR_NOFOLLOW: u64 = 0o2000000 | 0o10000000 | 0o200000 | 0o400000;
        for fl in [0, O_CLOEXEC_PATH_DIR_NOFOLLOW, 0o4000 | 0o2000, 0xffff_ffff_0000_0000] {
            assert_eq!(run(&native, nr::OPENAT, LIB, [u64::MAX - 99, 0x1000, fl, 0, 0, 0]), RET_ALLOW, "{fl:#o}");
            assert_eq!(run(&native, nr::OPENAT, PROG, [u64::MAX - 99, 0x1000, fl, 0, 0, 0]), TRAP, "{fl:#o}");
            assert_eq!(run(&plain, nr::OPENAT, LIB, [u64::MAX - 99, 0x1000, fl, 0, 0, 0]), TRAP, "{fl:#o}");
        }
        for fl in [O_WRONLY, O_RDWR, 3, O_CREAT, O_TRUNC, O_TMPFILE, O_WRONLY | O_CREAT | O_TRUNC, O_TRUNC | 0o2000000]
        {
            assert_eq!(run(&native, nr::OPENAT, LIB, [3, 0x1000, fl, 0o644, 0, 0]), TRAP, "{fl:#o}");
        }
        for n in [nr::NEWFSTATAT, nr::STATX, nr::READLINKAT, nr::GETCWD] {
            assert_eq!(run(&native, n, LIB, [3, 0x1000, 0x2000, 0x100, 0, 0]), RET_ALLOW, "{n}");
            assert_eq!(run(&native, n, PROG, [3, 0x1000, 0x2000, 0x100, 0, 0]), TRAP, "{n}");
            assert_eq!(run(&native, n, wire::LIB_HI, [3, 0x1000, 0x2000, 0x100, 0, 0]), TRAP, "{n}");
            assert_eq!(run(&plain, n, LIB, [3, 0x1000, 0x2000, 0x100, 0, 0]), TRAP, "{n}");
        }
        for (mode, want) in [(0u64, RET_ALLOW), (1, RET_ALLOW), (4, RET_ALLOW), (2, TRAP), (7, TRAP)] {
            assert_eq!(run(&native, nr::FACCESSAT2, LIB, [3, 0x1000, mode, 0x200, 0, 0]), want, "{mode}");
            assert_eq!(run(&native, nr::FACCESSAT2, PROG, [3, 0x1000, mode, 0x200, 0, 0]), TRAP, "{mode}");
        }
        // Where nothing is read-only, W_OK too (the kernel's answer is the server's).
        let writable =
            build(&FilterPolicy { native_lookups: true, native_write_access: true, ..FilterPolicy::default() });
        for mode in [0u64, 2, 7] {
            assert_eq!(run(&writable, nr::FACCESSAT2, LIB, [3, 0x1000, mode, 0x200, 0, 0]), RET_ALLOW, "{mode}");
            assert_eq!(run(&writable, nr::FACCESSAT2, PROG, [3, 0x1000, mode, 0x200, 0, 0]), TRAP, "{mode}");
        }
        assert_eq!(run(&writable, nr::OPENAT, LIB, [3, 0x1000, 1, 0o644, 0, 0]), TRAP, "writes stay served");
        // Everything else that names a path stays trapped, from the library too.
        for n in [nr::OPENAT2, nr::OPEN, nr::STAT, nr::ACCESS, nr::FACCESSAT, nr::UNLINKAT, nr::MKDIRAT, nr::EXECVE] {
            assert_eq!(run(&native, n, LIB, [3, 0x1000, 0, 0, 0, 0]), TRAP, "{n}");
        }
        // A refusal wins.
        let refusing =
            build(&FilterPolicy { native_lookups: true, refused: vec![nr::OPENAT], ..FilterPolicy::default() });
        assert_eq!(run(&refusing, nr::OPENAT, LIB, [3, 0x1000, 0, 0, 0, 0]), TRAP);
        assert_eq!(run(&refusing, nr::NEWFSTATAT, LIB, [3, 0x1000, 0x2000, 0, 0, 0]), RET_ALLOW);
    }

    #[test]
    fn policy_refusals_trap_and_the_network_opens() {
        let f = build(&FilterPolicy {
            network: true,
            unix_datagrams: true,
            served_listings: false,
            served_fd_changes: false,
            native_lookups: false,
            native_write_access: false,
            served_sends: false,
            refused: vec![nr::GETPID, nr::OPENAT],
        });
        assert_eq!(run(&f, nr::GETPID, PROG, [0; 6]), TRAP);
        assert_eq!(run(&f, nr::GETPID, LIB, [0; 6]), RET_ALLOW);
        assert_eq!(run(&f, nr::OPENAT, LIB, [0; 6]), TRAP);
        assert_eq!(run(&f, nr::SOCKET, PROG, [2, 1, 0, 0, 0, 0]), RET_ALLOW);
    }
}
