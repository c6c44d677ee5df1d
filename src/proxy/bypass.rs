//! Connections over the flow limit or memory budget, when configured to pass unproxied:
//! plain TCP to the destination over the routed path, spliced to the client.

use pep_transport::FlowMeta;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::debug;

use crate::proxy::relay::abort_tcp;
use crate::proxy::upstream::{self, UpstreamOptions};

pub async fn run(mut client: TcpStream, meta: FlowMeta, first: Vec<u8>, opts: &UpstreamOptions) {
    let mut server = match upstream::connect(&meta, opts).await {
        Ok(s) => s,
        Err(f) => {
            debug!(server = %meta.server, error = %f.error, "bypass connect failed");
            abort_tcp(client);
            return;
        }
    };
    if server.write_all(&first).await.is_err() {
        abort_tcp(client);
        return;
    }
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
        debug!(error = %e, "bypassed connection failed");
        abort_tcp(client);
        abort_tcp(server);
    }
}
