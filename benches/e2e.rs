//! End-to-end benchmark suites over the netns testbed (issue 3). Placeholder until the
//! testbed harness lands: it says so instead of pretending to measure.
fn main() {
    eprintln!("e2e benchmark suites are not implemented yet (issue 3)");
}
