//! `[announce]`: the kernel routing tables a hub writes its served terminals' subnets into,
//! for a routing daemon to import and advertise (docs/OPERATIONS.md, "Several active hubs").

use serde::Deserialize;

/// Tables the kernel reserves: 0 (unspecified), 253 (default), 254 (main), 255 (local).
pub const RESERVED_TABLES: [u32; 4] = [0, 253, 254, 255];

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AnnounceConfig {
    /// The table that holds a route for each subnet of every terminal this hub serves.
    pub table: u32,
    /// The table a terminal's routes move to while its association is in an outage; read
    /// through [`AnnounceConfig::outage_table`].
    #[serde(default)]
    pub outage_table: Option<u32>,
}

impl AnnounceConfig {
    /// `outage_table`, `table` when unset.
    pub fn outage_table(&self) -> u32 {
        self.outage_table.unwrap_or(self.table)
    }

    /// The tables pepd owns: `table`, and `outage_table` when it is another.
    pub fn tables(&self) -> Vec<u32> {
        let mut t = vec![self.table];
        if self.outage_table() != self.table {
            t.push(self.outage_table());
        }
        t
    }
}
