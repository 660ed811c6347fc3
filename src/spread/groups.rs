//! Group text → dense group id, by first appearance (plain Rust).
//!
//! One lookup per input row, so it is kept compact and with few dependent
//! memory accesses: the table maps a 64-bit hash of the key to the first
//! group with that hash and where its key lies (24-byte buckets), the key
//! bytes live in one arena, and the rare groups whose hashes collide are
//! chained. A match is always confirmed by comparing the bytes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The first group with a given hash: its id and its key's place in the arena.
#[derive(Clone, Copy)]
struct Head {
    start: usize,
    len: u32,
    id: u32,
}

/// Dense ids for byte-string keys, in order of first appearance.
pub struct GroupIds {
    hash: fn(&[u8]) -> u64,
    first_by_hash: HashMap<u64, Head, BuildHasherDefault<PassThrough>>,
    /// Per group: the key's range in `arena` and the next group with the
    /// same hash (`u32::MAX`: none).
    keys: Vec<(usize, usize)>,
    next_same_hash: Vec<u32>,
    arena: Vec<u8>,
    /// The previous lookup (rows of one group often come together), with
    /// its key's place in the arena so checking it costs no extra lookup.
    last: Option<Head>,
}

impl Default for GroupIds {
    fn default() -> Self {
        Self::with_hash(hash_bytes)
    }
}

impl GroupIds {
    /// A table using `hash` (tests pass a colliding one).
    pub fn with_hash(hash: fn(&[u8]) -> u64) -> Self {
        GroupIds {
            hash,
            first_by_hash: HashMap::default(),
            keys: Vec::new(),
            next_same_hash: Vec::new(),
            arena: Vec::new(),
            last: None,
        }
    }

    /// Number of distinct keys seen.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The id of `key`: its rank among the distinct keys by first
    /// appearance (0, 1, ...), assigning the next one on first sight.
    pub fn id(&mut self, key: &[u8]) -> u32 {
        if let Some(last) = self.last {
            if self.head_matches(last, key) {
                return last.id;
            }
        }
        let h = (self.hash)(key);
        let found = match self.first_by_hash.get(&h) {
            None => {
                let head = self.push(key);
                self.first_by_hash.insert(h, head);
                head
            }
            Some(&head) if self.head_matches(head, key) => head,
            Some(&head) => {
                // a hash collision: walk the chain of groups with this hash
                let mut cur = head.id;
                loop {
                    let next = self.next_same_hash[cur as usize];
                    if next == u32::MAX {
                        let added = self.push(key);
                        self.next_same_hash[cur as usize] = added.id;
                        break added;
                    }
                    let (start, end) = self.keys[next as usize];
                    if &self.arena[start..end] == key {
                        break Head {
                            start,
                            len: (end - start) as u32,
                            id: next,
                        };
                    }
                    cur = next;
                }
            }
        };
        self.last = Some(found);
        found.id
    }

    fn head_matches(&self, head: Head, key: &[u8]) -> bool {
        head.len as usize == key.len() && &self.arena[head.start..head.start + key.len()] == key
    }

    fn push(&mut self, key: &[u8]) -> Head {
        let start = self.arena.len();
        self.arena.extend_from_slice(key);
        self.keys.push((start, self.arena.len()));
        self.next_same_hash.push(u32::MAX);
        Head {
            start,
            len: key.len() as u32,
            id: (self.keys.len() - 1) as u32,
        }
    }
}

/// The table's keys are already hashes.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(bytes);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A fast 64-bit hash of a byte string (multiply-rotate over 8-byte words,
/// then a final avalanche). Not DoS-resistant: the keys come from the
/// caller's own query.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = (h ^ v).wrapping_mul(K).rotate_left(29);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut buf = [0u8; 8];
        buf[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(buf))
            .wrapping_mul(K)
            .rotate_left(29);
    }
    // avalanche (the finaliser of MurmurHash3)
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids_of(table: &mut GroupIds, keys: &[Vec<u8>]) -> Vec<u32> {
        keys.iter().map(|k| table.id(k)).collect()
    }

    /// First-appearance numbering done the obvious way.
    fn reference(keys: &[Vec<u8>]) -> Vec<u32> {
        let mut seen: Vec<&Vec<u8>> = Vec::new();
        keys.iter()
            .map(|k| match seen.iter().position(|s| *s == k) {
                Some(i) => i as u32,
                None => {
                    seen.push(k);
                    (seen.len() - 1) as u32
                }
            })
            .collect()
    }

    #[test]
    fn dense_by_first_appearance() {
        let keys: Vec<Vec<u8>> = ["b", "a", "b", "", "a", "c", ""]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        let mut t = GroupIds::default();
        assert_eq!(ids_of(&mut t, &keys), vec![0, 1, 0, 2, 1, 3, 2]);
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn colliding_hashes_are_told_apart() {
        // every key hashes alike, or by length only
        let keys: Vec<Vec<u8>> = (0..200u32)
            .map(|i| format!("k{}", i % 37).into_bytes())
            .collect();
        let mut all_same = GroupIds::with_hash(|_| 7);
        assert_eq!(ids_of(&mut all_same, &keys), reference(&keys));
        let mut by_len = GroupIds::with_hash(|k| k.len() as u64);
        assert_eq!(ids_of(&mut by_len, &keys), reference(&keys));
    }

    #[test]
    fn hash_depends_on_every_byte_and_the_length() {
        assert_ne!(hash_bytes(b""), hash_bytes(b"\0"));
        assert_ne!(hash_bytes(b"abcdefgh"), hash_bytes(b"abcdefgh\0"));
        assert_ne!(hash_bytes(b"customer-1"), hash_bytes(b"customer-2"));
        assert_ne!(hash_bytes(b"xcustomer-1"), hash_bytes(b"ycustomer-1"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn matches_the_reference(keys in prop::collection::vec(prop::collection::vec(0u8..4, 0..4), 0..80)) {
            let mut t = GroupIds::default();
            prop_assert_eq!(ids_of(&mut t, &keys), reference(&keys));
            let mut weak = GroupIds::with_hash(|k| k.first().copied().unwrap_or(9) as u64);
            prop_assert_eq!(ids_of(&mut weak, &keys), reference(&keys));
        }
    }
}
