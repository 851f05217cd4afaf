//! Objects made of several buffers (scatter-gather): vLLM stores one block
//! from one slice per layer. A write sends the parts' concatenation and a
//! read lands in the parts in order, without joining them into one buffer.

/// The bytes of all `parts` together.
pub fn total_len<B: AsRef<[u8]>>(parts: &[B]) -> usize {
    parts.iter().map(|p| p.as_ref().len()).sum()
}

/// The parts' concatenation, borrowed when there is one part (transports
/// that send from one buffer only).
pub fn joined<'a>(parts: &[&'a [u8]]) -> std::borrow::Cow<'a, [u8]> {
    match parts {
        [one] => std::borrow::Cow::Borrowed(one),
        _ => std::borrow::Cow::Owned(parts.concat()),
    }
}

/// The crc32c of the parts' concatenation.
pub fn crc32c<B: AsRef<[u8]>>(parts: &[B]) -> u32 {
    parts
        .iter()
        .fold(0, |crc, p| crc32c::crc32c_append(crc, p.as_ref()))
}

/// The BLAKE3 digest of the parts' concatenation (`--integrity blake3`).
pub fn blake3<B: AsRef<[u8]>>(parts: &[B]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_ref());
    }
    *h.finalize().as_bytes()
}

/// The same buffers borrowed again (the originals stay usable afterwards).
pub fn reborrow<'b>(bufs: &'b mut [&mut [u8]]) -> Vec<&'b mut [u8]> {
    bufs.iter_mut().map(|b| &mut **b).collect()
}

/// The concatenation of `parts`, cut into pieces of `chunk` bytes (the last
/// one shorter), each a list of sub-slices of the parts. Empty parts are
/// skipped; no bytes are copied.
pub fn chunks<'a>(parts: &[&'a [u8]], chunk: usize) -> Vec<Vec<&'a [u8]>> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    let mut cur: Vec<&'a [u8]> = Vec::new();
    let mut room = chunk;
    for &p in parts {
        let mut p = p;
        while !p.is_empty() {
            let (head, tail) = p.split_at(room.min(p.len()));
            cur.push(head);
            room -= head.len();
            p = tail;
            if room == 0 {
                out.push(std::mem::take(&mut cur));
                room = chunk;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// [`chunks`] of writable parts, for reads.
pub fn chunks_mut<'a>(parts: Vec<&'a mut [u8]>, chunk: usize) -> Vec<Vec<&'a mut [u8]>> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    let mut cur: Vec<&'a mut [u8]> = Vec::new();
    let mut room = chunk;
    for p in parts {
        let mut p = p;
        while !p.is_empty() {
            let (head, tail) = p.split_at_mut(room.min(p.len()));
            room -= head.len();
            cur.push(head);
            p = tail;
            if room == 0 {
                out.push(std::mem::take(&mut cur));
                room = chunk;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Copies `from` into `parts` in order (`from` is exactly as long as they
/// are together).
pub fn scatter(from: &[u8], parts: &mut [&mut [u8]]) {
    let mut at = 0;
    for p in parts.iter_mut() {
        p.copy_from_slice(&from[at..at + p.len()]);
        at += p.len();
    }
}

/// The first `n` bytes of `parts` (fewer parts when they end earlier).
pub fn truncate(parts: Vec<&mut [u8]>, n: usize) -> Vec<&mut [u8]> {
    let mut left = n;
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        if left == 0 {
            break;
        }
        let take = left.min(p.len());
        out.push(&mut p[..take]);
        left -= take;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_concatenation_in_order() {
        let a = [1u8; 5];
        let b = [2u8; 0];
        let c = [3u8; 7];
        let parts: [&[u8]; 3] = [&a, &b, &c];
        let got = chunks(&parts, 4);
        let lens: Vec<usize> = got.iter().map(|c| total_len(c)).collect();
        assert_eq!(lens, vec![4, 4, 4]);
        let joined: Vec<u8> = got
            .iter()
            .flatten()
            .flat_map(|s| s.iter().copied())
            .collect();
        assert_eq!(joined, [&a[..], &c[..]].concat());
        assert!(got.iter().flatten().all(|s| !s.is_empty()));
        assert!(chunks(&[&[][..]], 4).is_empty());
        assert_eq!(crc32c(&parts), crc32c::crc32c(&joined));
    }

    #[test]
    fn writable_chunks_land_in_the_parts() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 6];
        let pieces = chunks_mut(vec![&mut a[..], &mut b[..]], 4);
        assert_eq!(pieces.len(), 3);
        let mut v = 1u8;
        for piece in pieces {
            for s in piece {
                for x in s.iter_mut() {
                    *x = v;
                    v += 1;
                }
            }
        }
        assert_eq!(a, [1, 2, 3]);
        assert_eq!(b, [4, 5, 6, 7, 8, 9]);
        let mut c = [0u8; 4];
        let mut d = [0u8; 2];
        scatter(&[9, 8, 7, 6, 5, 4], &mut [&mut c[..], &mut d[..]]);
        assert_eq!((c, d), ([9, 8, 7, 6], [5, 4]));
        let cut = truncate(vec![&mut c[..], &mut d[..]], 5);
        assert_eq!(cut.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![4, 1]);
        assert!(truncate(vec![&mut c[..]], 0).is_empty());
    }
}
