use super::*;

/// READ KEYS data: generation, ADDITIONAL LENGTH `stated`, and `keys`.
fn keys_data(generation: u32, stated: u32, keys: &[u64]) -> Vec<u8> {
    let mut b = generation.to_be_bytes().to_vec();
    b.extend(stated.to_be_bytes());
    for k in keys {
        b.extend(k.to_be_bytes());
    }
    b
}

/// READ RESERVATION data with a reservation of `key`, scope 0, SPC type `code`.
fn held(generation: u32, key: u64, code: u8) -> Vec<u8> {
    let mut b = generation.to_be_bytes().to_vec();
    b.extend(16u32.to_be_bytes());
    b.extend(key.to_be_bytes());
    b.extend([0, 0, 0, 0, 0, code, 0, 0]);
    b
}

#[test]
fn read_keys_lists_every_registration_in_order() {
    let k = ReadKeys::parse(&keys_data(7, 24, &[0xa, 0xb, 0xa])).unwrap();
    assert_eq!(k.generation, 7);
    assert_eq!(k.keys, [Key(0xa), Key(0xb), Key(0xa)]);
    assert!(k.complete() && k.needed().is_none());
    assert!(k.contains(Key(0xb)) && !k.contains(Key(0xc)));
    let none = ReadKeys::parse(&keys_data(0, 0, &[])).unwrap();
    assert!(none.keys.is_empty() && none.complete());
    // Bytes past ADDITIONAL LENGTH (the rest of the allocation) are no keys.
    let mut pad = keys_data(1, 8, &[0xa]);
    pad.extend([0xff; 16]);
    assert_eq!(ReadKeys::parse(&pad).unwrap().keys, [Key(0xa)]);
}

#[test]
fn a_list_longer_than_the_buffer_asks_for_more() {
    // The device has 4 keys (32 bytes) and the buffer held 2 and a half.
    let mut b = keys_data(3, 32, &[1, 2]);
    b.extend([0x99; 4]);
    let k = ReadKeys::parse(&b).unwrap();
    assert_eq!(k.keys, [Key(1), Key(2)]);
    assert!(!k.complete());
    assert_eq!(k.needed(), Some(40));
    // An absurd length is bounded by the caller, not trusted here: no panic, no alloc.
    let k = ReadKeys::parse(&keys_data(3, u32::MAX, &[1])).unwrap();
    assert_eq!(k.keys, [Key(1)]);
    assert!(k.needed().unwrap() > 1 << 31);
}

#[test]
fn short_data_is_typed() {
    for len in 0..8 {
        let b = vec![0u8; len];
        assert_eq!(ReadKeys::parse(&b), Err(ParseError::Short { len }));
        assert_eq!(ReadReservation::parse(&b), Err(ParseError::Short { len }));
    }
    assert!(ParseError::Short { len: 3 }.to_string().contains("3 bytes"));
}

#[test]
fn read_reservation_gives_holder_scope_and_type() {
    let r = ReadReservation::parse(&held(9, 0xabc, 5)).unwrap();
    assert_eq!(r.generation, 9);
    let h = r.holder.unwrap();
    assert_eq!(h.key, Key(0xabc));
    assert_eq!(h.kind, Some(ReservationType::WriteExclusiveRegistrantsOnly));
    assert_eq!((h.type_code, h.scope), (5, 0));
    assert!(r.complete && r.needed().is_none());
    // SCOPE is the high nibble; an unknown TYPE is kept raw.
    let mut b = held(1, 1, 0x12);
    b[21] = 0x12;
    let h = ReadReservation::parse(&b).unwrap().holder.unwrap();
    assert_eq!((h.scope, h.type_code, h.kind), (1, 2, None));
    // No reservation.
    let none = ReadReservation::parse(&keys_data(4, 0, &[])).unwrap();
    assert_eq!((none.holder, none.complete), (None, true));
}

#[test]
fn a_cut_reservation_is_not_taken_for_none() {
    let b = held(2, 0xabc, 1);
    for len in 8..24 {
        let r = ReadReservation::parse(&b[..len]).unwrap();
        assert_eq!(r.holder, None, "{len}");
        assert!(!r.complete, "{len}");
        assert_eq!(r.needed(), Some(24));
    }
}

#[test]
fn ioctl_returns_decode_on_6_1_and_6_12() {
    assert_eq!(Status::from_ioctl(0), Status::Done);
    // 6.3+: PR_STS_RESERVATION_CONFLICT; 6.1: DID_NEXUS_FAILURE << 16 | 0x18.
    assert_eq!(Status::from_ioctl(0x18), Status::Conflict);
    assert_eq!(Status::from_ioctl(0x11_0018), Status::Conflict);
    // PR_STS_IOERR, PR_STS_PATH_FAILED, and 6.1's raw CHECK CONDITION.
    assert_eq!(
        Status::from_ioctl(0x2),
        Status::Failed { status: 2, host: 0 }
    );
    let path = Status::from_ioctl(0x1_0000);
    assert_eq!(path, Status::Failed { status: 0, host: 1 });
    assert!(path.to_string().contains("path failed"), "{path}");
    assert_eq!(
        Status::from_ioctl(0xe_0000),
        Status::Failed {
            status: 0,
            host: 0x0e
        }
    );
}
