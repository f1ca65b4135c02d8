//! [`Key`]: a reservation key, and the one derived from the node's identity.

use crate::error::{Error, Result};
use crate::root::Root;

/// A persistent-reservation key (SPC's 8-byte RESERVATION KEY).
///
/// Any value can be read back from a device; a node's own key is never 0 (0 is what
/// unregisters), which [`Key::for_node`] and [`Key::from_identity`] guarantee and the calls
/// that register or reserve with it check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub u64);

/// The prefix hashed before the identity, so that lunkit's key of a node is not the same
/// 64 bits another tool would derive from the same machine-id (as systemd asks of users of
/// `/etc/machine-id`: derive, never expose it). Versioned: a new derivation gets a new one.
const DOMAIN: &str = "lunkit-pr-key-v1:";

impl Key {
    /// The node's key, derived from `<root>/etc/machine-id` (systemd's 128-bit machine id,
    /// 32 hex digits, the same across reboots and set at install time): see
    /// [`from_identity`](Self::from_identity) for the function. The same node gets the same
    /// key from every process (a CLI, a plugin after its restart), and two nodes differ
    /// unless their machine-ids do not (cloned images must regenerate theirs).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the file cannot be read (`NotFound` without it),
    /// [`Error::Invalid`] when it is not 32 hex digits (an unset `uninitialized` id, or
    /// empty, as in some containers: mount the host's `/etc/machine-id`).
    pub fn for_node(root: &Root) -> Result<Key> {
        let path = root.etc("machine-id");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let id = text.trim();
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(
                "machine-id",
                id,
                "is not 32 hex digits (an unset or empty /etc/machine-id: run \
                 systemd-machine-id-setup, or mount the host's into the container)",
            ));
        }
        Ok(Key::from_identity(&id.to_ascii_lowercase()))
    }

    /// The key of a node known by `identity` (its machine-id, or a name that is the node's
    /// own for good, such as a Kubernetes node name): FNV-1a 64 (offset basis
    /// `0xcbf29ce484222325`, prime `0x100000001b3`) over the bytes of
    /// `"lunkit-pr-key-v1:"` followed by `identity`; a hash of 0 becomes 1, since 0 is no key.
    /// Fixed here for good: a node's key must not change when lunkit is upgraded, or it
    /// would not find its own registrations.
    pub fn from_identity(identity: &str) -> Key {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in DOMAIN.bytes().chain(identity.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Key(h.max(1))
    }

    /// The 64 bits.
    pub fn get(self) -> u64 {
        self.0
    }

    /// Whether it is 0: no key (what unregisters).
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `Ok(self)` unless it is 0, for a call that registers or reserves with it.
    pub(crate) fn nonzero(self, what: &'static str) -> Result<Key> {
        if self.is_zero() {
            return Err(Error::invalid(what, "0", "0 is no key (it unregisters)"));
        }
        Ok(self)
    }
}

impl std::fmt::Display for Key {
    /// `0x` and 16 hex digits, as `sg_persist` prints keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

impl std::str::FromStr for Key {
    type Err = Error;

    /// `0x` and up to 16 hex digits, or a decimal number.
    fn from_str(s: &str) -> Result<Key> {
        let t = s.trim();
        let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(hex) if !hex.is_empty() && hex.len() <= 16 => u64::from_str_radix(hex, 16),
            Some(_) => return Err(Error::invalid("key", s, "is not 1 to 16 hex digits")),
            None => t.parse::<u64>(),
        };
        parsed
            .map(Key)
            .map_err(|_| Error::invalid("key", s, "is not 0x and hex digits, or a number"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory removed when dropped.
    struct Dir(std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn root_with(id: Option<&str>) -> (Dir, Root) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lunkit-pr-key-{}-{n}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        if let Some(id) = id {
            std::fs::write(dir.join("etc/machine-id"), id).unwrap();
        }
        let root = Root::new(&dir);
        (Dir(dir), root)
    }

    #[test]
    fn the_node_key_is_fixed_by_its_machine_id() {
        let (_d, root) = root_with(Some("4d0c8c7b1a9e4f0e8e2b6f2a1c3d5e7f\n"));
        let k = Key::for_node(&root).unwrap();
        // The derivation is frozen: this value must never change (a node would lose its
        // registrations on upgrade). Computed by hand from the documented function.
        assert_eq!(k, Key::from_identity("4d0c8c7b1a9e4f0e8e2b6f2a1c3d5e7f"));
        assert_eq!(
            k.get(),
            fnv_by_hand("lunkit-pr-key-v1:4d0c8c7b1a9e4f0e8e2b6f2a1c3d5e7f")
        );
        assert_eq!(Key::for_node(&root).unwrap(), k, "the same on every read");
        // Upper-case hex is the same id.
        let (_d2, upper) = root_with(Some("4D0C8C7B1A9E4F0E8E2B6F2A1C3D5E7F"));
        assert_eq!(Key::for_node(&upper).unwrap(), k);
        let (_d3, other) = root_with(Some("4d0c8c7b1a9e4f0e8e2b6f2a1c3d5e70"));
        assert_ne!(Key::for_node(&other).unwrap(), k);
        assert!(!k.is_zero());
        // Not the machine-id's bits, and not an unprefixed hash of it.
        assert_ne!(k.get(), fnv_by_hand("4d0c8c7b1a9e4f0e8e2b6f2a1c3d5e7f"));
    }

    /// FNV-1a 64 written out again from its definition, to pin `from_identity`.
    fn fnv_by_hand(s: &str) -> u64 {
        let mut h = 14_695_981_039_346_656_037u64;
        for b in s.as_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(1_099_511_628_211);
        }
        h
    }

    #[test]
    fn a_missing_or_unset_machine_id_is_refused_typed() {
        let (_d, none) = root_with(None);
        assert_eq!(
            Key::for_node(&none).unwrap_err().kind(),
            crate::ErrorKind::NotFound
        );
        for bad in [
            "",
            "uninitialized\n",
            "4d0c8c7b",
            "zz0c8c7b1a9e4f0e8e2b6f2a1c3d5e7f",
        ] {
            let (_d, root) = root_with(Some(bad));
            let e = Key::for_node(&root).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Invalid, "{bad:?}: {e}");
        }
    }

    #[test]
    fn keys_parse_and_print_as_sg_persist_does() {
        assert_eq!("0x1a".parse::<Key>().unwrap(), Key(0x1a));
        assert_eq!("26".parse::<Key>().unwrap(), Key(26));
        assert_eq!(Key(0x1a).to_string(), "0x000000000000001a");
        assert_eq!(Key(0x1a).to_string().parse::<Key>().unwrap(), Key(0x1a));
        for bad in ["0x", "0x12345678901234567", "-1", "key", ""] {
            assert!(bad.parse::<Key>().is_err(), "{bad:?}");
        }
        assert!(Key(0).nonzero("key").is_err());
        assert_eq!(Key(1).nonzero("key").unwrap(), Key(1));
    }
}
