//! The Discovery Log Page parser: whatever a discovery controller answers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::nvme::discovery::{self, ENTRY_LEN, HEADER_LEN, MAX_RECORDS, TransportType};
use lunkit_fuzz::format_discovery_entry;

fuzz_target!(|data: &[u8]| {
    let Ok(log) = discovery::Log::parse(data) else {
        return;
    };
    // Every record the header counts is an entry or a rejection, and the page held them.
    let header = discovery::Header::parse(data).unwrap();
    assert!(header.records <= MAX_RECORDS);
    assert_eq!(log.entries.len() + log.rejected.len(), header.records as usize);
    // (A log of no records needs nothing past its header.)
    assert!(header.records == 0 || data.len() >= HEADER_LEN + header.entries_len());
    for e in &log.entries {
        // Nothing that could add an option to a connect string, nothing unprintable.
        for s in [&e.service_id, &e.subsystem, &e.address] {
            assert!(s.bytes().all(|b| b.is_ascii_graphic() && b != b',' && b != b'='), "{s:?}");
        }
        if e.transport != TransportType::Tcp {
            assert_eq!(e.tcp_security, 0);
        }
        // Written back as nvmet writes it, the entry parses to itself.
        let again = discovery::Entry::parse(&format_discovery_entry(e), 0).unwrap();
        assert_eq!(&again, e);
        let _ = (e.ip(), e.port(), e.nqn());
    }
    assert!(ENTRY_LEN == 1024);
});
