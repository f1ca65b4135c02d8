//! The Device Identification VPD page (0x83, SPC-4 7.8.6): what a LUN says it is. Pure
//! parsing; the page comes from sysfs (`vpd_pg83`, the kernel's copy from the last probe or
//! rescan) or from an INQUIRY sent now ([`super::sg_io::inquiry_vpd`]).
//!
//! The kernel's `wwid` attribute is made from one of the page's designators that name the
//! logical unit (association 0). Comparing those designators, all of them, between the
//! kernel's copy and the device's answer now tells whether the LUN behind a device changed
//! since the kernel last looked, without the rescan that would overwrite the kernel's copy:
//! the identity under which the device's users opened it.

use std::fmt;

/// The page code of the Device Identification VPD page.
pub const DEVICE_IDENTIFICATION: u8 = 0x83;

/// Designator types (SPC-4 table 459) that the kernel builds a `wwid` from.
const T10_VENDOR: u8 = 0x1;
const EUI64: u8 = 0x2;
const NAA: u8 = 0x3;
const SCSI_NAME: u8 = 0x8;

/// One designator of the logical unit (association 0).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Designator {
    /// The designator type (low nibble of byte 1): 1 T10 vendor, 2 EUI-64, 3 NAA, 8 SCSI name
    /// string, others kept as they come.
    pub kind: u8,
    /// The code set (low nibble of byte 0): 1 binary, 2 ASCII, 3 UTF-8.
    pub code_set: u8,
    /// The designator's bytes.
    pub value: Vec<u8>,
}

impl Designator {
    /// The designator as the kernel's `wwid` attribute writes it (`naa.` or `eui.` and lower
    /// hex, `t10.` and the text, a SCSI name string as it is); `None` for a type the kernel
    /// does not use.
    fn as_wwid(&self) -> Option<String> {
        let hex = || -> String { self.value.iter().map(|b| format!("{b:02x}")).collect() };
        let text = || {
            String::from_utf8_lossy(&self.value)
                .trim_end_matches('\0')
                .to_owned()
        };
        match self.kind {
            NAA => Some(format!("naa.{}", hex())),
            EUI64 => Some(format!("eui.{}", hex())),
            SCSI_NAME => Some(text()),
            T10_VENDOR => Some(format!("t10.{}", text())),
            _ => None,
        }
    }

    /// Which designator names the LUN best, as the kernel ranks them: NAA, then EUI-64, then
    /// a SCSI name string, then the T10 vendor ID; the longer first within a type.
    fn rank(&self) -> (u8, usize) {
        let by_kind = match self.kind {
            NAA => 4,
            EUI64 => 3,
            SCSI_NAME => 2,
            T10_VENDOR => 1,
            _ => 0,
        };
        (by_kind, self.value.len())
    }
}

/// What a malformed page is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VpdError {
    /// Shorter than its 4-byte header.
    Short(usize),
    /// Another page than 0x83.
    Page(u8),
}

impl fmt::Display for VpdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VpdError::Short(n) => write!(f, "VPD page of {n} bytes, shorter than its header"),
            VpdError::Page(p) => write!(f, "VPD page 0x{p:02x}, not 0x83"),
        }
    }
}

/// The logical unit's identity in a Device Identification page: its designators of
/// association 0, in a fixed order (sorted), so that two answers of the same LUN compare
/// equal whatever order the device lists them in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuIdentity(pub Vec<Designator>);

impl LuIdentity {
    /// Parses `page`, the whole page as INQUIRY returns it. Descriptors past the page's
    /// stated length or past the end of `page` (a truncated reply) are not read; one whose
    /// stated length runs past the end ends the list.
    pub fn parse(page: &[u8]) -> Result<LuIdentity, VpdError> {
        if page.len() < 4 {
            return Err(VpdError::Short(page.len()));
        }
        if page[1] != DEVICE_IDENTIFICATION {
            return Err(VpdError::Page(page[1]));
        }
        let stated = usize::from(u16::from_be_bytes([page[2], page[3]]));
        let end = page.len().min(4 + stated);
        let mut found = Vec::new();
        let mut at = 4;
        while at + 4 <= end {
            let len = usize::from(page[at + 3]);
            let Some(value) = page
                .get(at + 4..at + 4 + len)
                .filter(|_| at + 4 + len <= end)
            else {
                break;
            };
            let association = (page[at + 1] >> 4) & 0x3;
            if association == 0 {
                found.push(Designator {
                    kind: page[at + 1] & 0xf,
                    code_set: page[at] & 0xf,
                    value: value.to_vec(),
                });
            }
            at += 4 + len;
        }
        found.sort();
        Ok(LuIdentity(found))
    }

    /// Whether the page named the logical unit at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The identity as a `wwid` attribute would show it, for messages: the best-ranked
    /// designator; `None` when none is of a type the kernel uses.
    pub fn wwid(&self) -> Option<String> {
        self.0
            .iter()
            .filter(|d| d.as_wwid().is_some())
            .max_by_key(|d| d.rank())
            .and_then(Designator::as_wwid)
    }
}

impl fmt::Display for LuIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.wwid() {
            Some(w) => f.write_str(&w),
            None => write!(f, "{} designator(s) of no WWID form", self.0.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A designation descriptor: code set, association, type, value.
    fn desc(code_set: u8, association: u8, kind: u8, value: &[u8]) -> Vec<u8> {
        let mut d = vec![code_set, (association << 4) | kind, 0, value.len() as u8];
        d.extend_from_slice(value);
        d
    }

    fn page(descs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = descs.concat();
        let mut p = vec![0, 0x83];
        p.extend_from_slice(&(body.len() as u16).to_be_bytes());
        p.extend(body);
        p
    }

    /// LIO's page: NAA and T10 of the LU, then the target port's designators.
    fn lio(naa_tail: u8) -> Vec<Vec<u8>> {
        let naa = [
            0x60, 0x01, 0x40, 0x5a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, naa_tail,
        ];
        vec![
            desc(1, 0, NAA, &naa),
            desc(2, 0, T10_VENDOR, b"LIO-ORG block1  1234"),
            desc(1, 1, 0x4, &[0, 0, 0, 1]),
            desc(3, 1, SCSI_NAME, b"iqn.2003-01.org.x,t,0x0001\0\0"),
        ]
    }

    #[test]
    fn the_lus_designators_name_it_and_the_ports_do_not() {
        let id = LuIdentity::parse(&page(&lio(7))).unwrap();
        assert_eq!(id.0.len(), 2, "{id:?}");
        assert_eq!(id.wwid().unwrap(), "naa.6001405a000000000000000000000007");
        // Another port of the same LU: the same identity.
        let mut other_port = lio(7);
        other_port[2] = desc(1, 1, 0x4, &[0, 0, 0, 2]);
        other_port.swap(0, 1);
        assert_eq!(LuIdentity::parse(&page(&other_port)).unwrap(), id);
        // Another LU behind the same port: another identity.
        assert_ne!(LuIdentity::parse(&page(&lio(8))).unwrap(), id);
    }

    #[test]
    fn ranks_follow_the_kernel_and_unknown_types_show_a_count() {
        let t10 = page(&[desc(2, 0, T10_VENDOR, b"VEND    PRODUCT 42")]);
        assert_eq!(
            LuIdentity::parse(&t10).unwrap().wwid().unwrap(),
            "t10.VEND    PRODUCT 42"
        );
        let eui = page(&[desc(2, 0, T10_VENDOR, b"x"), desc(1, 0, EUI64, &[0xab; 8])]);
        assert_eq!(
            LuIdentity::parse(&eui).unwrap().wwid().unwrap(),
            "eui.abababababababab"
        );
        let odd = LuIdentity::parse(&page(&[desc(1, 0, 0xa, &[1, 2])])).unwrap();
        assert_eq!(odd.wwid(), None);
        assert_eq!(odd.to_string(), "1 designator(s) of no WWID form");
    }

    #[test]
    fn truncated_and_foreign_pages_are_typed_never_a_panic() {
        assert_eq!(LuIdentity::parse(&[0, 0x83]), Err(VpdError::Short(2)));
        assert_eq!(
            LuIdentity::parse(&[0, 0x80, 0, 0]),
            Err(VpdError::Page(0x80))
        );
        let full = page(&lio(7));
        // Cut anywhere: whole descriptors before the cut are read, nothing after.
        for cut in 4..full.len() {
            let id = LuIdentity::parse(&full[..cut]).unwrap();
            assert!(id.0.len() <= 2, "{cut}: {id:?}");
        }
        // A stated length past the end, and a descriptor longer than the page.
        let mut long = full.clone();
        long[3] = 0xff;
        assert_eq!(LuIdentity::parse(&long).unwrap().0.len(), 2);
        let lying = [0, 0x83, 0, 8, 1, 0x03, 0, 200, 1, 2, 3, 4];
        assert!(LuIdentity::parse(&lying).unwrap().is_empty());
    }
}
