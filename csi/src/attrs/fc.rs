//! A Fibre Channel volume's attributes (the in-tree FC volume's keys).

// The parts of the attributes module share its imports and helpers.
use super::*;

/// A Fibre Channel LUN, as its attributes name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcVolume {
    /// The target's port names, sorted, each once.
    pub wwpns: Vec<lunkit::Wwn>,
    /// The LUN.
    pub lun: u64,
    /// The WWID the LUN must report.
    pub wwid: Option<Wwid>,
    /// `fencing`, `fencingPreempt`.
    pub fencing: Fencing,
}

/// Reads an FC volume from its attributes.
pub fn parse_fc(volume_id: &str, ctx: &HashMap<String, String>) -> Result<FcVolume> {
    let bad = |key: &str, why: String| {
        Error::InvalidArgument(format!("volume {volume_id}: volume attribute {key}: {why}"))
    };
    let get = |key: &str| ctx.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    let list = get("targetWWNs").ok_or_else(|| bad("targetWWNs", "missing".into()))?;
    let names: Vec<String> = if list.starts_with('[') {
        serde_json::from_str(list)
            .map_err(|e| bad("targetWWNs", format!("not a JSON array of strings: {e}")))?
    } else {
        list.split(',').map(str::to_owned).collect()
    };
    let wwpns = names
        .iter()
        .map(|n| n.trim().parse::<lunkit::Wwn>())
        .collect::<lunkit::Result<Vec<_>>>()
        .and_then(|w| lunkit::fc::check_target_ports(&w))
        .map_err(|e| bad("targetWWNs", e.to_string()))?;
    let lun_text = get("lun").ok_or_else(|| bad("lun", "missing".into()))?;
    let lun = lun_number(lun_text)
        .ok_or_else(|| bad("lun", format!("{lun_text:?} is not a LUN number")))?;
    let wwid = match get("wwid") {
        None => None,
        Some(w) => Some(w.parse::<Wwid>().map_err(|e| bad("wwid", e.to_string()))?),
    };
    let fencing = parse_fencing(volume_id, ctx)?;
    Ok(FcVolume {
        wwpns,
        lun,
        wwid,
        fencing,
    })
}
