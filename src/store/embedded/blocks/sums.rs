//! [`Blocks`]: the database file, its sums and what was found wrong with
//! it, and the decision whether the sums opened with the file can be
//! trusted ([`Trust`]). The folder's module docs (`blocks`) say why and
//! how; the backend redb drives ([`super::backend`]) and the scrub
//! ([`super::scrub`]) work on this type.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use redb::StorageBackend;
use redb::backends::FileBackend;

use super::layout::{BLOCK, block_count, is_set, lock, read_lock, to_index, write_lock, zero_sum};
use super::sidecar::{self, Header, Sidecar};
use super::writeback::WriteBack;
use crate::store::StoreError;
use crate::store::embedded::wal::crc32c;

/// File name of the checksums, beside the database file.
pub const SUMS_FILE: &str = "idemd.redb.sums";

/// Whether the sums opened with the file can be used as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store::embedded) enum Trust {
    /// Reads are checked from the first one.
    Verified,
    /// The whole file must be checked and summed before serving; the reason
    /// is logged.
    Rebuild(String),
}

/// The database file, its sums and what was found wrong with it. Shared by
/// the storage backend redb owns and the scrub thread.
#[derive(Debug)]
pub(crate) struct Blocks {
    /// The database file (redb's own backend: locking, positioned I/O).
    pub(super) data: FileBackend,
    /// Where the sums persist.
    pub(super) sidecar: Sidecar,
    /// One CRC-32C per block, as last written.
    pub(super) sums: RwLock<Vec<u32>>,
    /// The data file's length, as last set (reads past it are redb's bug).
    pub(super) len: AtomicU64,
    /// Held across a write of the data file and the update of its sums, so
    /// a recheck under it sees both or neither.
    pub(super) io: Mutex<()>,
    /// Reads are checked: false only while the sums are rebuilt on open.
    verifying: AtomicBool,
    /// The header as last written: the clean flag and the damage live there.
    pub(super) header: Mutex<Header>,
    /// The first damage found: every later answer of the store is this.
    pub(super) damage: OnceLock<String>,
    /// The data file's path, named in reports.
    path: PathBuf,
    /// What the file holds that no sync has reached yet ([`writeback`]).
    pub(super) write_back: WriteBack,
    /// The sums of blocks outside redb's last durable commit may be stale
    /// (see the module docs): the scrub counts a mismatch in a block this
    /// process did not write instead of calling it damage.
    unsettled: AtomicBool,
    /// One bit per block this process wrote (or summed from the disk)
    /// while unsettled: its sum is this process's, so a mismatch in it is
    /// damage even then.
    written: Mutex<Vec<u64>>,
}

impl Blocks {
    /// Opens the database file at `path` and its sums, and marks the sums
    /// as in use (a stop before [`StorageBackend::close`] is unclean).
    /// Refuses a file whose damage was recorded earlier.
    pub(in crate::store::embedded) fn open(path: &Path) -> Result<(Arc<Self>, Trust), StoreError> {
        let io_error = |what: &str, e: io::Error| {
            crate::store::embedded::storage_error(&format!("{what} {}", path.display()), e)
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io_error("cannot open", e))?;
        let len = file
            .metadata()
            .map_err(|e| io_error("cannot stat", e))?
            .len();
        let data = FileBackend::new(file)
            .map_err(|e| crate::store::embedded::storage_error("cannot open", e))?;
        let sums_path = sums_path(path);
        let sidecar = Sidecar::open(&sums_path)
            .map_err(|e| io_error("cannot open", e))?
            .ok_or_else(|| {
                StoreError::Unavailable(format!(
                    "{} is already open in another process (the embedded store allows one owner)",
                    path.display()
                ))
            })?;
        let previous = sidecar
            .header()
            .map_err(|e| io_error("cannot read the checksums of", e))?;
        if let Some(Header {
            damage: Some((_, report)),
            ..
        }) = &previous
        {
            return Err(StoreError::Corrupt(report.clone()));
        }
        let blocks = Self {
            data,
            sidecar,
            sums: RwLock::new(Vec::new()),
            len: AtomicU64::new(len),
            io: Mutex::new(()),
            verifying: AtomicBool::new(false),
            header: Mutex::new(Header::default()),
            damage: OnceLock::new(),
            path: path.to_path_buf(),
            write_back: WriteBack::default(),
            unsettled: AtomicBool::new(false),
            written: Mutex::new(Vec::new()),
        };
        let trust = blocks
            .load(previous, len)
            .map_err(|e| io_error("cannot read the checksums of", e))?;
        let header = Header {
            complete: trust == Trust::Verified,
            clean: false,
            unsettled: blocks.is_unsettled(),
            boot_id: sidecar::boot_id(),
            damage: None,
        };
        blocks
            .persist_header(header)
            .map_err(|e| io_error("cannot write the checksums of", e))?;
        blocks
            .verifying
            .store(trust == Trust::Verified, Ordering::Release);
        Ok((Arc::new(blocks), trust))
    }

    /// Loads the sums and decides whether they describe the file.
    fn load(&self, previous: Option<Header>, len: u64) -> io::Result<Trust> {
        let blocks = block_count(len);
        let Some(previous) = previous else {
            if len == 0 {
                // A new database: every block will be written, and summed,
                // by this process.
                return Ok(Trust::Verified);
            }
            return Ok(Trust::Rebuild(
                "the file has no block checksums yet (first start of this release on it)".into(),
            ));
        };
        if !previous.complete {
            return Ok(Trust::Rebuild(
                "the last computation of its checksums did not finish".into(),
            ));
        }
        // Whatever the boot: see "When the sums can be trusted".
        self.unsettled
            .store(previous.unsettled || !previous.clean, Ordering::Release);
        let entries = self.sidecar.entry_count()?;
        if previous.clean && entries != blocks {
            return Ok(Trust::Rebuild(
                "its length does not match its checksums (changed by another program?)".into(),
            ));
        }
        // A stop inside a resize: sums are written before the file grows
        // (more sums than blocks: cut back), and blocks it grew by without
        // sums are zeros (their sum is known; were they not zeros, their
        // first read would say so).
        let mut sums = self.sidecar.entries(entries.min(blocks))?;
        if entries != blocks {
            sums.resize(to_index(blocks), zero_sum());
            self.sidecar.set_entry_count(blocks)?;
            self.sidecar.write_entries(0, &sums)?;
        }
        *write_lock(&self.sums) = sums;
        if !previous.clean
            && let Some((first, count)) = self.sidecar.in_flight()?
        {
            // The process stopped inside this write: the blocks may hold
            // the new bytes without their sums (or the reverse). redb reads
            // none of them before writing them again (they belong to no
            // durable commit; the first block is not checked).
            let last = first.saturating_add(count).min(blocks);
            let mut buffer = vec![0u8; BLOCK];
            for block in first.min(last)..last {
                let sum = self.sum_on_disk(block, &mut buffer)?;
                write_lock(&self.sums)[to_index(block)] = sum;
                self.sidecar.write_entries(block, &[sum])?;
                self.note_written(block, block + 1);
            }
            self.sidecar.mark_in_flight(0, 0)?;
        }
        if blocks > 0 {
            let mut buffer = vec![0u8; BLOCK];
            let first = self.sum_on_disk(0, &mut buffer)?;
            if read_lock(&self.sums)[0] != first {
                return Ok(Trust::Rebuild(
                    "its header changed since idemd last wrote it (another program, e.g. an older idemd, committed to it)".into(),
                ));
            }
        }
        Ok(Trust::Verified)
    }

    /// Sums every block of the file as it is now, then checks every read:
    /// after redb's integrity check has vouched for the file. Logs progress
    /// on a big file.
    pub(in crate::store::embedded) fn rebuild(&self) -> io::Result<()> {
        let _io = lock(&self.io);
        let len = self.data.len()?;
        self.len.store(len, Ordering::Release);
        let blocks = block_count(len);
        let started = Instant::now();
        let mut last_report = started;
        let mut sums = Vec::with_capacity(to_index(blocks));
        let mut buffer = vec![0u8; 256 * BLOCK];
        let mut at = 0u64;
        while at < len {
            let n = usize::try_from((len - at).min(buffer.len() as u64)).unwrap_or(buffer.len());
            self.data.read(at, &mut buffer[..n])?;
            sums.extend(buffer[..n].chunks(BLOCK).map(crc32c));
            at += n as u64;
            if last_report.elapsed().as_secs() >= 5 {
                last_report = Instant::now();
                tracing::info!(
                    done_mib = at >> 20,
                    total_mib = len >> 20,
                    "embedded store: computing block checksums"
                );
            }
        }
        self.sidecar.set_entry_count(blocks)?;
        self.sidecar.write_entries(0, &sums)?;
        *write_lock(&self.sums) = sums;
        self.sidecar.mark_in_flight(0, 0)?;
        let mut header = lock(&self.header).clone();
        header.complete = true;
        header.unsettled = false;
        self.persist_header(header)?;
        self.unsettled.store(false, Ordering::Release);
        self.verifying.store(true, Ordering::Release);
        tracing::info!(
            mib = len >> 20,
            seconds = started.elapsed().as_secs_f64(),
            "embedded store: block checksums computed; later starts check only what they read"
        );
        Ok(())
    }

    /// Writes `header` durably and remembers it.
    pub(super) fn persist_header(&self, header: Header) -> io::Result<()> {
        self.sidecar.write_header(&header)?;
        self.sidecar.sync()?;
        *lock(&self.header) = header;
        Ok(())
    }

    /// Writes the file's dirty pages back if it was written since the last
    /// sync (the checkpoint thread, between checkpoints: see
    /// [`writeback`]). A failure fails every later sync of the file.
    pub(in crate::store::embedded) fn write_back(&self) {
        self.write_back.run(|| self.data.sync_data());
    }

    /// Whether every write reached a sync of the file.
    #[cfg(test)]
    pub(in crate::store::embedded) fn is_written_back(&self) -> bool {
        !self.write_back.is_pending()
    }

    /// Makes the next write-back fail with `kind`, as `fdatasync` fails
    /// after a lost write.
    #[cfg(test)]
    pub(in crate::store::embedded) fn fail_write_back(&self, kind: io::ErrorKind) {
        self.write_back.wrote();
        self.write_back.run(|| Err(io::Error::from(kind)));
    }

    /// The damage found, if any (the text callers and operators are told).
    pub(crate) fn damage(&self) -> Option<&str> {
        self.damage.get().map(String::as_str)
    }

    /// Blocks in the file now.
    pub(in crate::store::embedded) fn block_count(&self) -> u64 {
        block_count(self.len.load(Ordering::Acquire))
    }

    /// Checks every block now, at full speed: the damage found, if any.
    pub(in crate::store::embedded) fn verify_all(&self) -> Result<(), StoreError> {
        let mut buffer = vec![0u8; 256 * BLOCK];
        let step = (buffer.len() / BLOCK) as u64;
        let mut block = 0;
        while block < self.block_count() {
            if let Err(error) = self.scrub(block, &mut buffer) {
                return Err(match self.damage() {
                    Some(report) => StoreError::Corrupt(report.to_string()),
                    None => crate::store::embedded::storage_error("cannot check the file", error),
                });
            }
            block += step;
        }
        Ok(())
    }

    /// Checks blocks `[first, first + buffer.len() / BLOCK)` (those inside
    /// the file) for the scrub: the bytes read, and how many blocks did not
    /// match sums that may be stale (unsettled, a block this process did
    /// not write). Damage found is reported.
    pub(in crate::store::embedded) fn scrub(
        &self,
        first: u64,
        buffer: &mut [u8],
    ) -> io::Result<Scrubbed> {
        let len = self.len.load(Ordering::Acquire);
        let start = first * BLOCK as u64;
        if start >= len {
            return Ok(Scrubbed::default());
        }
        let n = usize::try_from((len - start).min(buffer.len() as u64)).unwrap_or(0);
        self.data.read(start, &mut buffer[..n])?;
        let bytes = &mut buffer[..n];
        if !self.verifying.load(Ordering::Acquire) || self.mismatch(start, bytes).is_none() {
            return Ok(Scrubbed { bytes: n, stale: 0 });
        }
        if let Some(report) = self.damage.get() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, report.clone()));
        }
        // As in `check`: read again under the write lock, then judge each
        // block that still does not match.
        let _io = lock(&self.io);
        self.data.read(start, bytes)?;
        let unsettled = self.unsettled.load(Ordering::Acquire);
        let written = lock(&self.written);
        let mut stale = 0;
        for block in self.mismatches(start, bytes) {
            if unsettled && !is_set(&written, block) {
                stale += 1;
            } else {
                drop(written);
                return Err(self.report_damage(block, "the scrub"));
            }
        }
        Ok(Scrubbed { bytes: n, stale })
    }

    /// Whether the sums may be stale outside redb's last durable commit.
    pub(in crate::store::embedded) fn is_unsettled(&self) -> bool {
        self.unsettled.load(Ordering::Acquire)
    }

    /// Records that a scrub pass found every block matching: the sums
    /// describe the whole file again.
    pub(in crate::store::embedded) fn settle(&self) -> io::Result<()> {
        let _io = lock(&self.io);
        if !self.unsettled.load(Ordering::Acquire) || self.damage.get().is_some() {
            return Ok(());
        }
        let mut header = lock(&self.header).clone();
        header.unsettled = false;
        self.persist_header(header)?;
        self.unsettled.store(false, Ordering::Release);
        lock(&self.written).clear();
        tracing::info!("embedded store: every block matches its checksum again");
        Ok(())
    }

    /// Notes blocks `[first, last)` as written by this process (only
    /// needed while unsettled).
    pub(super) fn note_written(&self, first: u64, last: u64) {
        if !self.unsettled.load(Ordering::Acquire) {
            return;
        }
        let mut written = lock(&self.written);
        for block in first..last {
            let (word, bit) = (to_index(block / 64), block % 64);
            if written.len() <= word {
                written.resize(word + 1, 0);
            }
            written[word] |= 1 << bit;
        }
    }

    /// Checks `bytes`, read at block boundary `start`. A mismatch is read
    /// again under the write lock (the first read may have raced a write of
    /// the block) into `bytes`, and is damage only if it persists.
    pub(super) fn check(&self, start: u64, bytes: &mut [u8], reader: &str) -> io::Result<()> {
        if !self.verifying.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(report) = self.damage.get() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, report.clone()));
        }
        if self.mismatch(start, bytes).is_none() {
            return Ok(());
        }
        let _io = lock(&self.io);
        self.data.read(start, bytes)?;
        match self.mismatch(start, bytes) {
            None => Ok(()),
            Some(block) => Err(self.report_damage(block, reader)),
        }
    }

    /// The first block of `bytes` (read at block boundary `start`) that
    /// does not match its sum.
    fn mismatch(&self, start: u64, bytes: &[u8]) -> Option<u64> {
        let sums = read_lock(&self.sums);
        let first = start / BLOCK as u64;
        bytes.chunks(BLOCK).enumerate().find_map(|(i, chunk)| {
            let block = first + i as u64;
            // Block 0 is redb's header: see the module docs.
            (block != 0 && sums.get(to_index(block)) != Some(&crc32c(chunk))).then_some(block)
        })
    }

    /// Every block of `bytes` (read at block boundary `start`) that does
    /// not match its sum.
    fn mismatches(&self, start: u64, bytes: &[u8]) -> Vec<u64> {
        let sums = read_lock(&self.sums);
        let first = start / BLOCK as u64;
        bytes
            .chunks(BLOCK)
            .enumerate()
            .filter_map(|(i, chunk)| {
                let block = first + i as u64;
                (block != 0 && sums.get(to_index(block)) != Some(&crc32c(chunk))).then_some(block)
            })
            .collect()
    }

    /// Records damage in `block` found by `reader` (once: the first report
    /// stays), and the error its reader gets.
    fn report_damage(&self, block: u64, reader: &str) -> io::Error {
        let report = self.damage.get_or_init(|| {
            let report = format!(
                "the database file {} is damaged: block {block} (bytes {}..{}) does not match its checksum (found by {reader} at {}); idemd will not serve from it: restore the data directory from a backup (`idemd restore`, docs/operations.md)",
                self.path.display(),
                block * BLOCK as u64,
                (block + 1) * BLOCK as u64,
                humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
            );
            tracing::error!(block, found_by = reader, "{report}");
            metrics::gauge!(crate::metrics::EMBEDDED_DAMAGED_BLOCKS).set(1.0);
            let mut header = lock(&self.header).clone();
            header.damage = Some((block, report.clone()));
            if let Err(error) = self.persist_header(header) {
                tracing::error!(%error, "embedded store: cannot record the damage in the checksum file");
            }
            report
        });
        io::Error::new(io::ErrorKind::InvalidData, report.clone())
    }

    /// The sum of `block` as it is on disk now.
    pub(super) fn sum_on_disk(&self, block: u64, buffer: &mut [u8]) -> io::Result<u32> {
        let len = self.len.load(Ordering::Acquire);
        let start = block * BLOCK as u64;
        let n = usize::try_from(len.saturating_sub(start).min(BLOCK as u64)).unwrap_or(0);
        self.data.read(start, &mut buffer[..n])?;
        Ok(crc32c(&buffer[..n]))
    }
}

/// What one step of the scrub found.
#[derive(Debug, Default, Clone, Copy)]
pub(in crate::store::embedded) struct Scrubbed {
    /// Bytes read.
    pub(in crate::store::embedded) bytes: usize,
    /// Blocks that did not match sums that may be stale (see
    /// [`Blocks::scrub`]).
    pub(in crate::store::embedded) stale: u64,
}

/// The path of the sums of the database file at `path`.
fn sums_path(path: &Path) -> PathBuf {
    path.with_file_name(SUMS_FILE)
}
