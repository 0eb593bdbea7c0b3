//! The 64-byte fabric handle (CUmemFabricHandle) and the 16-byte export UUID.
//!
//! The real layout is not public; this one carries what the importing driver needs to post a
//! MEM_IMPORT event: the export UUID (expId, exporting node), the index, the size and the
//! NVLink domain it belongs to. Applications treat it as opaque bytes, as with CUDA.

use crate::proto::NvStatus;

const MAGIC: &[u8; 4] = b"OIMX";

/// An export UUID: (expId u64, exporting node u16, 6 zero bytes), as the real driver mints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExportUuid(pub [u8; 16]);

impl ExportUuid {
    /// Mints the UUID of export `exp_id` on `node`.
    pub fn new(exp_id: u64, node: u16) -> Self {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&exp_id.to_le_bytes());
        b[8..10].copy_from_slice(&node.to_le_bytes());
        Self(b)
    }

    /// The export's ID on its node.
    pub fn exp_id(&self) -> u64 {
        let mut v = [0u8; 8];
        v.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(v)
    }

    /// The exporting node.
    pub fn node(&self) -> u16 {
        u16::from_le_bytes([self.0[8], self.0[9]])
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 32 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, NvStatus> {
        let v = unhex(s)?;
        let b: [u8; 16] = v.try_into().map_err(|_| NvStatus::InvalidArgument)?;
        Ok(Self(b))
    }
}

/// A decoded fabric handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FabricHandle {
    /// The export.
    pub export_uuid: ExportUuid,
    /// Handle index within the export.
    pub index: u16,
    /// Bytes.
    pub size: u64,
    /// NVLink domain (clusterUuid) of the exporter.
    pub cluster_uuid: [u8; 16],
}

impl FabricHandle {
    /// The 64 bytes an application ships to its peers.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..4].copy_from_slice(MAGIC);
        b[4..20].copy_from_slice(&self.export_uuid.0);
        b[20..22].copy_from_slice(&self.index.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..48].copy_from_slice(&self.cluster_uuid);
        b
    }

    /// Decodes 64 bytes; anything else is NV_ERR_INVALID_ARGUMENT (CUDA: invalid handle).
    pub fn from_bytes(b: &[u8]) -> Result<Self, NvStatus> {
        if b.len() != 64 || &b[..4] != MAGIC {
            return Err(NvStatus::InvalidArgument);
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[4..20]);
        let mut size = [0u8; 8];
        size.copy_from_slice(&b[24..32]);
        let mut cluster = [0u8; 16];
        cluster.copy_from_slice(&b[32..48]);
        Ok(Self {
            export_uuid: ExportUuid(uuid),
            index: u16::from_le_bytes([b[20], b[21]]),
            size: u64::from_le_bytes(size),
            cluster_uuid: cluster,
        })
    }

    /// 128 hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.to_bytes())
    }

    /// Parses 128 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, NvStatus> {
        Self::from_bytes(&unhex(s)?)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, NvStatus> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) {
        return Err(NvStatus::InvalidArgument);
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or(NvStatus::InvalidArgument)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_and_rejects_garbage() {
        let h = FabricHandle {
            export_uuid: ExportUuid::new(42, 7),
            index: 3,
            size: 4 << 20,
            cluster_uuid: [9; 16],
        };
        assert_eq!(FabricHandle::from_hex(&h.to_hex()), Ok(h));
        assert_eq!(h.export_uuid.node(), 7);
        assert_eq!(h.export_uuid.exp_id(), 42);
        assert_eq!(
            ExportUuid::from_hex(&h.export_uuid.to_hex()),
            Ok(h.export_uuid)
        );
        assert_eq!(FabricHandle::from_hex("00"), Err(NvStatus::InvalidArgument));
        assert_eq!(
            FabricHandle::from_bytes(&[0u8; 64]),
            Err(NvStatus::InvalidArgument)
        );
        assert_eq!(FabricHandle::from_hex("zz"), Err(NvStatus::InvalidArgument));
    }
}
