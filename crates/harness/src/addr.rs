//! Loopback address blocks: every cluster gets its own addresses so that tests running in
//! parallel processes (cargo nextest) can all use the fixed IMEX ports without colliding.
//!
//! A block is `127.A.B.1 ..= 127.A.B.250`, continued in `127.A.(B+1).*` for more than 250
//! nodes. `A` is random in `16..=250` (away from `127.0.0.x`, which other software uses) and
//! `B` random. A block is only handed out after every address was bound on every wanted port
//! (and released again); otherwise another random block is tried.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::HarnessError;

/// Addresses per `/24` block (host parts `1..=250`).
pub const ADDRS_PER_BLOCK: usize = 250;

/// How many random blocks to probe before giving up.
const ATTEMPTS: usize = 100;

/// A probed block of loopback addresses, one per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrBlock {
    ips: Vec<Ipv4Addr>,
    ports: Vec<u16>,
    /// Second and third octet of the first address (`127.a.b.1`).
    a: u8,
    b: u8,
    /// Spare addresses handed out by [`AddrBlock::spare`], in order.
    spares: Vec<Ipv4Addr>,
}

impl AddrBlock {
    /// Picks a random block of `count` addresses on which every port in `ports` could be
    /// bound (port 0 entries are ignored). The probe listeners are closed before returning.
    pub fn allocate(count: usize, ports: &[u16]) -> Result<Self, HarnessError> {
        let ports: Vec<u16> = ports.iter().copied().filter(|&p| p != 0).collect();
        let blocks = count.div_ceil(ADDRS_PER_BLOCK).max(1);
        let mut rng = StdRng::from_os_rng();
        let mut last = String::from("no attempt made");
        if blocks > 256 {
            return Err(HarnessError::NoAddresses {
                nodes: count,
                ports,
                attempts: 0,
                last: "more nodes than a 127.A.0.0/16 can hold".into(),
            });
        }
        for _ in 0..ATTEMPTS {
            let a: u8 = rng.random_range(16..=250);
            let b: u8 = rng.random_range(0..=(256 - blocks) as u8);
            let ips = block_ips(a, b, count);
            match probe(&ips, &ports) {
                Ok(()) => {
                    return Ok(Self {
                        ips,
                        ports,
                        a,
                        b,
                        spares: Vec::new(),
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(HarnessError::NoAddresses {
            nodes: count,
            ports,
            attempts: ATTEMPTS,
            last,
        })
    }

    /// All addresses, node 0 first.
    pub fn ips(&self) -> &[Ipv4Addr] {
        &self.ips
    }

    /// Address of node `i`. Panics if `i` is out of range (a harness bug, not a test failure).
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        self.ips[i]
    }

    /// The ports that were probed.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// Number of addresses.
    pub fn len(&self) -> usize {
        self.ips.len()
    }

    /// True for a block of zero addresses.
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty()
    }

    /// One more address of the same block, after the nodes' and the earlier spares', probed
    /// free on the block's ports (for a node that "moves" to a new address, or a node added
    /// later). Addresses that fail the probe are skipped.
    pub fn spare(&mut self) -> Result<Ipv4Addr, HarnessError> {
        let mut last = String::from("the block is exhausted");
        let first = self.ips.len() + self.spares.len();
        // The block may continue into later third octets, up to 127.a.255.250.
        let room = (256 - usize::from(self.b)) * ADDRS_PER_BLOCK;
        for i in first..room.min(first + ATTEMPTS) {
            let ip = block_ip(self.a, self.b, i);
            self.spares.push(ip);
            match probe(&[ip], &self.ports) {
                Ok(()) => return Ok(ip),
                Err(e) => last = e,
            }
        }
        Err(HarnessError::NoAddresses {
            nodes: 1,
            ports: self.ports.clone(),
            attempts: ATTEMPTS,
            last,
        })
    }

    /// The spare addresses handed out (or skipped) so far.
    pub fn spares(&self) -> &[Ipv4Addr] {
        &self.spares
    }
}

/// `count` addresses starting at `127.a.b.1`, 250 per third octet.
fn block_ips(a: u8, b: u8, count: usize) -> Vec<Ipv4Addr> {
    (0..count).map(|i| block_ip(a, b, i)).collect()
}

/// The `i`-th address of the block starting at `127.a.b.1`.
fn block_ip(a: u8, b: u8, i: usize) -> Ipv4Addr {
    // Callers keep b + i / 250 <= 255 and i % 250 + 1 <= 250.
    let third = b as usize + i / ADDRS_PER_BLOCK;
    let fourth = i % ADDRS_PER_BLOCK + 1;
    Ipv4Addr::new(127, a, third as u8, fourth as u8)
}

/// Binds every (ip, port) at once, then releases them all. Returns the first failure.
fn probe(ips: &[Ipv4Addr], ports: &[u16]) -> Result<(), String> {
    let mut held = Vec::with_capacity(ips.len() * ports.len());
    for ip in ips {
        for &port in ports {
            let addr = SocketAddrV4::new(*ip, port);
            match TcpListener::bind(addr) {
                Ok(l) => held.push(l),
                Err(e) => return Err(format!("bind {addr}: {e}")),
            }
        }
    }
    drop(held);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn block_layout_spills_into_next_third_octet() {
        let ips = block_ips(20, 7, 252);
        assert_eq!(ips[0], Ipv4Addr::new(127, 20, 7, 1));
        assert_eq!(ips[249], Ipv4Addr::new(127, 20, 7, 250));
        assert_eq!(ips[250], Ipv4Addr::new(127, 20, 8, 1));
        assert_eq!(ips[251], Ipv4Addr::new(127, 20, 8, 2));
    }

    #[test]
    fn allocated_addresses_are_distinct_loopback_and_bindable() {
        let block = AddrBlock::allocate(18, &[50000, 50005, 0]).expect("allocate");
        assert_eq!(block.len(), 18);
        assert_eq!(block.ports(), &[50000, 50005]);
        let set: BTreeSet<_> = block.ips().iter().collect();
        assert_eq!(
            set.len(),
            18,
            "addresses must be distinct: {:?}",
            block.ips()
        );
        for ip in block.ips() {
            let o = ip.octets();
            assert_eq!(o[0], 127);
            assert!((16..=250).contains(&o[1]), "{ip} is too close to 127.0.0.x");
            assert!((1..=250).contains(&o[3]), "{ip}");
        }
        // Released: we can bind every address/port again ourselves.
        probe(block.ips(), block.ports()).expect("the block must be free after allocate()");
    }

    #[test]
    fn two_allocations_do_not_overlap_while_the_first_is_in_use() {
        let first = AddrBlock::allocate(4, &[50000]).expect("allocate");
        let _hold: Vec<TcpListener> = first
            .ips()
            .iter()
            .map(|ip| TcpListener::bind((*ip, 50000)).expect("bind"))
            .collect();
        for _ in 0..5 {
            let second = AddrBlock::allocate(4, &[50000]).expect("allocate");
            for ip in second.ips() {
                assert!(!first.ips().contains(ip), "{ip} handed out twice");
            }
        }
    }

    #[test]
    fn spares_follow_the_nodes_in_the_same_block() {
        let mut block = AddrBlock::allocate(3, &[50000]).expect("allocate");
        let first = block.spare().expect("spare");
        let second = block.spare().expect("spare");
        let o = block.ip(0).octets();
        assert_eq!(first, Ipv4Addr::new(127, o[1], o[2], 4));
        assert_eq!(second, Ipv4Addr::new(127, o[1], o[2], 5));
        assert_eq!(block.len(), 3, "spares are not nodes");
        assert_eq!(block.spares(), &[first, second]);
    }

    #[test]
    fn more_than_one_block() {
        let block = AddrBlock::allocate(260, &[50000]).expect("allocate");
        let o0 = block.ip(0).octets();
        let o = block.ip(259).octets();
        assert_eq!((o[1], o[2], o[3]), (o0[1], o0[2] + 1, 10));
    }
}
