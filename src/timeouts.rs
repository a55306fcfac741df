//! The eleven `timeouts` of the cfg (3proxy's `conf.timeouts[]`), named by
//! their slots. A leaf: every layer that waits reads them.

use std::time::Duration;

/// The 11 `timeouts` values, in seconds, with 3proxy's slot names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts(pub [u32; 11]);

impl Timeouts {
    pub const BYTE_SHORT: usize = 0;
    pub const BYTE_LONG: usize = 1;
    pub const STRING_SHORT: usize = 2;
    pub const STRING_LONG: usize = 3;
    pub const CONNECTION_SHORT: usize = 4;
    pub const CONNECTION_LONG: usize = 5;
    pub const DNS: usize = 6;
    pub const CHAIN: usize = 7;
    pub const CONNECT: usize = 8;
    pub const CONNECTBACK: usize = 9;
    pub const LINGER: usize = 10;

    /// One slot as a Duration.
    pub fn get(&self, slot: usize) -> Duration {
        Duration::from_secs(u64::from(self.0[slot]))
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts([1, 5, 30, 60, 180, 1800, 15, 60, 15, 5, 5])
    }
}
