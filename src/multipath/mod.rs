//! dm-multipath maps: parse their table and status, find them, and take them down safely.
//!
//! [`remove()`] is `multipath -f MAP` without the tool, following multipath-tools 0.9's
//! `_dm_flush_map` (docs/DESIGN.md, "Removing a multipath map"), plus one refusal the tool
//! does not make: a map with no active path that queues I/O cannot write its dirty data
//! anywhere, so removing it would drop that data; it is refused unless the caller forces.
//!
//! When multipathd is running the removal is asked of it (`del map NAME` on its control
//! socket, as `multipath -f` does), so it forgets the map instead of re-creating it. Nothing
//! here spawns a process, and every wait has a deadline.
//!
//! One file per part, their items re-exported here: `table.rs` (the table and status lines'
//! parsers), `find.rs` (a map by name, number, node or WWID, its uuid, its partition maps),
//! `multipathd.rs` (the control-socket client, with `add path` and `add map`), `wwids.rs`
//! (multipathd's `wwids` file, under multipath-tools' lock), `remove.rs` (the flush-and-remove
//! sequence) and `resize.rs` (growing a map to its paths' new size).

mod find;
mod multipathd;
mod remove;
mod resize;
mod suspend;
mod table;
mod wwids;

pub use find::*;
pub use multipathd::{Answer, MULTIPATHD_SOCKET, Multipathd, Peer};
pub use remove::*;
pub use resize::{GrownBy, grow};
pub use table::*;
pub use wwids::{WWIDS_FILE, WWIDS_HEADER, remember_in, remember_wwid};
