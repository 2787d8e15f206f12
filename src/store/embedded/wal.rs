//! Write-ahead log of the embedded store.
//!
//! Why a log in front of redb: a durable redb commit rewrites (copy on
//! write) every B-tree page the batch touched, in all three tables, at
//! scattered offsets, then fsyncs them: measured at ~50 pages (~200 KiB) and
//! one multi-millisecond fsync per batch of ~30 operations. The log turns
//! that into one sequential append of the batch's changes (a few hundred
//! bytes per operation) and one `fdatasync`; redb then commits without
//! durability (in memory, visible to readers), and a periodic durable redb
//! commit (a *checkpoint*) writes the pages once for many batches, after
//! which the log is reused from its start.
//!
//! # Format
//!
//! A 16-byte header (`IDEMDWAL`, version, reserved), then frames, one per
//! committed batch:
//!
//! ```text
//! crc32c(u32 LE, over everything after it) | payload len (u32 LE) | seq (u64 LE) | payload
//! ```
//!
//! The payload is the batch's physical changes, in order: a tag byte (table
//! and put/remove), the key (u32 LE length and bytes) and, for a put, the
//! value (same framing). Replaying them reproduces exactly the tables the
//! batch left.
//!
//! # Recovery
//!
//! Every batch also stores its frame's sequence number in redb's `meta`
//! table, in the same transaction, so the last durable redb state says which
//! frames it already contains. On open, frames are read from the start:
//! a frame with a bad checksum or length ends the log (a torn append, never
//! acknowledged); frames at or below the durable sequence are skipped (left
//! over from before the last checkpoint, when the log was reused in place);
//! the next consecutive ones are applied. Anything else ends the log.
//!
//! # Segments
//!
//! The log is two files (segments, [`WAL_FILES`]). Frames go to the current
//! one; a checkpoint that runs while the writer goes on (see
//! [`super::overlay`]) first switches the writer to the other segment,
//! from its start, so the checkpoint covers every frame of the segment it
//! leaves, and the frames written meanwhile land in the other. The writer
//! switches back only after that checkpoint is durable, so a segment is
//! overwritten only once every frame in it is in the durable redb file.
//! On open, the valid frames of both segments newer than the durable
//! sequence are applied in sequence order, consecutively from it; stale
//! frames (at or below it) may follow a segment's live ones and are
//! skipped, as in the single-file log.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// File names of the log's two segments inside the data directory. The
/// writer appends to one; a checkpoint switches it to the other, so that
/// the frames written while the checkpoint runs never overwrite frames it
/// does not cover (see "Segments" above). The first is the single file of
/// earlier versions, read the same way.
pub const WAL_FILES: [&str; 2] = ["idemd.wal", "idemd.wal.1"];

const MAGIC: &[u8; 8] = b"IDEMDWAL";
const VERSION: u32 = 1;
const HEADER_LEN: u64 = 16;
const FRAME_HEADER_LEN: usize = 16;

/// The tables a logged change applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTable {
    /// `records`: record key → encoded record.
    Records = 0,
    /// `expiry`: index key → ().
    Expiry = 1,
    /// `pending`: index key → ().
    Pending = 2,
}

/// One logged change, borrowed from a frame's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change<'a> {
    /// Which table.
    pub table: LogTable,
    /// The key, as stored.
    pub key: &'a [u8],
    /// `Some` for an insert, `None` for a removal.
    pub value: Option<&'a [u8]>,
}

/// Builds one frame; the buffer is kept between batches so that the hot
/// path does not allocate.
#[derive(Debug, Default)]
pub struct FrameBuilder {
    buffer: Vec<u8>,
}

impl FrameBuilder {
    /// Starts a frame with sequence number `seq`, dropping the previous one.
    pub fn begin(&mut self, seq: u64) {
        self.buffer.clear();
        self.buffer.extend_from_slice(&[0; 8]);
        self.buffer.extend_from_slice(&seq.to_le_bytes());
    }

    /// True when no change was logged since [`FrameBuilder::begin`].
    pub fn is_empty(&self) -> bool {
        self.buffer.len() <= FRAME_HEADER_LEN
    }

    /// Logs an insert (or overwrite) of `key` with `value`.
    pub fn put(&mut self, table: LogTable, key: &[u8], value: &[u8]) {
        self.buffer.push(((table as u8) << 1) | 1);
        push_bytes(&mut self.buffer, key);
        push_bytes(&mut self.buffer, value);
    }

    /// Logs a removal of `key` (a no-op on replay if absent, as it was).
    pub fn remove(&mut self, table: LogTable, key: &[u8]) {
        self.buffer.push((table as u8) << 1);
        push_bytes(&mut self.buffer, key);
    }

    /// Seals the frame (length and checksum) and returns its bytes.
    pub fn finish(&mut self) -> io::Result<&[u8]> {
        let payload_len = u32::try_from(self.buffer.len() - FRAME_HEADER_LEN)
            .map_err(|_| io::Error::other("write-ahead log frame over 4 GiB"))?;
        self.buffer[4..8].copy_from_slice(&payload_len.to_le_bytes());
        let crc = crc32c(&self.buffer[4..]);
        self.buffer[0..4].copy_from_slice(&crc.to_le_bytes());
        Ok(&self.buffer)
    }
}

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Keys and values are bounded far below 4 GiB by request validation;
    // saturating keeps a bad length from aliasing (the frame would then fail
    // to decode on replay rather than replay something else).
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&bytes[..len as usize]);
}

fn take_bytes<'a>(input: &mut &'a [u8]) -> Option<&'a [u8]> {
    let (len, rest) = input.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
    if rest.len() < len {
        return None;
    }
    let (bytes, rest) = rest.split_at(len);
    *input = rest;
    Some(bytes)
}

/// Decodes a frame's payload into its changes, in order.
pub fn decode_changes(mut payload: &[u8]) -> Result<Vec<Change<'_>>, String> {
    let mut changes = Vec::new();
    while let Some((&tag, rest)) = payload.split_first() {
        payload = rest;
        let table = match tag >> 1 {
            0 => LogTable::Records,
            1 => LogTable::Expiry,
            2 => LogTable::Pending,
            other => return Err(format!("unknown table {other} in write-ahead log")),
        };
        let truncated = || "truncated change in write-ahead log".to_string();
        let key = take_bytes(&mut payload).ok_or_else(truncated)?;
        let value = if tag & 1 == 1 {
            Some(take_bytes(&mut payload).ok_or_else(truncated)?)
        } else {
            None
        };
        changes.push(Change { table, key, value });
    }
    Ok(changes)
}

/// Why [`Wal::append`] failed: it decides what the batch's callers are
/// told and whether the writer may go on.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The frame was not written whole (`write` failed: no space, a quota):
    /// it is not in the log, nothing of the batch is applied, and no sync
    /// failed, so the file's other pages are intact.
    #[error("write-ahead log append failed: {0}")]
    NotWritten(io::Error),
    /// The sync failed: the frame may or may not be durable.
    #[error("write-ahead log sync failed: {0}")]
    NotDurable(io::Error),
}

/// The log file, written only by the store's writer thread.
#[derive(Debug)]
pub struct Wal {
    /// The two segments.
    files: [File; 2],
    /// The segment frames are appended to.
    current: usize,
    /// Offset of the next frame in the current segment.
    end: u64,
    /// How long the last [`Wal::append`] spent writing and syncing, for the
    /// writer's per-stage timings (see [`super::stages`]).
    last_append: (Duration, Duration),
}

impl Wal {
    /// Opens the log in `dir`, creating its segments (durably) if missing.
    pub fn open(dir: &Path) -> io::Result<Self> {
        Ok(Self {
            files: [
                open_segment(dir, WAL_FILES[0])?,
                open_segment(dir, WAL_FILES[1])?,
            ],
            current: 0,
            end: HEADER_LEN,
            last_append: (Duration::ZERO, Duration::ZERO),
        })
    }
}

/// Opens one segment, creating it (durably) if missing.
fn open_segment(dir: &Path, name: &str) -> io::Result<File> {
    let path = dir.join(name);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    let len = file.metadata()?.len();
    if len < HEADER_LEN {
        // New (or torn while being created, before any frame existed).
        let mut header = [0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        file.write_all_at(&header, 0)?;
        file.sync_all()?;
        // The new directory entry must be durable too, or a crash could
        // lose the file together with frames acknowledged after this.
        File::open(dir)?.sync_all()?;
    } else {
        let mut header = [0u8; HEADER_LEN as usize];
        file.read_exact(&mut header)?;
        if &header[..8] != MAGIC {
            return Err(io::Error::other(format!(
                "{} is not an idemd write-ahead log",
                path.display()
            )));
        }
        let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        if version != VERSION {
            return Err(io::Error::other(format!(
                "{}: unsupported write-ahead log version {version}",
                path.display()
            )));
        }
    }
    Ok(file)
}

impl Wal {
    /// Reads the frames that follow `durable_seq` (see the module docs) and
    /// hands each `(seq, payload)` to `apply`, in order. Returns the last
    /// sequence number handed over (`durable_seq` if none).
    pub fn replay<E>(
        &self,
        durable_seq: u64,
        mut apply: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> io::Result<Result<u64, E>> {
        let mut segments = Vec::with_capacity(self.files.len());
        for file in &self.files {
            let len = usize::try_from(file.metadata()?.len())
                .map_err(|_| io::Error::other("write-ahead log larger than memory"))?;
            let mut contents = vec![0u8; len];
            file.read_exact_at(&mut contents, 0)?;
            segments.push(contents);
        }
        // Every valid frame newer than the durable state, by sequence.
        let mut newer = std::collections::BTreeMap::new();
        for (segment, contents) in segments.iter().enumerate() {
            let mut offset = HEADER_LEN as usize;
            while let Some(frame) = contents.get(offset..offset + FRAME_HEADER_LEN) {
                let crc = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]);
                let payload_len =
                    u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]) as usize;
                let mut seq_bytes = [0u8; 8];
                seq_bytes.copy_from_slice(&frame[8..16]);
                let seq = u64::from_le_bytes(seq_bytes);
                let frame_end = offset + FRAME_HEADER_LEN + payload_len;
                let Some(checked) = contents.get(offset + 4..frame_end) else {
                    break;
                };
                if crc32c(checked) != crc {
                    break;
                }
                if seq > durable_seq {
                    newer
                        .entry(seq)
                        .or_insert((segment, offset + FRAME_HEADER_LEN..frame_end));
                }
                offset = frame_end;
            }
        }
        let mut last = durable_seq;
        for (seq, (segment, payload)) in newer {
            if seq != last + 1 {
                break;
            }
            if let Err(error) = apply(seq, &segments[segment][payload]) {
                return Ok(Err(error));
            }
            last = seq;
        }
        Ok(Ok(last))
    }

    /// Appends a frame and makes it durable (`fdatasync`).
    ///
    /// A frame that could not be written whole ([`AppendError::NotWritten`],
    /// e.g. the disk is full) is no frame: its checksum cannot match, so a
    /// replay stops there, and the next append overwrites it. After a failed
    /// sync ([`AppendError::NotDurable`]) the frame may or may not be on
    /// disk, and the kernel may have dropped other unwritten pages of the
    /// file too: the caller must stop writing (see the writer's poisoning).
    pub fn append(&mut self, frame: &[u8]) -> Result<(), AppendError> {
        let started = Instant::now();
        let file = &self.files[self.current];
        file.write_all_at(frame, self.end)
            .map_err(AppendError::NotWritten)?;
        let written = Instant::now();
        file.sync_data().map_err(AppendError::NotDurable)?;
        self.last_append = (written - started, written.elapsed());
        self.end += frame.len() as u64;
        Ok(())
    }

    /// Time the last successful [`Wal::append`] spent in `write` and in
    /// `fdatasync`.
    pub fn last_append_times(&self) -> (Duration, Duration) {
        self.last_append
    }

    /// Bytes of frames in the current segment since the last
    /// [`Wal::reset`] or [`Wal::switch`].
    pub fn pending_bytes(&self) -> u64 {
        self.end - HEADER_LEN
    }

    /// Goes on in the other segment, from its start. Only once every frame
    /// of that segment is in the durable redb file (see "Segments").
    pub fn switch(&mut self) {
        self.current = 1 - self.current;
        self.end = HEADER_LEN;
    }

    /// Restarts the log at its beginning, once a durable redb commit holds
    /// every frame written so far. The old frames are not erased: recovery
    /// skips them by sequence number, and overwriting in place (rather than
    /// truncating and appending) keeps the file's size and blocks unchanged,
    /// so an `fdatasync` does not also have to commit file-system metadata.
    pub fn reset(&mut self) {
        self.end = HEADER_LEN;
    }
}

/// CRC-32C (Castagnoli): the checksum LevelDB-style logs use to find a torn
/// tail, and the block sums of the redb file. With the CPU's CRC
/// instruction (SSE 4.2, ARMv8 CRC) where it has one, portable code
/// otherwise: the block sums check every page redb reads, so the portable
/// slicing-by-8 this replaced (~1-2 GB/s) cost 5% of the request threads'
/// CPU in the fresh-Claim bench.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums on disk (log frames, block sums) must not change with the
    /// implementation: every length and alignment against the bitwise
    /// definition.
    #[test]
    fn crc32c_matches_the_bitwise_definition_at_every_length() {
        fn bitwise(bytes: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &byte in bytes {
                crc ^= u32::from(byte);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 {
                        (crc >> 1) ^ 0x82f6_3b78
                    } else {
                        crc >> 1
                    };
                }
            }
            !crc
        }
        let data: Vec<u8> = (0..4200u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..9 {
            for len in (0..300).chain([4095, 4096, 4097 - start]) {
                let slice = &data[start..start + len];
                assert_eq!(crc32c(slice), bitwise(slice), "start {start}, len {len}");
            }
        }
    }

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(b""), 0);
    }

    fn frame(seq: u64, key: &[u8]) -> Vec<u8> {
        let mut builder = FrameBuilder::default();
        builder.begin(seq);
        builder.put(LogTable::Records, key, b"value");
        builder.remove(LogTable::Pending, b"gone");
        builder.finish().expect("frame").to_vec()
    }

    fn replayed(wal: &Wal, durable: u64) -> Vec<(u64, Vec<u8>)> {
        let mut seen = Vec::new();
        let last = wal
            .replay(durable, |seq, payload| {
                let changes = decode_changes(payload)?;
                seen.push((seq, changes[0].key.to_vec()));
                Ok::<(), String>(())
            })
            .expect("read")
            .expect("apply");
        assert_eq!(last, seen.last().map_or(durable, |(seq, _)| *seq));
        seen
    }

    #[test]
    fn frames_round_trip_and_replay_after_the_durable_point() {
        let dir = tempfile::tempdir().expect("dir");
        let mut wal = Wal::open(dir.path()).expect("open");
        for seq in 1..=3 {
            wal.append(&frame(seq, format!("k{seq}").as_bytes()))
                .expect("append");
        }
        let payload_changes = {
            let bytes = frame(9, b"k");
            decode_changes(&bytes[FRAME_HEADER_LEN..])
                .expect("decode")
                .iter()
                .map(|c| (c.table, c.key.to_vec(), c.value.map(<[u8]>::to_vec)))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            payload_changes,
            vec![
                (LogTable::Records, b"k".to_vec(), Some(b"value".to_vec())),
                (LogTable::Pending, b"gone".to_vec(), None),
            ]
        );
        drop(wal);
        let wal = Wal::open(dir.path()).expect("reopen");
        assert_eq!(
            replayed(&wal, 1),
            vec![(2, b"k2".to_vec()), (3, b"k3".to_vec())]
        );
        assert!(replayed(&wal, 3).is_empty());
    }

    /// What a full disk leaves: part of a frame written where the log
    /// ends, and no advance of the end. A replay ignores it, and the next
    /// append (the retried batch, same sequence number) overwrites it.
    #[test]
    fn a_frame_not_written_whole_is_no_frame_and_is_overwritten() {
        let dir = tempfile::tempdir().expect("dir");
        let mut wal = Wal::open(dir.path()).expect("open");
        wal.append(&frame(1, b"a")).expect("append");
        let refused = frame(2, b"refused-batch");
        wal.files[wal.current]
            .write_all_at(&refused[..refused.len() / 2], wal.end)
            .expect("half a frame");
        assert_eq!(replayed(&wal, 0), vec![(1, b"a".to_vec())]);
        wal.append(&frame(2, b"b")).expect("append");
        wal.append(&frame(3, b"c")).expect("append");
        assert_eq!(
            replayed(&wal, 0),
            vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"c".to_vec())]
        );
    }

    /// A checkpoint switches segments; the frames written meanwhile are in
    /// the other one. Replay follows the sequence across both, whatever
    /// the durable point, and the first segment's reuse (once the
    /// checkpoint is durable) leaves its stale frames behind unreplayed.
    #[test]
    fn replay_follows_the_sequence_across_both_segments() {
        let dir = tempfile::tempdir().expect("dir");
        let mut wal = Wal::open(dir.path()).expect("open");
        for seq in 1..=3 {
            wal.append(&frame(seq, format!("a{seq}").as_bytes()))
                .expect("append");
        }
        wal.switch();
        for seq in 4..=5 {
            wal.append(&frame(seq, format!("b{seq}").as_bytes()))
                .expect("append");
        }
        let keys = |wal: &Wal, durable| {
            replayed(wal, durable)
                .into_iter()
                .map(|(seq, key)| (seq, String::from_utf8(key).expect("utf-8")))
                .collect::<Vec<_>>()
        };
        // The checkpoint covering 1..=3 did not finish: all five.
        assert_eq!(
            keys(&wal, 0),
            [(1, "a1"), (2, "a2"), (3, "a3"), (4, "b4"), (5, "b5")]
                .map(|(s, k)| (s, k.to_string()))
        );
        // It did: the second segment's.
        assert_eq!(
            keys(&wal, 3),
            [(4, "b4"), (5, "b5")].map(|(s, k)| (s, k.to_string()))
        );
        // The next checkpoint (covering 4..=5) switches back to the first
        // segment, whose frames are all durable by then; 1..=3 stay stale
        // behind the new frame.
        wal.switch();
        wal.append(&frame(6, b"a6")).expect("append");
        let wal = Wal::open(dir.path()).expect("reopen");
        assert_eq!(
            keys(&wal, 3),
            [(4, "b4"), (5, "b5"), (6, "a6")].map(|(s, k)| (s, k.to_string()))
        );
        assert_eq!(keys(&wal, 5), [(6, "a6")].map(|(s, k)| (s, k.to_string())));
    }

    #[test]
    fn a_torn_tail_ends_the_log() {
        let dir = tempfile::tempdir().expect("dir");
        let mut wal = Wal::open(dir.path()).expect("open");
        wal.append(&frame(1, b"a")).expect("append");
        let mut torn = frame(2, b"b");
        let last = torn.len() - 1;
        torn[last] ^= 0xff;
        wal.append(&torn).expect("append");
        wal.append(&frame(3, b"c")).expect("append");
        assert_eq!(replayed(&wal, 0), vec![(1, b"a".to_vec())]);
    }

    #[test]
    fn a_reused_log_skips_old_frames_and_stops_at_a_gap() {
        let dir = tempfile::tempdir().expect("dir");
        let mut wal = Wal::open(dir.path()).expect("open");
        for seq in 1..=4 {
            wal.append(&frame(seq, b"old-and-longer-key"))
                .expect("append");
        }
        // Checkpoint at 4, then the log is reused in place.
        wal.reset();
        wal.append(&frame(5, b"new")).expect("append");
        assert_eq!(replayed(&wal, 4), vec![(5, b"new".to_vec())]);
        // Frames left from before the checkpoint are never replayed again,
        // even where they still parse.
        let mut wal = Wal::open(dir.path()).expect("reopen");
        wal.reset();
        wal.append(&frame(5, b"old-and-longer-key"))
            .expect("append");
        assert_eq!(replayed(&wal, 4), vec![(5, b"old-and-longer-key".to_vec())]);
    }
}
