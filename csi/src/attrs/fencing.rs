//! `fencing` and `fencingPreempt`: whether the array keeps a second node from writing to the
//! volume (SCSI-3 persistent reservations, [`crate::fence`]), and what a stage does when
//! another node's key holds the reservation.

// The parts of the attributes module share its imports and helpers.
use super::*;

/// How a volume is kept from being written by two nodes at once (`fencing`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Fencing {
    /// `none` (the default): nothing is registered or reserved.
    #[default]
    None,
    /// `scsi-pr`: SCSI-3 persistent reservations. The node's key is registered on every
    /// path; a single-node volume is reserved *Write Exclusive, Registrants Only*, a
    /// multi-node one *Write Exclusive, All Registrants*.
    ScsiPr {
        /// What a stage does when another key holds the reservation (`fencingPreempt`).
        preempt: Preempt,
    },
}

/// What a stage of a single-node volume does when another node's key holds its reservation
/// (`fencingPreempt`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Preempt {
    /// `always` (the default): PREEMPT AND ABORT that key. The CO gave the volume to this
    /// node; the other node's writes must fail from now on.
    #[default]
    Always,
    /// `never`: refuse the stage, FAILED_PRECONDITION naming the holding key.
    Never,
}

/// Reads `fencing` and `fencingPreempt` (both optional; `fencingPreempt` is checked even
/// when `fencing` is `none`, so that a misspelt value is never silently ignored). Any other
/// value is INVALID_ARGUMENT naming it.
pub fn parse_fencing(volume_id: &str, ctx: &HashMap<String, String>) -> Result<Fencing> {
    let get = |key: &str| ctx.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    let preempt = match get("fencingPreempt") {
        None | Some("always") => Preempt::Always,
        Some("never") => Preempt::Never,
        Some(v) => {
            return Err(bad_attr(
                volume_id,
                "fencingPreempt",
                format!("{v:?} is neither always nor never"),
            ));
        }
    };
    match get("fencing") {
        None | Some("none") => Ok(Fencing::None),
        Some("scsi-pr") => Ok(Fencing::ScsiPr { preempt }),
        Some(v) => Err(bad_attr(
            volume_id,
            "fencing",
            format!("{v:?} is neither none nor scsi-pr"),
        )),
    }
}

/// Refuses `fencing: scsi-pr` on a volume of a transport that is not SCSI (an NVMe
/// namespace): lunkit reads reservations back with SCSI's PERSISTENT RESERVE IN only.
pub fn scsi_only(volume_id: &str, ctx: &HashMap<String, String>, transport: &str) -> Result<()> {
    match parse_fencing(volume_id, ctx)? {
        Fencing::None => Ok(()),
        Fencing::ScsiPr { .. } => Err(bad_attr(
            volume_id,
            "fencing",
            format!(
                "\"scsi-pr\" is for SCSI volumes (iSCSI, FC) only; this is an {transport} \
                 volume"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn fencing_defaults_to_none_and_preempt_to_always() {
        let always = Fencing::ScsiPr {
            preempt: Preempt::Always,
        };
        let cases = [
            (ctx(&[]), Fencing::None),
            (ctx(&[("fencing", "none")]), Fencing::None),
            (ctx(&[("fencing", " ")]), Fencing::None),
            (ctx(&[("fencingPreempt", "never")]), Fencing::None),
            (ctx(&[("fencing", "scsi-pr")]), always),
            (
                ctx(&[("fencing", " scsi-pr "), ("fencingPreempt", "always")]),
                always,
            ),
            (
                ctx(&[("fencing", "scsi-pr"), ("fencingPreempt", "never")]),
                Fencing::ScsiPr {
                    preempt: Preempt::Never,
                },
            ),
        ];
        for (m, want) in cases {
            assert_eq!(parse_fencing("pv", &m).unwrap(), want, "{m:?}");
        }
    }

    #[test]
    fn other_values_are_refused_naming_them() {
        for (m, key, value) in [
            (ctx(&[("fencing", "scsi3")]), "fencing", "scsi3"),
            (ctx(&[("fencing", "SCSI-PR")]), "fencing", "SCSI-PR"),
            (
                ctx(&[("fencing", "scsi-pr"), ("fencingPreempt", "yes")]),
                "fencingPreempt",
                "yes",
            ),
            (
                ctx(&[("fencingPreempt", "sometimes")]),
                "fencingPreempt",
                "sometimes",
            ),
        ] {
            let e = parse_fencing("pv-1", &m).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
            let msg = e.to_string();
            assert!(msg.contains("volume pv-1"), "{msg}");
            assert!(msg.contains(&format!("attribute {key}:")), "{msg}");
            assert!(msg.contains(&format!("{value:?}")), "{msg}");
        }
    }

    #[test]
    fn scsi_pr_is_refused_on_other_transports_only_when_asked_for() {
        assert!(scsi_only("pv", &ctx(&[]), "NVMe").is_ok());
        assert!(scsi_only("pv", &ctx(&[("fencing", "none")]), "NVMe").is_ok());
        let e = scsi_only("pv", &ctx(&[("fencing", "scsi-pr")]), "NVMe").unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.to_string().contains("SCSI volumes"), "{e}");
        assert!(e.to_string().contains("NVMe"), "{e}");
        let bad = scsi_only("pv", &ctx(&[("fencing", "nvme-pr")]), "NVMe").unwrap_err();
        assert!(bad.to_string().contains("\"nvme-pr\""), "{bad}");
    }
}
