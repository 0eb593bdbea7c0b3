//! The 64-byte fabric handle (CUmemFabricHandle), the 16-byte export UUID, and the hex codec
//! of their text forms (and of every other byte string the protocol carries as text).
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
        encode_hex(&self.0)
    }

    /// Parses 32 hex digits; anything else is NV_ERR_INVALID_ARGUMENT.
    pub fn from_hex(s: &str) -> Result<Self, NvStatus> {
        decode_hex_array(s).map(Self).map_err(NvStatus::from)
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
        encode_hex(&self.to_bytes())
    }

    /// Parses 128 hex digits; anything else is NV_ERR_INVALID_ARGUMENT.
    pub fn from_hex(s: &str) -> Result<Self, NvStatus> {
        let b: [u8; 64] = decode_hex_array(s)?;
        Self::from_bytes(&b)
    }
}

/// Why a text is not the hex form of `N` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    /// Not two digits per byte.
    #[error("{found} hex digits where {expected} were expected")]
    Length {
        /// Digits expected (twice the byte count).
        expected: usize,
        /// Characters found (after trimming white space).
        found: usize,
    },
    /// A character that is not a hex digit.
    #[error("character {position} is not a hex digit")]
    Digit {
        /// Its byte offset in the trimmed text.
        position: usize,
    },
}

impl From<HexError> for NvStatus {
    /// A malformed handle or UUID is a bad argument to the driver.
    fn from(_: HexError) -> Self {
        NvStatus::InvalidArgument
    }
}

/// Lower-case hex, two digits per byte: the text form of handles, UUIDs and clusterUuids.
pub fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// Parses exactly `2 * N` hex digits (either case; white space around them is ignored) into
/// `N` bytes. Signs, prefixes, separators and non-ASCII characters are errors.
pub fn decode_hex_array<const N: usize>(text: &str) -> Result<[u8; N], HexError> {
    let digits = text.trim().as_bytes();
    if digits.len() != 2 * N {
        return Err(HexError::Length {
            expected: 2 * N,
            found: digits.len(),
        });
    }
    let nibble = |position: usize| {
        let c = digits[position];
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
            .ok_or(HexError::Digit { position })
    };
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = (nibble(2 * i)? << 4) | nibble(2 * i + 1)?;
    }
    Ok(out)
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

    #[test]
    fn hex_codec_is_strict_and_round_trips() {
        let bytes: [u8; 4] = [0x00, 0x7f, 0xab, 0xff];
        assert_eq!(encode_hex(&bytes), "007fabff");
        assert_eq!(decode_hex_array::<4>(" 007FabfF\n"), Ok(bytes));
        assert_eq!(
            decode_hex_array::<4>("007fab"),
            Err(HexError::Length {
                expected: 8,
                found: 6
            })
        );
        for (bad, position) in [("+07fabff", 0), ("007fabfg", 7), ("0x7fabff", 1)] {
            assert_eq!(
                decode_hex_array::<4>(bad),
                Err(HexError::Digit { position }),
                "{bad}"
            );
        }
        // Multi-byte characters are not digits, and never split mid-character.
        assert!(decode_hex_array::<4>("éééé").is_err());
        assert_eq!(decode_hex_array::<0>(""), Ok([]));
    }
}
