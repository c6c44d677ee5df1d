//! pepd: the daemon. Until the relay lands (issue 4) it only reports its version and the
//! protocol version it speaks, so packaging and CI have a real binary to build.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "pepd",
    version,
    about = "Performance-enhancing proxy for satellite links"
)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    println!(
        "pepd {} (wire protocol version {})",
        env!("CARGO_PKG_VERSION"),
        pep_transport::PROTOCOL_VERSION
    );
    Ok(())
}
