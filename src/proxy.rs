//! The proxy: the TCP data plane. The interception listeners and what they accept, the
//! relay of each connection to its flow, the connect to the original destination, the
//! bypass of connections the tunnel does not take, the relays' read buffers, and the
//! compression of flows whose streams are blocks.

pub mod acceptor;
pub mod bypass;
pub mod compression;
pub mod intercept;
pub mod live;
pub mod relay;
pub mod scratch;
pub mod tproxy;
pub mod upstream;
