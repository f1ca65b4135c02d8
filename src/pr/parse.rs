//! Pure decoding: what an `IOC_PR_*` ioctl returned ([`Status`]), and PERSISTENT RESERVE
//! IN's READ KEYS ([`ReadKeys`]) and READ RESERVATION ([`ReadReservation`]) parameter data
//! (SPC-4 6.15.2, 6.15.3). Never panics, whatever the bytes.

use super::{Key, ReservationType};

/// The SAM status RESERVATION CONFLICT.
pub(crate) const RESERVATION_CONFLICT: u8 = 0x18;

/// What an `IOC_PR_*` ioctl's non-negative return value says (see the module docs of
/// [`crate::pr`] for why it is positive, and how 6.1 and 6.3+ encode it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// 0: done.
    Done,
    /// The SAM status RESERVATION CONFLICT (0x18), on either kernel.
    Conflict,
    /// Anything else the device or the transport answered: the SAM status (low byte) and
    /// the host byte (bits 16-23: `DID_NO_CONNECT` 1, `DID_TRANSPORT_DISRUPTED` 0x0e,
    /// `DID_TRANSPORT_FAILFAST` 0x0f...).
    Failed {
        /// The SAM status (2: CHECK CONDITION, `PR_STS_IOERR`).
        status: u8,
        /// The host byte.
        host: u8,
    },
}

impl Status {
    /// Decodes the ioctl's return value `ret` (>= 0; a negative one is an errno, which the
    /// caller handles before).
    pub fn from_ioctl(ret: i32) -> Status {
        if ret == 0 {
            return Status::Done;
        }
        let status = (ret & 0xff) as u8;
        let host = ((ret >> 16) & 0xff) as u8;
        if status == RESERVATION_CONFLICT {
            return Status::Conflict;
        }
        Status::Failed { status, host }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Done => f.write_str("done"),
            Status::Conflict => f.write_str("RESERVATION CONFLICT"),
            Status::Failed { status, host } => {
                let why = match host {
                    0x01 => " (the path failed)",
                    0x0e => " (the transport was disrupted; retry)",
                    0x0f => " (the path failed fast)",
                    _ if *status == 0x02 => " (CHECK CONDITION)",
                    _ => "",
                };
                write!(f, "SCSI status {status:#04x}, host byte {host:#04x}{why}")
            }
        }
    }
}

/// Why PERSISTENT RESERVE IN data could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Fewer than the 8 header bytes (PRGENERATION, ADDITIONAL LENGTH).
    Short {
        /// How many bytes there were.
        len: usize,
    },
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Short { len } => write!(
                f,
                "PERSISTENT RESERVE IN data cut short at {len} bytes (8 needed for its header)"
            ),
        }
    }
}

/// The header both answers share: PRGENERATION and ADDITIONAL LENGTH.
fn header(buf: &[u8]) -> Result<(u32, usize), ParseError> {
    if buf.len() < 8 {
        return Err(ParseError::Short { len: buf.len() });
    }
    let generation = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let additional = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    Ok((
        generation,
        usize::try_from(additional).unwrap_or(usize::MAX),
    ))
}

/// READ KEYS: the generation and every registered key (one per registered I_T nexus, so a
/// key registered through two paths is listed twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadKeys {
    /// PRGENERATION: counts the registrations and reservation changes of the LUN.
    pub generation: u32,
    /// The keys the data held, in the device's order.
    pub keys: Vec<Key>,
    /// ADDITIONAL LENGTH: how many bytes of keys the device has, whatever the buffer held.
    pub stated: usize,
}

impl ReadKeys {
    /// Decodes READ KEYS data, as much of it as `buf` holds: a list longer than the buffer
    /// (ADDITIONAL LENGTH says more than came) gives the whole keys that came, and
    /// [`needed`](Self::needed) says how long a buffer the whole list wants; a partial key
    /// at the end is left out.
    ///
    /// # Errors
    ///
    /// [`ParseError::Short`] under 8 bytes.
    pub fn parse(buf: &[u8]) -> Result<ReadKeys, ParseError> {
        let (generation, stated) = header(buf)?;
        let body = &buf[8..];
        let have = body.len().min(stated);
        let keys = body[..have]
            .chunks_exact(8)
            .map(|c| Key(u64::from_be_bytes(c.try_into().unwrap_or([0; 8]))))
            .collect();
        Ok(ReadKeys {
            generation,
            keys,
            stated,
        })
    }

    /// Whether the list is whole: every key the device stated came.
    pub fn complete(&self) -> bool {
        self.keys.len() >= self.stated / 8
    }

    /// The buffer the whole list needs, when it did not come whole.
    pub fn needed(&self) -> Option<usize> {
        (!self.complete()).then(|| self.stated.saturating_add(8))
    }

    /// Whether `key` is registered through some I_T nexus.
    pub fn contains(&self, key: Key) -> bool {
        self.keys.contains(&key)
    }
}

/// The reservation READ RESERVATION reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The holder's key (0 under an all-registrants type, held by every registrant).
    pub key: Key,
    /// Its type; `None` for a code that is no SPC-3 type (the raw code is
    /// [`type_code`](Self::type_code)).
    pub kind: Option<ReservationType>,
    /// The TYPE field as sent.
    pub type_code: u8,
    /// The SCOPE field (0: the logical unit; the others are obsolete).
    pub scope: u8,
}

/// READ RESERVATION: the generation and the reservation, if one is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadReservation {
    /// PRGENERATION.
    pub generation: u32,
    /// The reservation; `None` when none is held (or when its descriptor did not come
    /// whole: then [`complete`](Self::complete) is false).
    pub holder: Option<Holder>,
    /// ADDITIONAL LENGTH: 0 without a reservation, 16 with one.
    pub stated: usize,
    /// Whether the descriptor the device stated came whole.
    pub complete: bool,
}

impl ReadReservation {
    /// Decodes READ RESERVATION data: with ADDITIONAL LENGTH 0 no reservation is held; with
    /// 16 or more, the descriptor after the header is the reservation (key, then SCOPE and
    /// TYPE in byte 13 of it). A descriptor cut short gives no holder and `complete` false.
    ///
    /// # Errors
    ///
    /// [`ParseError::Short`] under 8 bytes.
    pub fn parse(buf: &[u8]) -> Result<ReadReservation, ParseError> {
        let (generation, stated) = header(buf)?;
        let desc = buf.get(8..24).filter(|_| stated >= 16);
        let holder = desc.map(|d| {
            let type_code = d[13] & 0x0f;
            Holder {
                key: Key(u64::from_be_bytes(d[..8].try_into().unwrap_or([0; 8]))),
                kind: ReservationType::from_spc_code(type_code),
                type_code,
                scope: d[13] >> 4,
            }
        });
        Ok(ReadReservation {
            generation,
            holder,
            stated,
            complete: stated == 0 || holder.is_some(),
        })
    }

    /// The buffer the descriptor needs, when it did not come whole.
    pub fn needed(&self) -> Option<usize> {
        (!self.complete).then(|| self.stated.saturating_add(8))
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
