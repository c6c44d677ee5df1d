//! pep-transport: the satellite-hop protocol of pepd as a sans-IO state machine.
//!
//! No sockets, no clock reads: the caller feeds datagrams and `Instant`s in, and polls
//! datagrams to send, the next timer deadline and events out. One [`Association`] per
//! gateway pair carries many flows (one per proxied TCP connection). The wire format is
//! specified in docs/PROTOCOL.md.

mod ack;
mod association;
pub mod cc;
pub mod codec;
pub mod compression;
pub mod config;
pub mod datagram_size;
pub mod endpoint;
mod flow;
pub mod frame;
pub mod ids;
pub mod loss;
mod pacer;
pub mod packet;
pub mod range_set;
mod reordering;
mod return_path;
mod rtt;
pub mod sched;
pub mod security;
mod sent;
pub mod stats;
mod stream;
pub mod traffic_class;
mod windowed_min;

pub use association::{
    Association, AssociationTimes, Event, FlowError, FlowInfo, FlowState, Hubs, LostReason,
    OpenError, ReadOutcome, Role, CLOSE_HANDOVER, MAX_HUBS,
};
pub use compression::{Compression, CompressionOffer};
pub use config::{
    AckPolicy, CcMode, Config, Initiate, InvalidConfig, LossCause, SizeMode, VegasParams,
};
pub use endpoint::{
    AssocHandle, DatagramEvent, Endpoint, EndpointConfig, EndpointStats, PeerIdentity,
    PeerTableError, RemovedPeer, ENDPOINT_HANDSHAKES_PER_SECOND, ENDPOINT_HANDSHAKE_BURST,
};
pub use frame::{FlowMeta, ResetReason};
pub use ids::{FlowId, PeerId};
pub use loss::LossCounts;
pub use pacer::Pacer;
pub use sched::{
    allocations, CarrierScheduler, Counted, MemberId, MemberRates, Shares, ACTIVITY_WINDOW,
    DEMAND_HEADROOM,
};
pub use security::SecurityCounts;
pub use stats::{Stats, TrialCounts};
pub use traffic_class::{TrafficClass, TrafficClassId, TrafficClassStats, MAX_TRAFFIC_CLASSES};

/// Version carried in HELLO and in front of every handshake message; peers with another
/// version do not associate. 2: connection IDs.
pub const PROTOCOL_VERSION: u32 = 2;
