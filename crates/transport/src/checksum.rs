//! Copying bytes and checksumming them (crc32c) in one pass over memory.
//!
//! A co-located read copies an object out of a node's segment it has
//! mapped (`ucx/cross_memory.rs`) and must checksum it. Done one after the
//! other, a 1 MiB read from DRAM ran at 14 to 15.7 GB/s here (crc32c reads
//! DRAM more slowly than memcpy does: 14.7 against 23 to 25 GB/s); fused,
//! with three independent crc streams (the instruction's latency is three
//! times its throughput) and the lanes prefetched ahead, 17.7 GB/s.

/// Copies `from` into `to` (same length) and returns the crc32c of the
/// bytes appended to `crc`, as `crc32c::crc32c_append(crc, from)` does.
pub fn copy_crc32c(from: &[u8], to: &mut [u8], crc: u32) -> u32 {
    assert_eq!(from.len(), to.len(), "copy_crc32c of unequal slices");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2 (checked above); the lengths are
        // equal (asserted above).
        return unsafe { x86::fused(from, to, crc) };
    }
    let c = crc32c::crc32c_append(crc, from);
    to.copy_from_slice(from);
    c
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_prefetch, _MM_HINT_T0};
    use std::sync::OnceLock;

    /// Bytes per lane: three lanes make one block.
    const LANE: usize = 8 << 10;
    /// How far ahead of each lane to prefetch, in 8-byte words (1 KiB).
    const AHEAD: usize = 128;

    /// Shifting a crc32c over `LANE` zero bytes is linear in the crc: a
    /// table per byte of it, built once from `crc32c_combine` of the 32
    /// basis values.
    fn shift_tables() -> &'static [[u32; 256]; 4] {
        static T: OnceLock<Box<[[u32; 256]; 4]>> = OnceLock::new();
        T.get_or_init(|| {
            let basis: Vec<u32> = (0..32)
                .map(|i| crc32c::crc32c_combine(1u32 << i, 0, LANE))
                .collect();
            let mut t = Box::new([[0u32; 256]; 4]);
            for (k, table) in t.iter_mut().enumerate() {
                for (b, v) in table.iter_mut().enumerate() {
                    *v = (0..8)
                        .filter(|j| b >> j & 1 == 1)
                        .fold(0, |v, j| v ^ basis[k * 8 + j]);
                }
            }
            t
        })
    }

    /// The crc of `LANE` more bytes after a stream whose crc is `x`, when
    /// those bytes' own crc is 0 (combine: `shift(a) ^ b`).
    fn shift(t: &[[u32; 256]; 4], x: u32) -> u32 {
        let b = x.to_le_bytes();
        t[0][b[0] as usize] ^ t[1][b[1] as usize] ^ t[2][b[2] as usize] ^ t[3][b[3] as usize]
    }

    /// # Safety
    /// The CPU must have SSE 4.2, and `from` and `to` the same length.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn fused(from: &[u8], to: &mut [u8], crc: u32) -> u32 {
        let len = from.len();
        let t = shift_tables();
        let mut c = crc;
        let mut off = 0;
        const W: usize = LANE / 8;
        while off + 3 * LANE <= len {
            // SAFETY: [off, off + 3 LANE) is inside both slices (the loop
            // condition); reads and writes are unaligned-safe; prefetches
            // never fault, wherever they point.
            unsafe {
                let s = from.as_ptr().add(off).cast::<u64>();
                let d = to.as_mut_ptr().add(off).cast::<u64>();
                // crc32c's conditioning: start inverted, end inverted.
                let (mut a, mut b, mut e) = (u64::from(!c), u64::from(!0u32), u64::from(!0u32));
                let mut i = 0;
                while i < W {
                    let p = s.wrapping_add(i + AHEAD).cast::<i8>();
                    _mm_prefetch::<_MM_HINT_T0>(p);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(LANE));
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(2 * LANE));
                    for j in i..i + 8 {
                        let x = s.add(j).read_unaligned();
                        let y = s.add(j + W).read_unaligned();
                        let z = s.add(j + 2 * W).read_unaligned();
                        a = _mm_crc32_u64(a, x);
                        b = _mm_crc32_u64(b, y);
                        e = _mm_crc32_u64(e, z);
                        d.add(j).write_unaligned(x);
                        d.add(j + W).write_unaligned(y);
                        d.add(j + 2 * W).write_unaligned(z);
                    }
                    i += 8;
                }
                c = shift(t, shift(t, !(a as u32)) ^ !(b as u32)) ^ !(e as u32);
            }
            off += 3 * LANE;
        }
        to[off..].copy_from_slice(&from[off..]);
        crc32c::crc32c_append(c, &from[off..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the block size, odd offsets, any starting crc:
    /// the same bytes and checksum as a copy and `crc32c_append`.
    #[test]
    fn copies_and_checksums_like_the_two_passes() {
        let block = 3 * (8 << 10);
        let src: Vec<u8> = (0..(1u32 << 20) + 64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in [
            0,
            1,
            7,
            8,
            9,
            block - 1,
            block,
            block + 1,
            5 * block + 7,
            1 << 20,
        ] {
            for (at, crc) in [(0, 0), (3, 77), (1, u32::MAX)] {
                let from = &src[at..at + len];
                let mut to = vec![0u8; len + 1];
                let c = copy_crc32c(from, &mut to[1..], crc);
                assert_eq!(c, crc32c::crc32c_append(crc, from), "len {len} at {at}");
                assert_eq!(&to[1..], from, "len {len} at {at}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "unequal")]
    fn unequal_lengths_are_refused() {
        copy_crc32c(&[1, 2], &mut [0], 0);
    }
}
