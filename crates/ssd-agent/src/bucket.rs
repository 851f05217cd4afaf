//! Bucket files: many objects in one file, self-describing and checksummed.
//!
//! Layout, version 1 (little endian):
//! ```text
//! header (64 bytes)
//!   0 magic "STRBUCK1" | 8 version u32 | 12 header_len u32 = 64
//!  16 owner_id u64     | 24 bucket_id u64
//!  32 object_count u32 | 36 reserved u32
//!  40 data_len u64     | 48 table_len u64
//!  56 header crc32c u32 (over bytes 0..56) | 60 reserved u32
//! data (data_len bytes): the objects back to back
//! table (table_len bytes): per object: key_len u16, key, offset u64 (from
//!   file start), length u64, crc32c u32
//! table crc32c u32
//! ```
//! Files are named `o{owner:016x}-b{bucket:016x}.bkt` and created with
//! O_EXCL, so no two writers ever share one.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use strata_common::{Code, Error, Result};

pub const MAGIC: &[u8; 8] = b"STRBUCK1";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: u64 = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub owner_id: u64,
    pub bucket_id: u64,
    pub object_count: u32,
    pub data_len: u64,
    pub table_len: u64,
}

impl Header {
    /// Bytes the whole file must have; `u64::MAX` when the header's lengths
    /// overflow (then no real file matches it).
    pub fn file_len(&self) -> u64 {
        HEADER_LEN
            .checked_add(self.data_len)
            .and_then(|v| v.checked_add(self.table_len))
            .and_then(|v| v.checked_add(4))
            .unwrap_or(u64::MAX)
    }

    fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut b = [0u8; HEADER_LEN as usize];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.owner_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.bucket_id.to_le_bytes());
        b[32..36].copy_from_slice(&self.object_count.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.table_len.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..56]);
        b[56..60].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Header> {
        let bad = |why: &str| Error::new(Code::Corrupted, format!("bucket header {why}"));
        if b.len() < HEADER_LEN as usize {
            return Err(bad("is truncated"));
        }
        if &b[0..8] != MAGIC {
            return Err(bad("has no Strata bucket magic"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(56) != crc32c::crc32c(&b[0..56]) {
            return Err(bad("fails its checksum"));
        }
        if u32_at(8) != VERSION {
            return Err(bad(&format!("has unsupported version {}", u32_at(8))));
        }
        Ok(Header {
            owner_id: u64_at(16),
            bucket_id: u64_at(24),
            object_count: u32_at(32),
            data_len: u64_at(40),
            table_len: u64_at(48),
        })
    }
}

pub fn file_name(owner_id: u64, bucket_id: u64) -> String {
    format!("o{owner_id:016x}-b{bucket_id:016x}.bkt")
}

/// Parses a bucket file name into (owner_id, bucket_id).
pub fn parse_name(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix('o')?.strip_suffix(".bkt")?;
    let (o, b) = rest.split_once("-b")?;
    if o.len() != 16 || b.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(o, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ))
}

/// The exact size of the bucket file `write` would create for `objects`.
pub fn file_len_for(objects: &[(&str, &[u8], u32)]) -> u64 {
    let data: u64 = objects.iter().map(|o| o.1.len() as u64).sum();
    let table: u64 = objects.iter().map(|o| 2 + o.0.len() as u64 + 20).sum();
    HEADER_LEN + data + table + 4
}

/// One object placed in a bucket.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    pub key: String,
    pub offset: u64,
    pub length: u64,
    pub crc32c: u32,
    /// The master's record of giving this owner the copy
    /// (`OffloadTask.copy_record`), reported with it in inventories; kept
    /// in the index only (a bucket file's table does not hold it, so a
    /// copy known only from its file is not re-adopted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub record: Vec<u8>,
}

/// Whether a file's table and the index's record of it list the same
/// objects (the records the index adds are not in the file).
pub fn same_table(file: &[Entry], index: &[Entry]) -> bool {
    file.len() == index.len()
        && file.iter().zip(index).all(|(a, b)| {
            (&a.key, a.offset, a.length, a.crc32c) == (&b.key, b.offset, b.length, b.crc32c)
        })
}

/// Writes a new bucket file with O_EXCL and fsyncs it (and its directory).
/// On any failure the partial file is removed. Returns the entries and the
/// file's length.
pub fn write(
    dir: &Path,
    owner_id: u64,
    bucket_id: u64,
    objects: &[(&str, &[u8], u32)],
) -> Result<(Vec<Entry>, u64)> {
    let path = dir.join(file_name(owner_id, bucket_id));
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| io_err(&path, e))?;
    let res = write_inner(f, &path, owner_id, bucket_id, objects);
    if res.is_err() {
        // Only ever a file this call created (O_EXCL above).
        let _ = std::fs::remove_file(&path);
    }
    let out = res?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(&path, e))?;
    Ok(out)
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    let code = if e.raw_os_error() == Some(28) {
        Code::NoSpace
    } else {
        Code::Internal
    };
    Error::new(code, format!("writing bucket {}: {e}", path.display()))
}

fn write_inner(
    mut f: File,
    path: &Path,
    owner_id: u64,
    bucket_id: u64,
    objects: &[(&str, &[u8], u32)],
) -> Result<(Vec<Entry>, u64)> {
    let mut entries = Vec::with_capacity(objects.len());
    let mut table = Vec::new();
    let mut off = HEADER_LEN;
    for (key, data, crc) in objects {
        let kb = key.as_bytes();
        let klen =
            u16::try_from(kb.len()).map_err(|_| Error::invalid("key longer than 65535 bytes"))?;
        table.extend_from_slice(&klen.to_le_bytes());
        table.extend_from_slice(kb);
        table.extend_from_slice(&off.to_le_bytes());
        table.extend_from_slice(&(data.len() as u64).to_le_bytes());
        table.extend_from_slice(&crc.to_le_bytes());
        entries.push(Entry {
            key: key.to_string(),
            offset: off,
            length: data.len() as u64,
            crc32c: *crc,
            record: Vec::new(),
        });
        off += data.len() as u64;
    }
    let header = Header {
        owner_id,
        bucket_id,
        object_count: objects.len() as u32,
        data_len: off - HEADER_LEN,
        table_len: table.len() as u64,
    };
    let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut f);
    let e = |e| io_err(path, e);
    w.write_all(&header.encode()).map_err(e)?;
    for (_, data, _) in objects {
        w.write_all(data).map_err(e)?;
    }
    // Failpoint (compiled in with the `failpoints` feature only): e.g.
    // `sleep(60000)` leaves a half-written file on disk for a while (a crash
    // here must never be served or adopted).
    #[cfg(feature = "failpoints")]
    {
        w.flush().map_err(e)?;
        fail::fail_point!("ssd-agent::bucket-mid-write");
    }
    w.write_all(&table).map_err(e)?;
    w.write_all(&crc32c::crc32c(&table).to_le_bytes())
        .map_err(e)?;
    w.flush().map_err(e)?;
    drop(w);
    f.sync_all().map_err(e)?;
    Ok((entries, header.file_len()))
}

/// Opens a bucket and checks what recovery checks: the header is intact and
/// names this owner and bucket, the file length adds up, and the object
/// table is intact. Object bytes are checked lazily, on read.
pub fn verify(path: &Path, owner_id: u64, bucket_id: u64) -> Result<(Header, Vec<Entry>)> {
    let mut f = File::open(path).map_err(|e| {
        Error::new(
            Code::Corrupted,
            format!("cannot open {}: {e}", path.display()),
        )
    })?;
    let mut hb = [0u8; HEADER_LEN as usize];
    f.read_exact(&mut hb).map_err(|_| {
        Error::new(
            Code::Corrupted,
            format!("{}: header is truncated", path.display()),
        )
    })?;
    let h = Header::decode(&hb)
        .map_err(|e| Error::new(e.code, format!("{}: {}", path.display(), e.message)))?;
    if h.owner_id != owner_id || h.bucket_id != bucket_id {
        return Err(Error::new(
            Code::Corrupted,
            format!(
                "{}: header names owner {} bucket {}, expected owner {owner_id} bucket {bucket_id}",
                path.display(),
                h.owner_id,
                h.bucket_id
            ),
        ));
    }
    let len = f
        .metadata()
        .map_err(|e| Error::internal(e.to_string()))?
        .len();
    if len != h.file_len() {
        return Err(Error::new(
            Code::Corrupted,
            format!(
                "{}: file is {len} bytes, header says {}",
                path.display(),
                h.file_len()
            ),
        ));
    }
    if h.table_len > 64 << 20 {
        return Err(Error::new(
            Code::Corrupted,
            format!("{}: object table too large", path.display()),
        ));
    }
    let mut table = vec![0u8; h.table_len as usize + 4];
    f.read_exact_at(&mut table, HEADER_LEN + h.data_len)
        .map_err(|e| Error::new(Code::Corrupted, format!("{}: {e}", path.display())))?;
    let (t, crc) = table.split_at(table.len() - 4);
    if crc32c::crc32c(t) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(Error::new(
            Code::Corrupted,
            format!("{}: object table fails its checksum", path.display()),
        ));
    }
    let entries = parse_table(t, &h)
        .map_err(|why| Error::new(Code::Corrupted, format!("{}: {why}", path.display())))?;
    Ok((h, entries))
}

/// Smallest table entry: key_len, empty key, offset, length, crc.
const MIN_ENTRY: usize = 2 + 8 + 8 + 4;

fn parse_table(mut t: &[u8], h: &Header) -> std::result::Result<Vec<Entry>, String> {
    // The count comes from the file: never trust it for an allocation.
    if h.object_count as usize > t.len() / MIN_ENTRY {
        return Err(format!(
            "header claims {} objects, more than a table of {} bytes can hold",
            h.object_count,
            t.len()
        ));
    }
    let mut out = Vec::with_capacity(h.object_count as usize);
    for _ in 0..h.object_count {
        let take = |t: &mut &[u8], n: usize| -> std::result::Result<Vec<u8>, String> {
            if t.len() < n {
                return Err("object table is truncated".into());
            }
            let (a, b) = t.split_at(n);
            *t = b;
            Ok(a.to_vec())
        };
        let klen = u16::from_le_bytes(take(&mut t, 2)?.try_into().expect("2")) as usize;
        let key =
            String::from_utf8(take(&mut t, klen)?).map_err(|_| "key is not UTF-8".to_string())?;
        let offset = u64::from_le_bytes(take(&mut t, 8)?.try_into().expect("8"));
        let length = u64::from_le_bytes(take(&mut t, 8)?.try_into().expect("8"));
        let crc32c = u32::from_le_bytes(take(&mut t, 4)?.try_into().expect("4"));
        let end = offset.checked_add(length).ok_or("object range overflows")?;
        let data_end = HEADER_LEN
            .checked_add(h.data_len)
            .ok_or("data length overflows")?;
        if offset < HEADER_LEN || end > data_end {
            return Err(format!("object {key:?} lies outside the data region"));
        }
        out.push(Entry {
            key,
            offset,
            length,
            crc32c,
            record: Vec::new(),
        });
    }
    if !t.is_empty() {
        return Err("object table has trailing bytes".into());
    }
    Ok(out)
}

/// Reads `length` bytes at `offset` of a bucket file.
pub fn read_range(path: &PathBuf, offset: u64, length: u64) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; length as usize];
    read_range_into(path, offset, &mut buf)?;
    Ok(buf)
}

/// Fills `buf` from `offset` of a bucket file.
pub fn read_range_into(path: &PathBuf, offset: u64, buf: &mut [u8]) -> Result<()> {
    let f = File::open(path)
        .map_err(|e| Error::new(Code::NotFound, format!("bucket {}: {e}", path.display())))?;
    f.read_exact_at(buf, offset)
        .map_err(|e| Error::new(Code::Corrupted, format!("reading {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(dir: &Path) -> (PathBuf, Vec<u8>) {
        let a = vec![7u8; 300];
        let objs = [("k1", a.as_slice(), crc32c::crc32c(&a)), ("k2", &a[..5], 0)];
        write(dir, 1, 2, &objs).unwrap();
        let p = dir.join(file_name(1, 2));
        let bytes = std::fs::read(&p).unwrap();
        (p, bytes)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Random bytes, truncations and bit flips of a real bucket: the
        /// parser returns an error or the right entries, never panics or
        /// allocates what the file claims.
        #[test]
        fn damaged_buckets_never_panic(
            cut in 0usize..2000,
            flips in proptest::collection::vec((0usize..2000, any::<u8>()), 0..6),
            junk in proptest::collection::vec(any::<u8>(), 0..300),
            header_fields in (any::<u32>(), any::<u64>(), any::<u64>()),
        ) {
            let d = tempfile::tempdir().unwrap();
            let (p, bytes) = sample(d.path());
            let (_, want) = verify(&p, 1, 2).unwrap();
            let mut b = bytes.clone();
            b.truncate(cut.min(b.len()));
            for (i, x) in &flips {
                if let Some(v) = b.get_mut(*i) { *v ^= x; }
            }
            std::fs::write(&p, &b).unwrap();
            // Damage outside what the checksums cover (reserved bytes) may
            // pass, but then the entries are exactly the original ones.
            if let Ok((_, e)) = verify(&p, 1, 2) {
                prop_assert_eq!(e, want.clone());
            }
            std::fs::write(&p, &junk).unwrap();
            prop_assert!(verify(&p, 1, 2).is_err());
            // A header with a valid checksum but hostile counts and lengths.
            let (count, data_len, table_len) = header_fields;
            let h = Header { owner_id: 1, bucket_id: 2, object_count: count, data_len, table_len };
            let mut f = h.encode().to_vec();
            f.extend_from_slice(&bytes[HEADER_LEN as usize..]);
            std::fs::write(&p, &f).unwrap();
            let _ = verify(&p, 1, 2);
            let _ = Header::decode(&f);
        }
    }

    #[test]
    fn a_huge_object_count_is_refused_without_allocating() {
        let d = tempfile::tempdir().unwrap();
        let (p, bytes) = sample(d.path());
        let mut h = Header::decode(&bytes).unwrap();
        h.object_count = u32::MAX;
        let mut f = h.encode().to_vec();
        f.extend_from_slice(&bytes[HEADER_LEN as usize..]);
        std::fs::write(&p, &f).unwrap();
        let e = verify(&p, 1, 2).unwrap_err();
        assert_eq!(e.code, Code::Corrupted);
        // The table checksum passes (only the header changed), so it is the
        // count check that refuses it.
        assert!(e.message.contains("claims"), "{e}");
        h.object_count = 2;
        h.data_len = u64::MAX - 10;
        let mut f = h.encode().to_vec();
        f.extend_from_slice(&bytes[HEADER_LEN as usize..]);
        std::fs::write(&p, &f).unwrap();
        assert!(verify(&p, 1, 2)
            .unwrap_err()
            .message
            .contains("header says"));
    }

    #[test]
    fn write_verify_and_detect_damage() {
        let d = tempfile::tempdir().unwrap();
        let a = vec![1u8; 1000];
        let b = vec![2u8; 10];
        let objs = [
            ("a", a.as_slice(), crc32c::crc32c(&a)),
            ("b", b.as_slice(), crc32c::crc32c(&b)),
        ];
        let (entries, len) = write(d.path(), 3, 9, &objs).unwrap();
        assert_eq!(len, file_len_for(&objs));
        assert_eq!(entries[1].offset, HEADER_LEN + 1000);
        let p = d.path().join(file_name(3, 9));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), len);
        let (h, e2) = verify(&p, 3, 9).unwrap();
        assert_eq!((h.object_count, e2), (2, entries.clone()));
        assert_eq!(read_range(&p, entries[1].offset, 10).unwrap(), b);
        // O_EXCL: the same bucket id is never written twice.
        assert!(write(d.path(), 3, 9, &objs).is_err());
        assert!(
            p.exists(),
            "a refused write must not remove the existing file"
        );
        // Wrong owner, truncation, damaged header.
        assert!(verify(&p, 4, 9)
            .unwrap_err()
            .message
            .contains("expected owner 4"));
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 7]).unwrap();
        assert!(verify(&p, 3, 9)
            .unwrap_err()
            .message
            .contains("header says"));
        let mut dmg = bytes.clone();
        dmg[20] ^= 1;
        std::fs::write(&p, &dmg).unwrap();
        assert!(verify(&p, 3, 9).unwrap_err().message.contains("checksum"));
        assert_eq!(parse_name(&file_name(3, 9)), Some((3, 9)));
        assert_eq!(parse_name("o12-b34.bkt"), None);
        assert_eq!(parse_name("notes.txt"), None);
    }

    #[test]
    fn bucket_names_need_sixteen_hex_digits_on_both_sides() {
        let id = "0000000000000003";
        assert_eq!(parse_name(&format!("o{id}-b{id}.bkt")), Some((3, 3)));
        assert_eq!(parse_name(&format!("o{id}-b3.bkt")), None);
        assert_eq!(parse_name(&format!("o3-b{id}.bkt")), None);
    }

    #[test]
    fn a_full_disk_is_reported_as_no_space() {
        let p = Path::new("/d/b.bkt");
        let e = |n| io_err(p, std::io::Error::from_raw_os_error(n)).code;
        assert_eq!((e(28), e(5)), (Code::NoSpace, Code::Internal));
    }

    /// An object table of up to 64 MiB is read (this one then fails its
    /// checksum); one byte more is refused before reading or allocating.
    #[test]
    fn the_object_table_is_read_up_to_64_mib() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(file_name(1, 2));
        for (table_len, why) in [
            (64 << 20, "object table fails its checksum"),
            ((64 << 20) + 1, "object table too large"),
        ] {
            let h = Header {
                owner_id: 1,
                bucket_id: 2,
                object_count: 0,
                data_len: 0,
                table_len,
            };
            let mut f = File::create(&p).unwrap();
            f.write_all(&h.encode()).unwrap();
            f.set_len(h.file_len()).unwrap(); // sparse zeros
            let e = verify(&p, 1, 2).unwrap_err();
            assert!(e.message.contains(why), "{e}");
        }
    }

    /// The object count is checked against the smallest entry (22 bytes):
    /// a table of 3 empty-keyed empty objects holds 3, not 4.
    #[test]
    fn the_object_count_must_fit_the_table() {
        let d = tempfile::tempdir().unwrap();
        let empty: &[u8] = &[];
        write(d.path(), 1, 2, &[("", empty, 0); 3]).unwrap();
        let p = d.path().join(file_name(1, 2));
        let (mut h, e) = verify(&p, 1, 2).unwrap();
        assert_eq!((h.table_len, e.len()), (3 * 22, 3));
        let bytes = std::fs::read(&p).unwrap();
        h.object_count = 4;
        let mut f = h.encode().to_vec();
        f.extend_from_slice(&bytes[HEADER_LEN as usize..]);
        std::fs::write(&p, &f).unwrap();
        assert!(verify(&p, 1, 2).unwrap_err().message.contains("claims"));
    }

    /// Every entry lies inside the data region: one starting in the header
    /// is refused even when it ends inside the data, as is one running past
    /// the data's end.
    #[test]
    fn entries_must_lie_inside_the_data_region() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(file_name(1, 2));
        for (offset, inside) in [
            (HEADER_LEN, true),
            (HEADER_LEN - 1, false),
            (HEADER_LEN + 1, false),
        ] {
            let mut table = vec![1, 0, b'k'];
            table.extend_from_slice(&offset.to_le_bytes());
            table.extend_from_slice(&10u64.to_le_bytes());
            table.extend_from_slice(&0u32.to_le_bytes());
            let h = Header {
                owner_id: 1,
                bucket_id: 2,
                object_count: 1,
                data_len: 10,
                table_len: table.len() as u64,
            };
            let mut f = h.encode().to_vec();
            f.extend_from_slice(&[0; 10]);
            f.extend_from_slice(&table);
            f.extend_from_slice(&crc32c::crc32c(&table).to_le_bytes());
            std::fs::write(&p, &f).unwrap();
            match verify(&p, 1, 2) {
                Ok((_, e)) => assert!(inside && e[0].offset == offset),
                Err(e) => assert!(!inside && e.message.contains("outside"), "{e}"),
            }
        }
    }
}
