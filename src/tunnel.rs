//! The tunnel: the UDP data plane between the gateways. Its sockets and workers, each
//! worker's loop driving its part of the endpoint, the table of peers and each peer's
//! connection state, the split of a hub's carrier between its terminals, and the running
//! count against the memory budget. It reaches the TCP side only through
//! [`driver::FlowAcceptor`], and tells the peers' state changes only through
//! [`state_feed::StateFeed`].

pub mod carrier;
pub mod driver;
mod droplog;
pub mod flowcount;
pub mod gateway;
pub mod memory;
pub mod outbox;
pub mod peer;
pub mod peer_table;
pub mod routes;
pub mod setup;
pub mod sockets;
pub mod spawn;
pub mod stamp;
pub mod state_feed;
pub mod steering;
pub mod totals;
pub mod udp;
pub mod workers;
