//! `pep-testbed xfer`: a traffic tool that sends seeded pseudo-random data and verifies every
//! byte, with bulk, request/response, web-page, multi-flow and half-close workloads.

pub mod client;
pub mod io;
pub mod pattern;
pub mod proto;
pub mod server;

use serde::Serialize;

/// The web page of literature/001: one 10,710-byte object, then 15 of 7,758 bytes over up to
/// six connections, like a browser.
pub const PAGE_FIRST_BYTES: usize = 10_710;
pub const PAGE_OBJECTS: usize = 15;
pub const PAGE_OBJECT_BYTES: usize = 7_758;
pub const PAGE_PARALLEL: usize = 6;
/// Size of each page request (a typical HTTP GET with headers).
pub const PAGE_REQUEST_BYTES: usize = 350;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Amount {
    Bytes(u64),
    Seconds(f64),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum Workload {
    /// Bulk client → server.
    Upload(Amount),
    /// Bulk server → client.
    Download(Amount),
    Rr {
        request: usize,
        response: usize,
        repeat: usize,
    },
    Page,
    /// Concurrent downloads.
    Flows {
        count: usize,
        amount: Amount,
    },
    HalfClose {
        up: u64,
        down: u64,
    },
    /// Bulk both ways on one connection at the same time.
    Bidir {
        up: u64,
        down: u64,
    },
    /// A stream the server paces, beside bulk downloads, each marked with its own DSCP:
    /// how the gateways' traffic classes share the link.
    Classes(ClassesSpec),
    /// A download, and beside it on a second connection a request every `every_ms`
    /// (`request` bytes up, `response` bytes back) for as long as the download runs: the
    /// latency interactive traffic sees behind bulk traffic.
    Interactive {
        download: Amount,
        request: usize,
        response: usize,
        every_ms: u64,
    },
}

/// The [`Workload::Classes`] mix.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassesSpec {
    /// The stream's rate at the server.
    pub stream_bps: f64,
    /// The DSCP (0 to 63) the client marks the stream with.
    pub stream_dscp: u8,
    /// Bulk downloads beside it.
    pub bulk: usize,
    pub bulk_dscp: u8,
    /// How long every flow runs.
    pub seconds: f64,
}

/// What [`Workload::Classes`] measured over its window (the run after its first sixth).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClassesOutcome {
    pub window_s: f64,
    /// The stream's goodput.
    pub stream_bps: f64,
    /// The bulk downloads' goodput together.
    pub bulk_bps: f64,
}

impl Workload {
    /// Whether the measured data flows client → server (the link's return direction).
    pub fn data_goes_up(&self) -> bool {
        matches!(self, Workload::Upload(_))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    Upload,
    Download,
    Rr,
    Page,
    Flows,
    Halfclose,
    Bidir,
    Interactive,
    Classes,
}

/// Workload selection and sizes on the command line.
#[derive(Clone, Debug, clap::Args)]
pub struct WorkloadArgs {
    #[arg(long, value_enum)]
    pub workload: WorkloadKind,
    /// Bulk size (upload/download/flows: per flow; halfclose: bytes the client sends; bidir:
    /// each way).
    #[arg(long, conflicts_with = "seconds")]
    pub bytes: Option<u64>,
    /// Bulk duration instead of a size.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// rr: request size.
    #[arg(long, default_value_t = 100)]
    pub request_bytes: usize,
    /// rr: response size; halfclose: bytes the server replies after EOF.
    #[arg(long, default_value_t = 10_000)]
    pub response_bytes: usize,
    /// rr: requests on the connection.
    #[arg(long, default_value_t = 10)]
    pub repeat: usize,
    /// flows: number of concurrent flows.
    #[arg(long, default_value_t = 4)]
    pub flows: usize,
    /// classes: the stream's rate in bit/s, paced by the server.
    #[arg(long, default_value_t = 4e6)]
    pub stream_bps: f64,
    /// classes: the stream's DSCP (34: AF41).
    #[arg(long, default_value_t = 34, value_parser = clap::value_parser!(u8).range(0..64))]
    pub stream_dscp: u8,
    /// classes: the bulk downloads' DSCP (8: CS1); their number is --flows.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u8).range(0..64))]
    pub bulk_dscp: u8,
    /// interactive: milliseconds between the starts of two requests (a request waits for
    /// the previous one's response).
    #[arg(long, default_value_t = 200)]
    pub interval_ms: u64,
    /// What the streams carry: seeded random bytes, the text corpus, or the text corpus
    /// gzipped (`pep_testbed::corpus`).
    #[arg(long, value_enum, default_value_t = crate::corpus::Content::Random)]
    pub content: crate::corpus::Content,
}

impl WorkloadArgs {
    pub fn workload(&self) -> Workload {
        let amount = match (self.bytes, self.seconds) {
            (_, Some(s)) => Amount::Seconds(s),
            (Some(b), None) => Amount::Bytes(b),
            (None, None) => Amount::Seconds(10.0),
        };
        match self.workload {
            WorkloadKind::Upload => Workload::Upload(amount),
            WorkloadKind::Download => Workload::Download(amount),
            WorkloadKind::Rr => Workload::Rr {
                request: self.request_bytes,
                response: self.response_bytes,
                repeat: self.repeat,
            },
            WorkloadKind::Page => Workload::Page,
            WorkloadKind::Flows => Workload::Flows {
                count: self.flows,
                amount,
            },
            WorkloadKind::Halfclose => Workload::HalfClose {
                up: self.bytes.unwrap_or(100_000),
                down: self.response_bytes as u64,
            },
            WorkloadKind::Interactive => Workload::Interactive {
                download: amount,
                request: self.request_bytes,
                response: self.response_bytes,
                every_ms: self.interval_ms,
            },
            WorkloadKind::Classes => Workload::Classes(ClassesSpec {
                stream_bps: self.stream_bps,
                stream_dscp: self.stream_dscp,
                bulk: self.flows,
                bulk_dscp: self.bulk_dscp,
                seconds: match amount {
                    Amount::Seconds(s) => s,
                    Amount::Bytes(_) => 60.0,
                },
            }),
            WorkloadKind::Bidir => {
                let each = self.bytes.unwrap_or(10_000_000);
                Workload::Bidir {
                    up: each,
                    down: each,
                }
            }
        }
    }
}

/// What a client run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    /// Verified payload bytes in the measured direction (bidir: both directions together;
    /// interactive: the download's).
    pub bytes: u64,
    pub completion_s: f64,
    pub goodput_bps: f64,
    /// Every byte verified (null when a capped upload left nothing to verify).
    pub intact: Option<bool>,
    /// Cut short by the run-time cap; figures cover what arrived until then.
    pub capped: bool,
    pub latencies_s: Vec<f64>,
    pub flows_bps: Vec<f64>,
    pub jain_fairness: Option<f64>,
    pub error: Option<String>,
    /// classes: the stream's and the bulk flows' goodput over the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classes: Option<ClassesOutcome>,
    /// FNV-1a digest (hex) of what the client received (download, halfclose, bidir).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down_digest: Option<String>,
    /// FNV-1a digest (hex) of what the server reported receiving (upload, bidir).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub up_digest: Option<String>,
}
