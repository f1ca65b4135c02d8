//! What the CLI accepts as a WWID and as an iSCSI target name: only the forms the kernel and
//! the tools print, so a typo is a usage error (exit 2) naming those forms, never a volume
//! that matches nothing (which `detach` would take for "already gone" and call a success).
//!
//! The library's parsers are more lenient on purpose (a `Wwid` also holds whatever a device
//! reports); the CLI checks the shape first and hands the library what it parses.

use lunkit::{Error, Wwid};

/// Every form a WWID may take, said in each refusal.
const WWID_FORMS: &str = "expected naa.<16 or 32 hex digits>, eui.<16, 24 or 32 hex digits> \
     or t10.<vendor text> as sysfs shows it, or multipath's 3<NAA hex>, 2<EUI hex>, \
     1<vendor text> or 8<SCSI name string> (an NVMe namespace is named by --nvme-nqn with \
     --nsid or --nguid)";

/// Every form an iSCSI name may take (RFC 3720 and 3980), said in each refusal.
const ISCSI_FORMS: &str = "expected iqn.yyyy-mm.<reverse domain name>[:<name>], \
     eui.<16 hex digits> or naa.<16 or 32 hex digits>";

fn hex_of_len(s: &str, lens: &[usize]) -> bool {
    lens.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A SCSI name string (designator type 8, SPC-4 7.7.3.11): `iqn.`, `eui.` or `naa.` and
/// the name. Its sysfs form is the string itself.
fn scsi_name_string(s: &str) -> bool {
    ["iqn.", "eui.", "naa."]
        .iter()
        .any(|p| s.strip_prefix(p).is_some_and(|rest| !rest.is_empty()))
}

/// Parses a WWID given by the user (`--wwid`, `--expect-wwid`), in one of the forms the
/// kernel's sysfs `wwid` or multipath-tools print. A multipath `8…` (SCSI name string) is
/// handed to the library in its sysfs form, the string without the `8`, which is what the
/// path devices report.
pub fn wwid(s: &str) -> lunkit::Result<Wwid> {
    let text = |t: &str| !t.is_empty();
    let sysfs = if let Some(h) = s.strip_prefix("naa.") {
        hex_of_len(h, &[16, 32])
    } else if let Some(h) = s.strip_prefix("eui.") {
        hex_of_len(h, &[16, 24, 32])
    } else if let Some(t) = s.strip_prefix("t10.") {
        text(t)
    } else {
        false
    };
    let given = if sysfs {
        s
    } else {
        match s.split_at_checked(1) {
            Some(("3", h)) if hex_of_len(h, &[16, 32]) => s,
            Some(("2", h)) if hex_of_len(h, &[16, 24, 32]) => s,
            Some(("1", t)) if text(t) => s,
            Some(("8", n)) if scsi_name_string(n) => n,
            _ => return Err(Error::invalid("WWID", s, WWID_FORMS)),
        }
    };
    // The library checks the rest (control characters, '/', length).
    given.parse()
}

/// The forms `--expect-wwid` takes: a SCSI LUN's, or an NVMe namespace's as the kernel's
/// `wwid` attribute shows it.
const EXPECT_FORMS: &str = "expected a SCSI LUN's naa.<16 or 32 hex digits>, eui.<16, 24 or \
     32 hex digits>, t10.<vendor text>, 3<NAA hex>, 2<EUI hex>, 1<vendor text> or 8<SCSI \
     name string>, or an NVMe namespace's uuid.<8-4-4-4-12 hex digits>, eui.<hex> or \
     nvme.<vendor id, serial, model and nsid>";

/// Parses `--expect-wwid`: a SCSI WWID ([`wwid`]), or an NVMe namespace's `wwid` as the
/// kernel shows it (`uuid.…`, `eui.…`, `nvme.…`), which an NVMe attach compares.
pub fn expect_wwid(s: &str) -> lunkit::Result<Wwid> {
    if let Ok(w) = wwid(s) {
        return Ok(w);
    }
    let nvme = s
        .strip_prefix("uuid.")
        .is_some_and(|u| u.parse::<lunkit::id::Uuid>().is_ok())
        || s.strip_prefix("nvme.").is_some_and(|t| !t.is_empty());
    if !nvme {
        return Err(Error::invalid("WWID", s, EXPECT_FORMS));
    }
    s.parse()
}

/// Checks an iSCSI target name given by the user (`--iscsi-target`): its form, then what the
/// library checks (printable, no '/', at most 223 bytes).
pub fn iscsi_name(s: &str) -> lunkit::Result<lunkit::id::IscsiName> {
    // The library's type checks the form; the refusal keeps the CLI's words.
    match s.parse::<lunkit::id::IscsiName>() {
        Ok(n) => Ok(n),
        Err(Error::Invalid { reason, .. }) if reason.starts_with("expected") => {
            Err(Error::invalid("iSCSI target name", s, ISCSI_FORMS))
        }
        Err(e) => Err(e),
    }
}

/// Checks an iSCSI portal given by the user (`--portal`): `ADDR:PORT` with an IP address,
/// IPv6 in brackets, as `iscsiadm -m session` and sysfs show it. Sessions are matched by that
/// text, so anything else (a host name, a missing port) would match none.
pub fn iscsi_portal(s: &str) -> lunkit::Result<String> {
    s.parse::<std::net::SocketAddr>().map_err(|_| {
        Error::invalid(
            "iSCSI portal",
            s,
            "expected ADDR:PORT with an IP address (an IPv6 one in brackets), as \
             `iscsiadm -m session` shows it",
        )
    })?;
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wwids_in_every_kernel_and_multipath_form_parse() {
        let naa = "naa.600a098038303053453f463045727a41";
        for (given, sysfs) in [
            (naa, naa),
            ("3600a098038303053453f463045727a41", naa),
            ("naa.33333330000036b0", "naa.33333330000036b0"),
            ("eui.0025385b71b0e7a1", "eui.0025385b71b0e7a1"),
            ("20025385b71b0e7a1", "eui.0025385b71b0e7a1"),
            ("t10.ATA     QEMU HARDDISK", "t10.ATA     QEMU HARDDISK"),
            ("1ATA     QEMU HARDDISK", "t10.ATA     QEMU HARDDISK"),
            (
                "8iqn.2003-01.org.example:lun1",
                "iqn.2003-01.org.example:lun1",
            ),
        ] {
            assert_eq!(wwid(given).unwrap().as_sysfs(), sysfs, "{given}");
        }
    }

    #[test]
    fn wwids_no_kernel_form_matches_are_refused_naming_the_forms() {
        for bad in [
            "foo",
            "",
            "naa.1234",
            "naa.xyz",
            "3xyz",
            "36001405",
            "eui.12",
            "t10.",
            "1",
            "8foo",
            "9600a098038303053453f463045727a41",
            "iqn.2003-01.org.example:x",
            "600a098038303053453f463045727a41",
        ] {
            let e = wwid(bad).unwrap_err().to_string();
            assert!(e.contains("naa.<16 or 32 hex digits>"), "{bad:?}: {e}");
            assert!(e.contains("8<SCSI name string>"), "{bad:?}: {e}");
        }
        // The library's own checks still apply past the form.
        assert!(wwid("t10.a/../b").is_err());
    }

    #[test]
    fn an_expected_wwid_may_be_an_nvme_namespaces_too() {
        for good in [
            "naa.600a098038303053453f463045727a41",
            "uuid.1b4e28ba-2fa1-11d2-883f-b9a761bde3fb",
            "eui.0025385b71b0e7a10025385b71b0e7a1",
            "nvme.1b36-31323334-51454d55204e564d65204374726c-00000001",
        ] {
            assert_eq!(expect_wwid(good).unwrap().as_sysfs(), good);
        }
        for bad in ["foo", "uuid.x", "nvme.", "naa.12"] {
            let e = expect_wwid(bad).unwrap_err().to_string();
            assert!(e.contains("uuid.<8-4-4-4-12 hex digits>"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn iscsi_portals_are_ip_and_port() {
        for good in ["10.0.0.1:3260", "[fd00::1]:3260"] {
            assert_eq!(iscsi_portal(good).unwrap(), good);
        }
        for bad in [
            "foo",
            "10.0.0.1",
            "10.0.0.1:99999",
            "fd00::1:3260",
            "san.example:3260",
        ] {
            let e = iscsi_portal(bad).unwrap_err().to_string();
            assert!(e.contains("expected ADDR:PORT"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn iscsi_names_in_the_three_forms_pass_and_others_are_refused() {
        for good in [
            "iqn.2003-01.org.linux-iscsi.host:sn.1234",
            "iqn.2001-04.com.example",
            "eui.02004567a425678d",
            "naa.52004567ba64678d",
            "naa.62004567ba64678d0123456789abcdef",
        ] {
            assert_eq!(iscsi_name(good).unwrap().as_str(), good);
        }
        for bad in [
            "x",
            "",
            "iqn.x",
            "iqn.2003-13.org.a",
            "iqn.2003-01.",
            "eui.1234",
            "naa.xyz",
            "iqn.2003-01.org.a b",
            "nqn.2014-08.org.a:b",
        ] {
            let e = iscsi_name(bad).unwrap_err().to_string();
            assert!(e.contains("iSCSI"), "{bad:?}: {e}");
        }
        assert!(
            iscsi_name("x")
                .unwrap_err()
                .to_string()
                .contains("iqn.yyyy-mm.<reverse domain name>[:<name>]")
        );
    }
}
