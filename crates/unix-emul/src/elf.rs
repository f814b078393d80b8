//! The few ELF64 fields a loader needs, read from untrusted bytes (a program file is
//! whatever the view holds). Shared by the loader (maps the program) and the server
//! (finds the interpreter). Pure: no system calls.

/// `ET_EXEC`: mapped at the addresses it names.
pub const ET_EXEC: u16 = 2;
/// `ET_DYN`: position-independent, mapped anywhere.
pub const ET_DYN: u16 = 3;
/// A loadable segment.
pub const PT_LOAD: u32 = 1;
/// The interpreter's path.
pub const PT_INTERP: u32 = 3;
/// Where the program headers are in memory.
pub const PT_PHDR: u32 = 6;
/// Size of the file header.
pub const EHDR_SIZE: usize = 64;
/// Size of one program header.
pub const PHDR_SIZE: usize = 56;
/// Most program headers accepted (the kernel's limit is 64 KiB of them; real
/// programs have about a dozen).
pub const MAX_PHNUM: usize = 64;

/// Why a file is not a program this loader maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfError {
    /// Not an ELF file (the server then looks for `#!`).
    NotElf,
    /// ELF, but not 64-bit little-endian x86_64 `ET_EXEC`/`ET_DYN`.
    Unsupported,
    /// Program headers of an unexpected size, too many, or outside the file.
    BadPhdrs,
    /// A segment with sizes that overflow or make no sense.
    BadSegment,
}

/// The file header's fields that matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ehdr {
    /// `ET_EXEC` or `ET_DYN`.
    pub kind: u16,
    /// Entry point (before relocation for `ET_DYN`).
    pub entry: u64,
    /// Offset of the program headers in the file.
    pub phoff: u64,
    /// Number of program headers.
    pub phnum: usize,
}

/// One program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Phdr {
    /// Type.
    pub kind: u32,
    /// `PF_X` 1, `PF_W` 2, `PF_R` 4.
    pub flags: u32,
    /// Offset in the file.
    pub offset: u64,
    /// Address in memory (before relocation).
    pub vaddr: u64,
    /// Bytes in the file.
    pub filesz: u64,
    /// Bytes in memory.
    pub memsz: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Check a file header.
pub fn parse_ehdr(b: &[u8]) -> Result<Ehdr, ElfError> {
    if b.len() < EHDR_SIZE || b[..4] != *b"\x7fELF" {
        return Err(ElfError::NotElf);
    }
    // 64-bit, little-endian, version 1, x86_64.
    if b[4] != 2 || b[5] != 1 || b[6] != 1 || u16_at(b, 18) != 62 {
        return Err(ElfError::Unsupported);
    }
    let kind = u16_at(b, 16);
    if kind != ET_EXEC && kind != ET_DYN {
        return Err(ElfError::Unsupported);
    }
    let phentsize = u16_at(b, 54) as usize;
    let phnum = u16_at(b, 56) as usize;
    if phentsize != PHDR_SIZE || phnum == 0 || phnum > MAX_PHNUM {
        return Err(ElfError::BadPhdrs);
    }
    let phoff = u64_at(b, 32);
    if phoff.checked_add((phnum * PHDR_SIZE) as u64).is_none() {
        return Err(ElfError::BadPhdrs);
    }
    Ok(Ehdr { kind, entry: u64_at(b, 24), phoff, phnum })
}

/// Read program header `i` of `table` (the `phnum * PHDR_SIZE` bytes at `phoff`).
pub fn phdr(table: &[u8], i: usize) -> Result<Phdr, ElfError> {
    let at = i.checked_mul(PHDR_SIZE).ok_or(ElfError::BadPhdrs)?;
    let b = table.get(at..at + PHDR_SIZE).ok_or(ElfError::BadPhdrs)?;
    let p = Phdr {
        kind: u32_at(b, 0),
        flags: u32_at(b, 4),
        offset: u64_at(b, 8),
        vaddr: u64_at(b, 16),
        filesz: u64_at(b, 32),
        memsz: u64_at(b, 40),
    };
    if p.kind == PT_LOAD {
        let page = 4096u64;
        if p.filesz > p.memsz
            || p.vaddr.checked_add(p.memsz).is_none()
            || p.offset.checked_add(p.filesz).is_none()
            || p.vaddr % page != p.offset % page
            || p.vaddr.checked_add(p.memsz).map_or(true, |end| end > 0x7fff_ffff_f000)
        {
            return Err(ElfError::BadSegment);
        }
    }
    Ok(p)
}

/// The lowest and highest addresses (page-rounded) the `PT_LOAD` segments occupy.
pub fn load_span(table: &[u8], phnum: usize) -> Result<(u64, u64), ElfError> {
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    for i in 0..phnum {
        let p = phdr(table, i)?;
        if p.kind == PT_LOAD && p.memsz > 0 {
            lo = lo.min(p.vaddr & !0xfff);
            hi = hi.max((p.vaddr + p.memsz + 0xfff) & !0xfff);
        }
    }
    if lo >= hi {
        return Err(ElfError::BadSegment);
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u16, phnum: u16) -> [u8; 64] {
        let mut h = [0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[6] = 1;
        h[16..18].copy_from_slice(&kind.to_le_bytes());
        h[18..20].copy_from_slice(&62u16.to_le_bytes());
        h[24..32].copy_from_slice(&0x1040u64.to_le_bytes());
        h[32..40].copy_from_slice(&64u64.to_le_bytes());
        h[54..56].copy_from_slice(&56u16.to_le_bytes());
        h[56..58].copy_from_slice(&phnum.to_le_bytes());
        h
    }

    #[test]
    fn headers_are_checked() {
        assert_eq!(parse_ehdr(&header(ET_DYN, 3)).unwrap().phnum, 3);
        assert_eq!(parse_ehdr(b"#!/bin/sh\n"), Err(ElfError::NotElf));
        assert_eq!(parse_ehdr(&header(1, 3)), Err(ElfError::Unsupported));
        assert_eq!(parse_ehdr(&header(ET_EXEC, 0)), Err(ElfError::BadPhdrs));
        assert_eq!(parse_ehdr(&header(ET_EXEC, 65)), Err(ElfError::BadPhdrs));
    }

    #[test]
    fn segments_are_checked() {
        let mut t = [0u8; 56];
        t[0..4].copy_from_slice(&PT_LOAD.to_le_bytes());
        t[8..16].copy_from_slice(&0x1000u64.to_le_bytes());
        t[16..24].copy_from_slice(&0x401000u64.to_le_bytes());
        t[32..40].copy_from_slice(&0x100u64.to_le_bytes());
        t[40..48].copy_from_slice(&0x2000u64.to_le_bytes());
        assert_eq!(load_span(&t, 1), Ok((0x401000, 0x403000)));
        let mut bad = t;
        bad[32..40].copy_from_slice(&0x3000u64.to_le_bytes());
        assert_eq!(phdr(&bad, 0), Err(ElfError::BadSegment));
        let mut wild = t;
        wild[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(phdr(&wild, 0), Err(ElfError::BadSegment));
        assert_eq!(phdr(&t, 1), Err(ElfError::BadPhdrs));
    }
}
