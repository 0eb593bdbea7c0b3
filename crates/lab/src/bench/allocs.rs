//! `import_allocs`: heap allocations per import, read from outside. The daemons report their
//! count in their metrics (`openimex_heap_allocations_total`, [`crate::heap`]); the
//! raw RPC server answers `Config` with its own, and the bench counts its own raw client in
//! process. Each reading costs the process read some allocations itself, so a window is read
//! twice at its start and one reading's cost is taken off ([`CountWindow`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context as _, Result};
use openimex_harness::bench::CountWindow;

/// Port of each bench node's metrics listener (on the node's own loopback address).
pub(crate) const METRICS_PORT: u16 = 50010;
/// Limit for one scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// The counter's sample line starts with this.
const SAMPLE: &str = "openimex_heap_allocations_total ";

/// The daemon's allocation count, from its metrics at `addr`.
pub(crate) fn daemon_allocations(addr: SocketAddr) -> Result<u64> {
    let mut s = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT)
        .with_context(|| format!("cannot connect to the metrics listener {addr}"))?;
    s.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .with_context(|| format!("cannot read the metrics of {addr}"))?;
    parse(&text).with_context(|| format!("the metrics of {addr} have no `{}`", SAMPLE.trim()))
}

fn parse(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(SAMPLE))
        .and_then(|v| v.trim().parse().ok())
}

/// Opens a [`CountWindow`] with two readings of `read`.
pub(crate) fn open_window(mut read: impl FnMut() -> Result<u64>) -> Result<CountWindow> {
    let (a, b) = (read()?, read()?);
    CountWindow::open(a, b).with_context(|| format!("an allocation count went down ({a} then {b})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_is_found_among_the_metrics() {
        let text = "# TYPE openimex_heap_allocations counter\n\
                    openimex_heap_allocations_total 12345\n\
                    openimex_heap_allocations_created 1.0\n# EOF\n";
        assert_eq!(parse(text), Some(12345));
        assert_eq!(parse("openimex_imports_answered_total 3\n"), None);
    }

    #[test]
    fn a_count_that_goes_down_opens_no_window() {
        let mut down = [100, 90].into_iter();
        assert!(open_window(|| Ok(down.next().unwrap_or(0))).is_err());
        let mut up = [100, 130].into_iter();
        let w = open_window(|| Ok(up.next().unwrap_or(0))).expect("open");
        assert_eq!(w.close(1060), 900);
    }
}
