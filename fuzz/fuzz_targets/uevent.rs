//! Kernel uevent datagrams: `lunkit::uevent::Uevent::parse`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::uevent::Uevent;

fuzz_target!(|data: &[u8]| {
    let Ok(ev) = Uevent::parse(data) else {
        return;
    };
    assert!(!ev.action.as_str().is_empty());
    assert!(ev.devpath.starts_with('/'));
    // The typed fields are the last value of their key, as the parser assigns them.
    let last = |key: &str| {
        ev.env
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(
        last("SEQNUM").map(|s| s.parse::<u64>().unwrap()),
        Some(ev.seqnum)
    );
    assert_eq!(last("SUBSYSTEM"), ev.subsystem.as_deref());
    assert_eq!(last("DEVTYPE"), ev.devtype.as_deref());
    assert_eq!(last("DEVNAME"), ev.devname.as_deref());
    // Formatted back as the kernel would send it, it parses to the same event.
    let again = lunkit_fuzz::format_uevent(&ev);
    assert_eq!(Uevent::parse(&again).unwrap(), ev);
});
