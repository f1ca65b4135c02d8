//! ioctl request-number encoding: `_IOC`, `_IO`, `_IOR`, `_IOW`, `_IOWR` as `const fn`s.
//!
//! Mirrors `<asm-generic/ioctl.h>` and the architecture overrides in
//! `arch/{powerpc,mips,sparc}/include/uapi/asm/ioctl.h`.
//!
//! A request number is 32 bits: `nr` (8 bits) | `type` (8 bits) | `size` | `dir`.
//!
//! | layout | size bits | dir bits | NONE | WRITE | READ | architectures |
//! |---|---|---|---|---|---|---|
//! | generic | 14 | 2 | 0 | 1 | 2 | x86, x86_64, arm, aarch64, riscv, loongarch, s390x, m68k, csky, hexagon |
//! | three-bit dir | 13 | 3 | 1 | 4 | 2 | powerpc, powerpc64, mips*, sparc, sparc64 (and alpha) |
//!
//! On the three-bit layouts `_IO()` numbers carry the NONE bit (`0x2000_0000`), so e.g.
//! `BLKFLSBUF` is `0x1261` on x86_64 but `0x2000_1261` on powerpc. Opcodes that embed a
//! `size_t` (`BLKGETSIZE64`) also differ between 32- and 64-bit ABIs. That is why every
//! opcode in this crate is computed with these functions rather than written as a literal.
//!
//! sparc encodes exactly like powerpc; it only *decodes* differently for sizes of 8 KiB and
//! more (its size field overlaps the NONE bit). [`ioc`] accepts only sizes that fit in
//! [`IOC_SIZEBITS`], which covers every structure used here.

/// One bit layout of the ioctl number, as selected by `arch/*/include/uapi/asm/ioctl.h`.
///
/// [`IocLayout::NATIVE`] is the layout of the architecture this crate is compiled for; the
/// other constants exist so the encoding can be unit-tested for every layout on any host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IocLayout {
    /// `_IOC_SIZEBITS`: width of the argument-size field.
    pub size_bits: u32,
    /// `_IOC_DIRBITS`: width of the direction field.
    pub dir_bits: u32,
    /// `_IOC_NONE`: direction value of `_IO()` (no argument transfer).
    pub none: u32,
    /// `_IOC_READ`: the kernel writes to user memory (`_IOR`).
    pub read: u32,
    /// `_IOC_WRITE`: the kernel reads from user memory (`_IOW`).
    pub write: u32,
}

impl IocLayout {
    /// `<asm-generic/ioctl.h>`: 14 size bits, 2 dir bits, NONE = 0, WRITE = 1, READ = 2.
    pub const GENERIC: Self = Self {
        size_bits: 14,
        dir_bits: 2,
        none: 0,
        read: 2,
        write: 1,
    };

    /// `arch/powerpc/include/uapi/asm/ioctl.h` (identical for mips and, for encoding, sparc):
    /// 13 size bits, 3 dir bits, NONE = 1, READ = 2, WRITE = 4.
    pub const THREE_BIT_DIR: Self = Self {
        size_bits: 13,
        dir_bits: 3,
        none: 1,
        read: 2,
        write: 4,
    };

    /// The layout of the target architecture: powerpc, mips and sparc use three direction
    /// bits, every other Linux architecture the generic two.
    pub const NATIVE: Self = if cfg!(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "mips32r6",
        target_arch = "mips64r6",
        target_arch = "sparc",
        target_arch = "sparc64",
    )) {
        Self::THREE_BIT_DIR
    } else {
        Self::GENERIC
    };

    /// `_IOC_SIZESHIFT` for this layout.
    pub const fn size_shift(&self) -> u32 {
        IOC_TYPESHIFT + IOC_TYPEBITS
    }

    /// `_IOC_DIRSHIFT` for this layout.
    pub const fn dir_shift(&self) -> u32 {
        self.size_shift() + self.size_bits
    }

    /// `_IOC(dir, type, nr, size)` in this layout.
    ///
    /// Panics (a compile error when evaluated in a `const`) if `dir`, `ty`, `nr` or `size`
    /// does not fit its field.
    pub const fn ioc(&self, dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
        assert!(dir < (1 << self.dir_bits), "ioctl dir does not fit");
        assert!(ty <= IOC_TYPEMASK, "ioctl type does not fit in 8 bits");
        assert!(nr <= IOC_NRMASK, "ioctl nr does not fit in 8 bits");
        assert!(size < (1 << self.size_bits), "ioctl size does not fit");
        // `size` is checked above to be below 2^14, so the cast is lossless.
        (dir << self.dir_shift())
            | (ty << IOC_TYPESHIFT)
            | (nr << IOC_NRSHIFT)
            | ((size as u32) << self.size_shift())
    }

    /// `_IO(type, nr)` in this layout.
    pub const fn io(&self, ty: u32, nr: u32) -> u32 {
        self.ioc(self.none, ty, nr, 0)
    }

    /// `_IOR(type, nr, T)` in this layout, with `size = sizeof(T)`.
    pub const fn ior(&self, ty: u32, nr: u32, size: usize) -> u32 {
        self.ioc(self.read, ty, nr, size)
    }

    /// `_IOW(type, nr, T)` in this layout, with `size = sizeof(T)`.
    pub const fn iow(&self, ty: u32, nr: u32, size: usize) -> u32 {
        self.ioc(self.write, ty, nr, size)
    }

    /// `_IOWR(type, nr, T)` in this layout, with `size = sizeof(T)`.
    pub const fn iowr(&self, ty: u32, nr: u32, size: usize) -> u32 {
        self.ioc(self.read | self.write, ty, nr, size)
    }

    /// `_IOC_DIR(nr)`: the direction field.
    pub const fn decode_dir(&self, request: u32) -> u32 {
        (request >> self.dir_shift()) & ((1 << self.dir_bits) - 1)
    }

    /// `_IOC_SIZE(nr)`: the size field.
    pub const fn decode_size(&self, request: u32) -> u32 {
        (request >> self.size_shift()) & ((1 << self.size_bits) - 1)
    }
}

/// `_IOC_NRBITS`: width of the command-number field (all architectures).
pub const IOC_NRBITS: u32 = 8;
/// `_IOC_TYPEBITS`: width of the type ("magic") field (all architectures).
pub const IOC_TYPEBITS: u32 = 8;
/// `_IOC_SIZEBITS` of the target architecture.
pub const IOC_SIZEBITS: u32 = IocLayout::NATIVE.size_bits;
/// `_IOC_DIRBITS` of the target architecture.
pub const IOC_DIRBITS: u32 = IocLayout::NATIVE.dir_bits;

/// `_IOC_NRMASK`.
pub const IOC_NRMASK: u32 = (1 << IOC_NRBITS) - 1;
/// `_IOC_TYPEMASK`.
pub const IOC_TYPEMASK: u32 = (1 << IOC_TYPEBITS) - 1;
/// `_IOC_SIZEMASK` of the target architecture.
pub const IOC_SIZEMASK: u32 = (1 << IOC_SIZEBITS) - 1;
/// `_IOC_DIRMASK` of the target architecture.
pub const IOC_DIRMASK: u32 = (1 << IOC_DIRBITS) - 1;

/// `_IOC_NRSHIFT`.
pub const IOC_NRSHIFT: u32 = 0;
/// `_IOC_TYPESHIFT`.
pub const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
/// `_IOC_SIZESHIFT`.
pub const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
/// `_IOC_DIRSHIFT` of the target architecture.
pub const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;

/// `_IOC_NONE` of the target architecture (0 generic, 1 on powerpc/mips/sparc).
pub const IOC_NONE: u32 = IocLayout::NATIVE.none;
/// `_IOC_READ` of the target architecture (2 everywhere).
pub const IOC_READ: u32 = IocLayout::NATIVE.read;
/// `_IOC_WRITE` of the target architecture (1 generic, 4 on powerpc/mips/sparc).
pub const IOC_WRITE: u32 = IocLayout::NATIVE.write;

/// `_IOC(dir, type, nr, size)` for the target architecture.
pub const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    IocLayout::NATIVE.ioc(dir, ty, nr, size)
}

/// `_IO(type, nr)` for the target architecture: no argument transfer.
pub const fn io(ty: u32, nr: u32) -> u32 {
    IocLayout::NATIVE.io(ty, nr)
}

/// `_IOR(type, nr, T)` for the target architecture; pass `size_of::<T>()`.
pub const fn ior(ty: u32, nr: u32, size: usize) -> u32 {
    IocLayout::NATIVE.ior(ty, nr, size)
}

/// `_IOW(type, nr, T)` for the target architecture; pass `size_of::<T>()`.
pub const fn iow(ty: u32, nr: u32, size: usize) -> u32 {
    IocLayout::NATIVE.iow(ty, nr, size)
}

/// `_IOWR(type, nr, T)` for the target architecture; pass `size_of::<T>()`.
pub const fn iowr(ty: u32, nr: u32, size: usize) -> u32 {
    IocLayout::NATIVE.iowr(ty, nr, size)
}

/// `_IOC_DIR(nr)` for the target architecture.
pub const fn ioc_dir(request: u32) -> u32 {
    IocLayout::NATIVE.decode_dir(request)
}

/// `_IOC_TYPE(nr)`.
pub const fn ioc_type(request: u32) -> u32 {
    (request >> IOC_TYPESHIFT) & IOC_TYPEMASK
}

/// `_IOC_NR(nr)`.
pub const fn ioc_nr(request: u32) -> u32 {
    (request >> IOC_NRSHIFT) & IOC_NRMASK
}

/// `_IOC_SIZE(nr)` for the target architecture.
pub const fn ioc_size(request: u32) -> u32 {
    IocLayout::NATIVE.decode_size(request)
}

const _: () = assert!(IOC_SIZESHIFT == 16);
const _: () = assert!(IOC_DIRSHIFT + IOC_DIRBITS == 32);
const _: () = assert!(IocLayout::GENERIC.dir_shift() == 30);
const _: () = assert!(IocLayout::THREE_BIT_DIR.dir_shift() == 29);

#[cfg(test)]
mod tests {
    use super::*;

    const G: IocLayout = IocLayout::GENERIC;
    const P: IocLayout = IocLayout::THREE_BIT_DIR;

    #[test]
    fn generic_layout_matches_x86_64_header_values() {
        // Values from <linux/fs.h> and <linux/dm-ioctl.h> on x86_64.
        assert_eq!(G.io(0x12, 97), 0x1261); // BLKFLSBUF
        assert_eq!(G.io(0x12, 104), 0x1268); // BLKSSZGET
        assert_eq!(G.ior(0x12, 114, 8), 0x8008_1272); // BLKGETSIZE64, 64-bit size_t
        assert_eq!(G.ior(0x12, 114, 4), 0x8004_1272); // BLKGETSIZE64, 32-bit size_t
        assert_eq!(G.iowr(0xfd, 0, 312), 0xC138_FD00); // DM_VERSION
        assert_eq!(G.iowr(0xfd, 0x11, 312), 0xC138_FD11); // DM_GET_TARGET_VERSION
        assert_eq!(G.iow(0x94, 9, 4), 0x4004_9409); // FICLONE
    }

    #[test]
    fn three_bit_layout_matches_powerpc_header_values() {
        // Values from linux-raw-sys' powerpc/powerpc64/mips bindings of the same headers.
        assert_eq!(P.io(0x12, 97), 0x2000_1261); // BLKFLSBUF
        assert_eq!(P.io(0x12, 96), 536_875_616); // BLKGETSIZE
        assert_eq!(P.ior(0x12, 114, 8), 1_074_270_834); // BLKGETSIZE64 on ppc64
        assert_eq!(P.ior(0x12, 114, 4), 1_074_008_690); // BLKGETSIZE64 on ppc32
        assert_eq!(P.iowr(0xfd, 0, 312), 0xC138_FD00); // DM_VERSION: READ|WRITE = 6 << 29
        assert_eq!(P.iow(0x94, 9, 4), 0x8004_9409); // FICLONE
    }

    #[test]
    fn decode_round_trips() {
        for layout in [G, P] {
            for (dir, size) in [
                (layout.none, 0),
                (layout.read, 8),
                (layout.write, 4),
                (layout.read | layout.write, 312),
                (layout.read, (1 << layout.size_bits) - 1),
            ] {
                let req = layout.ioc(dir, 0xfd, 0x42, size);
                assert_eq!(layout.decode_dir(req), dir, "{layout:?} {req:#x}");
                assert_eq!(
                    layout.decode_size(req) as usize,
                    size,
                    "{layout:?} {req:#x}"
                );
                assert_eq!(ioc_type(req), 0xfd);
                assert_eq!(ioc_nr(req), 0x42);
            }
        }
    }

    #[test]
    fn native_wrappers_use_native_layout() {
        let n = IocLayout::NATIVE;
        assert_eq!(io(1, 2), n.io(1, 2));
        assert_eq!(ior(1, 2, 8), n.ior(1, 2, 8));
        assert_eq!(iow(1, 2, 8), n.iow(1, 2, 8));
        assert_eq!(iowr(1, 2, 8), n.iowr(1, 2, 8));
        assert_eq!(ioc(IOC_READ, 1, 2, 8), n.ior(1, 2, 8));
        assert_eq!(ioc_dir(iowr(1, 2, 8)), IOC_READ | IOC_WRITE);
        assert_eq!(ioc_size(iowr(1, 2, 312)), 312);
    }

    #[test]
    #[should_panic(expected = "ioctl size does not fit")]
    fn oversized_argument_is_rejected() {
        let size = 1usize << G.size_bits;
        let _ = G.ior(0x12, 1, std::hint::black_box(size));
    }

    #[test]
    #[should_panic(expected = "ioctl nr does not fit")]
    fn oversized_nr_is_rejected() {
        let _ = G.io(0x12, std::hint::black_box(0x100));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn native_is_generic_on_x86_64() {
        assert_eq!(IocLayout::NATIVE, IocLayout::GENERIC);
        assert_eq!((IOC_NONE, IOC_WRITE, IOC_READ), (0, 1, 2));
        assert_eq!(IOC_DIRSHIFT, 30);
    }
}
