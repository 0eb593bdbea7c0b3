//! Fabric linear addresses (FLA). Every GPU of the simulated NVLink domain owns a 1 TiB window of the fabric
//! address space; its HBM file backs the start of that window. A PFN (2 MiB units) therefore
//! names a GPU and an offset in its HBM file.

use std::path::{Path, PathBuf};

use openimex_simproto::proto::PAGE_SIZE;

/// Bits of offset within one GPU's window.
const WINDOW_BITS: u32 = 40;
/// Bytes of one GPU's window: the FLA range its fabric probe hands it.
pub const WINDOW_BYTES: u64 = 1 << WINDOW_BITS;
/// GPUs per node the address plan leaves room for: 16 windows of 1 TiB per slot keep every
/// PFN of slots up to 511 within the RM's 32-bit PFNs (DESCRIBE and VALIDATE carry `NvU32`
/// PFNs in 2 MiB units: slot << 23 | GPU << 19 | page).
pub const MAX_GPUS_PER_NODE: u32 = 16;

/// A GPU of the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuAddr {
    /// Node ID.
    pub node: u16,
    /// GPU index on the node.
    pub gpu: u32,
}

impl GpuAddr {
    /// First fabric address of this GPU.
    pub fn base(self) -> u64 {
        (u64::from(self.node) * u64::from(MAX_GPUS_PER_NODE) + u64::from(self.gpu) + 1)
            << WINDOW_BITS
    }

    /// The HBM file of this GPU in `fabric_dir`.
    pub fn hbm_file(self, fabric_dir: &Path) -> PathBuf {
        fabric_dir.join(format!("hbm-n{:04}-g{:02}", self.node, self.gpu))
    }
}

/// The GPU and offset a fabric address falls in.
pub fn locate(addr: u64) -> Option<(GpuAddr, u64)> {
    let window = (addr >> WINDOW_BITS).checked_sub(1)?;
    let node = u16::try_from(window / u64::from(MAX_GPUS_PER_NODE)).ok()?;
    let gpu = u32::try_from(window % u64::from(MAX_GPUS_PER_NODE)).ok()?;
    Some((GpuAddr { node, gpu }, addr & ((1 << WINDOW_BITS) - 1)))
}

/// The PFN of a fabric address.
pub fn pfn(addr: u64) -> u64 {
    addr / PAGE_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        let g = GpuAddr { node: 17, gpu: 3 };
        let addr = g.base() + 6 * PAGE_SIZE;
        assert_eq!(locate(addr), Some((g, 6 * PAGE_SIZE)));
        assert_eq!(locate(pfn(addr) * PAGE_SIZE), Some((g, 6 * PAGE_SIZE)));
        assert_eq!(locate(5), None);
        assert!(g.hbm_file(Path::new("/f")).ends_with("hbm-n0017-g03"));
    }
}
