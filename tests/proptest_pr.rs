//! Property tests of the PERSISTENT RESERVE IN parsers (`lunkit::pr`): data written the way
//! SPC-4 6.15.2 and 6.15.3 lay it out parses back to the same keys and reservation, however
//! the allocation cut it; and no bytes make a parser panic or invent a key.

use lunkit::pr::{Key, ReadKeys, ReadReservation, ReservationType, Status};
use proptest::prelude::*;

/// READ KEYS data as a device writes it, for an allocation of `alloc` bytes: the header
/// always states the whole list, the bytes stop at the allocation.
fn read_keys_data(generation: u32, keys: &[u64], alloc: usize) -> Vec<u8> {
    let mut b = generation.to_be_bytes().to_vec();
    b.extend(((keys.len() * 8) as u32).to_be_bytes());
    for k in keys {
        b.extend(k.to_be_bytes());
    }
    b.truncate(alloc.max(8));
    b
}

proptest! {
    #[test]
    fn read_keys_parses_back_whole_or_asks_for_the_rest(
        generation in any::<u32>(),
        keys in prop::collection::vec(any::<u64>(), 0..40),
        alloc in 8usize..400,
    ) {
        let data = read_keys_data(generation, &keys, alloc);
        let k = ReadKeys::parse(&data).unwrap();
        prop_assert_eq!(k.generation, generation);
        let fit = (data.len() - 8) / 8;
        let want: Vec<Key> = keys.iter().take(fit).map(|&k| Key(k)).collect();
        prop_assert_eq!(&k.keys, &want);
        if fit >= keys.len() {
            prop_assert!(k.complete() && k.needed().is_none());
        } else {
            // Reading again with the length asked for gives the whole list.
            let n = k.needed().unwrap();
            prop_assert_eq!(n, 8 + keys.len() * 8);
            let again = ReadKeys::parse(&read_keys_data(generation, &keys, n)).unwrap();
            prop_assert!(again.complete());
            prop_assert_eq!(again.keys.len(), keys.len());
        }
    }

    #[test]
    fn read_reservation_parses_back(
        generation in any::<u32>(),
        key in any::<u64>(),
        t in 0usize..6,
        scope in 0u8..16,
    ) {
        let kind = ReservationType::ALL[t];
        let mut b = generation.to_be_bytes().to_vec();
        b.extend(16u32.to_be_bytes());
        b.extend(key.to_be_bytes());
        b.extend([0, 0, 0, 0, 0, scope << 4 | kind.spc_code(), 0, 0]);
        let r = ReadReservation::parse(&b).unwrap();
        let h = r.holder.unwrap();
        prop_assert_eq!((r.generation, h.key, h.kind, h.scope), (generation, Key(key), Some(kind), scope));
        prop_assert!(r.complete);
    }

    #[test]
    fn no_bytes_make_a_parser_panic_or_invent_a_key(data in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(k) = ReadKeys::parse(&data) {
            prop_assert!(8 + k.keys.len() * 8 <= data.len());
            prop_assert!(k.keys.len() * 8 <= k.stated);
        }
        if let Ok(r) = ReadReservation::parse(&data) {
            prop_assert_eq!(r.holder.is_some(), data.len() >= 24 && r.stated >= 16);
        }
    }

    #[test]
    fn a_conflict_is_the_status_byte_whatever_the_host_byte(host in 0i32..256, status in 0i32..256) {
        let s = Status::from_ioctl(host << 16 | status);
        prop_assert_eq!(s == Status::Conflict, status == 0x18);
        prop_assert_eq!(s == Status::Done, host == 0 && status == 0);
    }
}
