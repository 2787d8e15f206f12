//! The checksum file beside the database (`idemd.redb.sums`): its bytes,
//! and what its header says about whether its sums can be trusted.
//!
//! ```text
//! block 0 (4096 bytes): header
//!   0..8     magic "idemdsum"
//!   8..12    format version (u32 LE)
//!   12..16   block size (u32 LE)
//!   16       1 when the sums cover every block of the data file
//!   17       1 after a clean close (every write synced, nothing in flight)
//!   18       1 while the sums of blocks outside redb's last durable commit
//!            may be stale (after an unclean stop, until a scrub pass finds
//!            every block matching; releases before it leave it 0)
//!   24..60   the kernel's boot id when the file was last opened (kept for
//!            diagnosis; the trust decision does not use it)
//!   64..72   first damaged block found, u64::MAX if none
//!   72..74   length of the damage report that follows (u16 LE)
//!   74..1098 the damage report (UTF-8, what found it and when)
//!   1100..1104 CRC-32C of bytes 0..1100
//!   2048..2080 the write in flight: first block, block count (u64 LE
//!              each), 8 bytes reserved, CRC-32C of 2048..2072
//! block 1..: one CRC-32C (u32 LE) per 4 KiB block of the data file
//! ```
//!
//! The header and the write-in-flight record are separate so that marking
//! a write rewrites 32 bytes, not the header.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::layout::BLOCK;
use crate::store::embedded::wal::crc32c;

const MAGIC: &[u8; 8] = b"idemdsum";
const VERSION: u32 = 1;
const HEADER_CHECKED: usize = 1100;
const REPORT_MAX: usize = 1024;
const IN_FLIGHT_AT: u64 = 2048;
/// Where the entries start: one block in, so the header is one page.
pub(crate) const ENTRIES_AT: u64 = BLOCK as u64;
/// No damaged block recorded.
const NO_DAMAGE: u64 = u64::MAX;

/// What the header records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Header {
    /// The entries cover every block of the data file (false while a
    /// rebuild runs: a crash then leaves sums that must not be trusted).
    pub(crate) complete: bool,
    /// The last owner closed cleanly: every write synced.
    pub(crate) clean: bool,
    /// Blocks outside redb's last durable commit may hold bytes their sums
    /// do not describe (an unclean stop: see [`super`], "When the sums can
    /// be trusted"); the scrub does not call them damage until a pass finds
    /// every block matching.
    pub(crate) unsettled: bool,
    /// The kernel's boot id at the last open, for whoever reads the file
    /// while diagnosing a start: not a reason to trust anything, since a
    /// disk image restored on the same boot has lost the page cache too.
    pub(crate) boot_id: String,
    /// The damage found, if any: the block and the report.
    pub(crate) damage: Option<(u64, String)>,
}

impl Header {
    /// The header block's bytes.
    fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_CHECKED + 4];
        bytes[0..8].copy_from_slice(MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&(BLOCK as u32).to_le_bytes());
        bytes[16] = u8::from(self.complete);
        bytes[17] = u8::from(self.clean);
        bytes[18] = u8::from(self.unsettled);
        let boot = self.boot_id.as_bytes();
        let boot = &boot[..boot.len().min(36)];
        bytes[24..24 + boot.len()].copy_from_slice(boot);
        let (block, report) = match &self.damage {
            Some((block, report)) => (*block, report.as_str()),
            None => (NO_DAMAGE, ""),
        };
        bytes[64..72].copy_from_slice(&block.to_le_bytes());
        let report = truncate_utf8(report, REPORT_MAX);
        bytes[72..74].copy_from_slice(&(report.len() as u16).to_le_bytes());
        bytes[74..74 + report.len()].copy_from_slice(report.as_bytes());
        let crc = crc32c(&bytes[..HEADER_CHECKED]);
        bytes[HEADER_CHECKED..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The header in `bytes`, `None` when it is not one this release wrote
    /// whole (missing, torn, another format).
    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < HEADER_CHECKED + 4 || &bytes[0..8] != MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(bytes[HEADER_CHECKED..HEADER_CHECKED + 4].try_into().ok()?);
        if crc32c(&bytes[..HEADER_CHECKED]) != crc
            || u32::from_le_bytes(bytes[8..12].try_into().ok()?) != VERSION
            || u32::from_le_bytes(bytes[12..16].try_into().ok()?) != BLOCK as u32
        {
            return None;
        }
        let boot_id = String::from_utf8_lossy(&bytes[24..60])
            .trim_end_matches('\0')
            .to_string();
        let block = u64::from_le_bytes(bytes[64..72].try_into().ok()?);
        let len = usize::from(u16::from_le_bytes(bytes[72..74].try_into().ok()?)).min(REPORT_MAX);
        let damage = (block != NO_DAMAGE).then(|| {
            (
                block,
                String::from_utf8_lossy(&bytes[74..74 + len]).into_owned(),
            )
        });
        Some(Self {
            complete: bytes[16] == 1,
            clean: bytes[17] == 1,
            unsettled: bytes[18] == 1,
            boot_id,
            damage,
        })
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
fn truncate_utf8(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The checksum file, opened.
#[derive(Debug)]
pub(crate) struct Sidecar {
    /// The file; positioned reads and writes only.
    file: File,
}

impl Sidecar {
    /// Opens (creating if needed) the checksum file at `path` and locks it
    /// for this process: `Ok(None)` when another process holds it (the
    /// store has one owner; redb's own lock on the database file is taken
    /// later, after the sums are read and marked in use).
    pub(crate) fn open(path: &std::path::Path) -> io::Result<Option<Self>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Self { file })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// The header, `None` when the file has none this release can trust.
    pub(crate) fn header(&self) -> io::Result<Option<Header>> {
        let mut bytes = vec![0u8; HEADER_CHECKED + 4];
        match self.file.read_exact_at(&mut bytes, 0) {
            Ok(()) => Ok(Header::decode(&bytes)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the header (durable once [`Self::sync`] returns).
    pub(crate) fn write_header(&self, header: &Header) -> io::Result<()> {
        self.file.write_all_at(&header.encode(), 0)
    }

    /// The blocks `[first, first + count)` of the write in flight when the
    /// last owner stopped, if it stopped inside one.
    pub(crate) fn in_flight(&self) -> io::Result<Option<(u64, u64)>> {
        let mut bytes = [0u8; 32];
        match self.file.read_exact_at(&mut bytes, IN_FLIGHT_AT) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let crc = u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
        let first = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or_default());
        let count = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
        Ok((crc32c(&bytes[..24]) == crc && count > 0).then_some((first, count)))
    }

    /// Records that blocks `[first, first + count)` are being written
    /// (`count` 0: none is).
    pub(crate) fn mark_in_flight(&self, first: u64, count: u64) -> io::Result<()> {
        let mut bytes = [0u8; 32];
        bytes[0..8].copy_from_slice(&first.to_le_bytes());
        bytes[8..16].copy_from_slice(&count.to_le_bytes());
        let crc = crc32c(&bytes[..24]);
        bytes[24..28].copy_from_slice(&crc.to_le_bytes());
        self.file.write_all_at(&bytes, IN_FLIGHT_AT)
    }

    /// Reads the sums of `count` blocks.
    pub(crate) fn entries(&self, count: u64) -> io::Result<Vec<u32>> {
        let len = usize::try_from(count)
            .ok()
            .and_then(|count| count.checked_mul(4))
            .ok_or_else(|| io::Error::other("checksum file too large for memory"))?;
        let mut bytes = vec![0u8; len];
        self.file.read_exact_at(&mut bytes, ENTRIES_AT)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// How many entries the file holds.
    pub(crate) fn entry_count(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len().saturating_sub(ENTRIES_AT) / 4)
    }

    /// Writes the sums of the blocks from `first` on.
    pub(crate) fn write_entries(&self, first: u64, sums: &[u32]) -> io::Result<()> {
        let bytes: Vec<u8> = sums.iter().flat_map(|sum| sum.to_le_bytes()).collect();
        self.file.write_all_at(&bytes, ENTRIES_AT + first * 4)
    }

    /// Keeps exactly `count` entries.
    pub(crate) fn set_entry_count(&self, count: u64) -> io::Result<()> {
        self.file.set_len(ENTRIES_AT + count * 4)
    }

    /// Makes every earlier write durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// The kernel's boot id ("" where there is none to read): recorded in the
/// header for diagnosis only.
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_and_a_torn_one_does_not() {
        let header = Header {
            complete: true,
            clean: false,
            unsettled: true,
            boot_id: "0b7c6f1e-2a7b-4a3c-9d9e-0123456789ab".into(),
            damage: Some((7, "block 7 found by the scrub".into())),
        };
        let mut bytes = header.encode();
        assert_eq!(Header::decode(&bytes), Some(header));
        bytes[80] ^= 1;
        assert_eq!(Header::decode(&bytes), None);
    }

    #[test]
    fn a_long_report_is_cut_on_a_character_boundary() {
        let report = "é".repeat(REPORT_MAX);
        let header = Header {
            damage: Some((1, report)),
            ..Header::default()
        };
        let decoded = Header::decode(&header.encode()).expect("decodes");
        let (_, kept) = decoded.damage.expect("damage kept");
        assert!(kept.len() <= REPORT_MAX && kept.chars().all(|c| c == 'é'));
    }
}
