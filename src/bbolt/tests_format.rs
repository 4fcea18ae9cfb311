//! Round trips through the writer and the reader, and the reader's refusals of damaged
//! files (BBOLT-1, BBOLT-2).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::read::{Reader, split_trailer};
use super::write::{EtcdWriter, history_entry};
use super::*;
use crate::mvcc::Revision;
use crate::mvcc::record::Record;
use crate::storage::RevisionKey;

type Entries = Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>;

/// A history of `n` puts of varied sizes, every seventh a tombstone, one value of 10 000
/// bytes (overflow pages).
fn history(n: i64) -> BTreeMap<RevisionKey, Vec<u8>> {
    let mut h = BTreeMap::new();
    for i in 0..n {
        let key = Bytes::from(format!("key/{:05}", i % 500));
        let record = if i % 7 == 6 {
            Record::tombstone(key)
        } else {
            let len = if i == n / 2 {
                10_000
            } else {
                (i % 50) as usize
            };
            Record {
                key,
                tombstone: false,
                create_revision: i + 2,
                version: 1 + i % 3,
                lease: if i % 5 == 0 { 0x1234 } else { 0 },
                value: Bytes::from(vec![b'v'; len]),
            }
        };
        let at = Revision::new(i + 2, i % 2).to_key();
        h.insert(at, record.encode(&at));
    }
    h
}

fn small_buckets(leases: usize) -> Vec<(Vec<u8>, Vec<write::Entry>)> {
    let lease_rows = (0..leases)
        .map(|i| {
            let id = i as i64 + 1;
            (id.to_be_bytes().to_vec(), proto::encode_lease(id, 60))
        })
        .collect();
    vec![
        (BUCKET_LEASE.to_vec(), lease_rows),
        (
            BUCKET_META.to_vec(),
            vec![(META_CONSISTENT_INDEX.to_vec(), 7u64.to_be_bytes().to_vec())],
        ),
        (BUCKET_ALARM.to_vec(), Vec::new()),
    ]
}

fn write_file(history: BTreeMap<RevisionKey, Vec<u8>>, leases: usize, chunk: usize) -> Vec<u8> {
    let mut writer = EtcdWriter::new(history, small_buckets(leases)).unwrap();
    let total = writer.total_bytes();
    let mut out = Vec::new();
    let mut calls = 0;
    loop {
        let want = out.len() + chunk;
        if !writer.fill(&mut out, want).unwrap() {
            break;
        }
        calls += 1;
        assert!(calls < 1_000_000, "the writer never ends");
    }
    assert_eq!(
        out.len() as u64,
        total,
        "BWRITE-1: the file has the planned size"
    );
    out
}

fn read_all(file: &[u8]) -> Result<Entries, BboltError> {
    let reader = Reader::open(file)?;
    let mut got = Vec::new();
    reader.visit(&mut |b, k, v| {
        got.push((b.to_vec(), k.to_vec(), v.to_vec()));
        Ok(())
    })?;
    Ok(got)
}

fn expected(history: &BTreeMap<RevisionKey, Vec<u8>>, leases: usize) -> Entries {
    let mut want = Vec::new();
    for (name, rows) in small_buckets(leases) {
        for (k, v) in rows {
            want.push((name.clone(), k, v));
        }
    }
    for (k, v) in history {
        let (ek, ev) = history_entry(k, v).unwrap();
        want.push((BUCKET_KEY.to_vec(), ek, ev));
    }
    // Buckets in name order, entries in key order.
    want.sort();
    want
}

#[test]
fn files_of_every_shape_read_back_whole() {
    // Empty, inline, one leaf, several leaves under a branch, two branch levels.
    for (n, leases) in [(0, 0), (3, 1), (40, 2), (600, 30), (12_000, 400)] {
        let h = history(n);
        let file = write_file(h.clone(), leases, 32 * 1024);
        assert_eq!(file.len() % PAGE_BYTES, 0);
        let got = read_all(&file).unwrap();
        assert_eq!(got, expected(&h, leases), "history of {n}");
        let status = status::status(&file).unwrap();
        assert_eq!(status.total_keys, got.len() as u64);
        assert_eq!(status.revision, if n == 0 { 0 } else { n + 1 });
    }
}

#[test]
fn chunk_size_does_not_change_the_bytes() {
    let h = history(700);
    let a = write_file(h.clone(), 3, 1);
    let b = write_file(h, 3, 1 << 20);
    assert_eq!(a, b);
}

#[test]
fn tombstones_and_puts_have_etcds_keys_and_values() {
    let mut h = BTreeMap::new();
    let put = Record {
        key: Bytes::from_static(b"a"),
        tombstone: false,
        create_revision: 2,
        version: 1,
        lease: 0,
        value: Bytes::from_static(b"1"),
    };
    let (two, five) = (Revision::new(2, 0).to_key(), Revision::new(5, 0).to_key());
    h.insert(two, put.encode(&two));
    h.insert(
        five,
        Record::tombstone(Bytes::from_static(b"b")).encode(&five),
    );
    let got = read_all(&write_file(h, 0, 4096)).unwrap();
    let keys: Vec<_> = got.iter().filter(|(b, _, _)| b == BUCKET_KEY).collect();
    assert_eq!(keys[0].1, etcd_revision_key(2, 0, false));
    assert_eq!(
        keys[0].2,
        [
            0x0a, 0x01, 0x61, 0x10, 0x02, 0x18, 0x02, 0x20, 0x01, 0x2a, 0x01, 0x31
        ]
    );
    assert_eq!(keys[1].1, etcd_revision_key(5, 0, true));
    assert_eq!(keys[1].2, [0x0a, 0x01, 0x62]);
}

#[test]
fn trailer_is_found_by_length() {
    let file = write_file(history(5), 0, 4096);
    assert_eq!(split_trailer(&file).1, None);
    let mut with = file.clone();
    with.extend_from_slice(&[7u8; 32]);
    let (db, trailer) = split_trailer(&with);
    assert_eq!(db, &file[..]);
    assert_eq!(trailer, Some(&[7u8; 32][..]));
}

/// Reads `file` and returns whether it was accepted; panics only if the reader does.
fn accepted(file: &[u8]) -> bool {
    read_all(file).is_ok()
}

fn set_u16(file: &mut [u8], at: usize, v: u16) {
    file[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn set_u64(file: &mut [u8], at: usize, v: u64) {
    file[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Rewrites meta `n`'s checksum after an edit.
fn reseal(file: &mut [u8], n: usize) {
    let m = n * PAGE_BYTES + PAGE_HEADER_BYTES;
    let sum = fnv1a64(&file[m..m + 56]);
    set_u64(file, m + 56, sum);
}

#[test]
fn truncated_files_are_refused() {
    let file = write_file(history(600), 5, 32 * 1024);
    for len in (0..file.len())
        .step_by(509)
        .chain([1, 15, 80, 4095, 4096, 8191, 8192])
    {
        let err = read_all(&file[..len]).unwrap_err();
        assert!(!err.0.is_empty(), "{len}");
    }
    assert!(
        Reader::open(&file[..file.len() - 1])
            .unwrap_err()
            .0
            .contains("truncated")
    );
}

#[test]
fn foreign_files_are_refused() {
    for bytes in [&b""[..], b"SQLite format 3\0", &[0u8; 8192], &[0xFF; 16384]] {
        assert!(Reader::open(bytes).is_err());
    }
    let mut dump = b"KVDDUMP1".to_vec();
    dump.resize(4096, 0);
    assert!(
        Reader::open(&dump)
            .unwrap_err()
            .0
            .contains("invalid database")
    );
}

#[test]
fn a_bad_meta_checksum_falls_back_to_the_other_meta_or_fails() {
    let mut file = write_file(history(50), 1, 4096);
    file[PAGE_HEADER_BYTES + 40] ^= 1;
    assert!(accepted(&file), "meta 1 is still valid");
    file[PAGE_BYTES + PAGE_HEADER_BYTES + 40] ^= 1;
    assert!(Reader::open(&file).unwrap_err().0.contains("checksum"));
}

#[test]
fn cycles_and_shared_pages_are_refused() {
    let h = history(600);
    let file = write_file(h, 0, 4096);
    let reader = Reader::open(&file).unwrap();
    let high_water = reader.size() / PAGE_BYTES as u64;
    // Find the key bucket's branch page: the first branch page after the leaves.
    let branch = (2..high_water)
        .find(|p| {
            let at = *p as usize * PAGE_BYTES;
            u16::from_le_bytes([file[at + 8], file[at + 9]]) == FLAG_BRANCH
        })
        .unwrap() as usize;
    // A branch whose second child is the branch itself: a cycle.
    let mut cycle = file.clone();
    set_u64(&mut cycle, branch * PAGE_BYTES + 16 + 16 + 8, branch as u64);
    let err = read_all(&cycle).unwrap_err();
    assert!(err.0.contains("multiple references"), "{err}");
    // Two children naming the same leaf: a shared page.
    let mut shared = file.clone();
    let first_child = u64::from_le_bytes(
        file[branch * PAGE_BYTES + 24..branch * PAGE_BYTES + 32]
            .try_into()
            .unwrap(),
    );
    set_u64(&mut shared, branch * PAGE_BYTES + 16 + 16 + 8, first_child);
    assert!(
        read_all(&shared)
            .unwrap_err()
            .0
            .contains("multiple references")
    );
    // A child past the high-water mark.
    let mut out = file.clone();
    set_u64(&mut out, branch * PAGE_BYTES + 24, high_water + 5);
    assert!(read_all(&out).unwrap_err().0.contains("out of bounds"));
    // The root naming a meta page.
    let mut root_meta = file;
    set_u64(&mut root_meta, PAGE_HEADER_BYTES + 16, 1);
    reseal(&mut root_meta, 0);
    set_u64(&mut root_meta, PAGE_BYTES + PAGE_HEADER_BYTES + 16, 1);
    reseal(&mut root_meta, 1);
    assert!(Reader::open(&root_meta).is_err());
}

#[test]
fn overlong_counts_and_positions_are_refused() {
    let file = write_file(history(40), 0, 4096);
    // Page 2 is the key bucket's only leaf.
    let mut count = file.clone();
    set_u16(&mut count, 2 * PAGE_BYTES + 10, 0xFFFF);
    assert!(read_all(&count).unwrap_err().0.contains("do not fit"));
    let mut pos = file.clone();
    pos[2 * PAGE_BYTES + 16 + 4..2 * PAGE_BYTES + 16 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(read_all(&pos).unwrap_err().0.contains("outside"));
    let mut overflow = file.clone();
    overflow[2 * PAGE_BYTES + 12..2 * PAGE_BYTES + 16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(read_all(&overflow).unwrap_err().0.contains("overflow"));
    let mut wrong_id = file;
    set_u64(&mut wrong_id, 2 * PAGE_BYTES, 9);
    assert!(
        read_all(&wrong_id)
            .unwrap_err()
            .0
            .contains("header of page 9")
    );
}

#[test]
fn every_single_byte_flip_gives_entries_or_an_error() {
    let file = write_file(history(60), 2, 4096);
    let mut flipped = file.clone();
    for at in 0..file.len() {
        for bit in [0x01u8, 0x80] {
            flipped[at] ^= bit;
            // Accepted or refused, never a panic (BBOLT-2).
            let _ = accepted(&flipped);
            let _ = status::status(&flipped);
            flipped[at] ^= bit;
        }
    }
    assert_eq!(flipped, file);
}
