//! `disk-image`: idemd started on images of its disk taken under load, as
//! a VolumeSnapshot, an LVM or EBS snapshot restored on the node that took
//! it, or a power loss leaves them.
//!
//! The data directory lives on ext4 on a loop device. Under load, at random
//! instants, idemd is SIGSTOPped (no sync can run, so the image is a state a
//! power loss could leave: what reached the disk, not the page cache), the
//! loop device's backing file is copied, and idemd continues. Then each
//! image is mounted (ext4 replays its journal, as after a power loss) and
//! idemd started on it, half of them with the boot id in the checksum
//! file's header changed (as after a reboot): each must start and serve
//! every key acknowledged before its image, and keep serving while the
//! scrub passes over the whole file (blocks written after the last sync may
//! not match their checksums in an image: not damage, see the idemd crate's
//! `store/embedded/blocks/mod.rs`). Last, a byte flipped in every block of
//! one image's database file must still be found.
//!
//! Loop devices need root (`mount -o loop`); the scenario says so and fails
//! without it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::Rng;

use crate::harness::history::Verdict;
use crate::harness::report::Report;
use crate::harness::run::{Run, Setup};
use crate::harness::workload;
use crate::plumbing::server::{Server, last_message, tail};

/// Size of the file system (sparse: the images hold what idemd wrote).
const DISK_MIB: u64 = 512;
/// The scrub's pause between passes on each image: many passes over the
/// blocks that may not match within [`SCRUBBED_FOR`].
const SCRUB_INTERVAL: &str = "100ms";
/// How long each image serves while the scrub passes.
const SCRUBBED_FOR: Duration = Duration::from_millis(1500);
/// idemd's page cache on the images' disk, in bytes.
const SMALL_CACHE: &str = "1048576";
/// What idemd logs when the scrub meets blocks written after the last
/// sync (an image holds them without their sums).
const STALE: &str = "whose checksums predate an unclean stop";
/// What idemd logs for a block that does not match its checksum.
const DAMAGE: &str = "does not match its checksum";

/// A file system on a loop device, unmounted (lazily, so a process still
/// in it cannot keep it) when dropped.
struct Mounted {
    /// Where it is mounted.
    at: PathBuf,
}

impl Mounted {
    /// Mounts the file system in `image` on `at` (created).
    fn new(image: &Path, at: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(at)?;
        run(
            "mount",
            &[
                "-o",
                "loop",
                &image.to_string_lossy(),
                &at.to_string_lossy(),
            ],
        )
        .context("the disk-image scenario mounts loop devices, which needs root")?;
        Ok(Self {
            at: at.to_path_buf(),
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = run("umount", &["-l", &self.at.to_string_lossy()]);
    }
}

/// Runs `program` with `args`; fails with its stderr unless it exits 0.
fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The scenario (see the module docs), with `images` images.
pub async fn disk_image(setup: &Setup<'_>, images: usize) -> anyhow::Result<Report> {
    let scratch = tempfile::tempdir()?;
    let backing = scratch.path().join("disk.img");
    std::fs::File::create(&backing)?.set_len(DISK_MIB << 20)?;
    run("mkfs.ext4", &["-q", "-F", &backing.to_string_lossy()])?;
    let disk = Mounted::new(&backing, &scratch.path().join("disk"))?;
    // A small page cache: redb's write buffer overflows into the file
    // between checkpoints, as on a store larger than its cache (the issue's
    // 2.6 GB store); with everything in memory until the checkpoint, an
    // image would rarely catch a block newer than its sum.
    let scrubbing = vec![
        "--store-scrub-interval".to_string(),
        SCRUB_INTERVAL.into(),
        "--store-cache-bytes".into(),
        SMALL_CACHE.into(),
    ];
    let server = Server::new(
        setup.bin,
        &disk.at.join("data"),
        setup.log_dir,
        scrubbing.clone(),
    )?;
    let mut run = Run::start_with(vec![server], &setup.load, tempfile::tempdir()?).await?;
    let mut taken = Vec::new();
    for i in 0..images {
        let pause = rand::rng().random_range(300..1200);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        run.history.phase(&format!("image-{i}"));
        run.servers[0].signal("STOP").await?;
        let acknowledged = run.history.acknowledged_now();
        let image = scratch.path().join(format!("image-{i}.img"));
        let copied = tokio::process::Command::new("cp")
            .arg("--sparse=always")
            .arg(&backing)
            .arg(&image)
            .status()
            .await;
        run.servers[0].signal("CONT").await?;
        if !copied?.success() {
            bail!("copying {} failed", backing.display());
        }
        taken.push((image, acknowledged));
    }
    run.stop_clients().await?;
    run.servers[0].kill9().await?;
    drop(disk);

    let mut verdict: Option<Verdict> = None;
    let mut notes = Vec::new();
    let mut recovery_ms = Vec::new();
    for (i, (image, acknowledged)) in taken.iter().enumerate() {
        let step = format!("image {i}");
        run.history.phase(&step);
        let mounted = Mounted::new(image, &scratch.path().join(format!("image-{i}")))?;
        let data = mounted.at.join("data");
        let reboot = i % 2 == 1;
        if reboot {
            change_boot_id(&data.join(idemd::store::embedded::SUMS_FILE))?;
        }
        let mut server = Server::new(setup.bin, &data, setup.log_dir, scrubbing.clone())?;
        let started = match server.start().await {
            Ok(took) => took,
            Err(error) => {
                run.history.unexpected(format!(
                    "{step} (reboot: {reboot}) did not start: {error:#}"
                ));
                continue;
            }
        };
        recovery_ms.push(u64::try_from(started.as_millis()).unwrap_or(u64::MAX));
        let finals = workload::finals(&server.address, &run.history).await?;
        let found = run.history.verdict_as_of(acknowledged, &finals);
        tokio::time::sleep(SCRUBBED_FOR).await;
        let log = server.log();
        let damaged = server.not_serving().await || log.contains(DAMAGE);
        let counted = log.contains(STALE);
        if damaged {
            run.history.unexpected(format!(
                "{step} (reboot: {reboot}) was declared damaged: {}",
                tail(&server.log())
            ));
        }
        notes.push(format!(
            "{step} (boot id {}): started in {} ms, {} keys acknowledged before it checked, {} lost, damage declared: {damaged}, blocks newer than their sums counted by the scrub: {counted}",
            if reboot { "changed" } else { "kept" },
            started.as_millis(),
            found.keys,
            found.lost.len()
        ));
        let _ = server.stop().await;
        drop(mounted);
        verdict = Some(super::restore::merge(verdict.take(), &step, found));
    }
    if let Some((image, _)) = taken.last() {
        run.history.phase("flipped");
        notes.push(
            flipped_bytes_are_found(setup, image, &scratch.path().join("flipped"), &run).await?,
        );
    }
    // The images are judged above; the run's own answers (no key executed
    // twice, no replay of a body no holder sent, every unexpected answer,
    // including those noted above) from the whole history.
    let whole = run.history.verdict(
        &Default::default(),
        crate::harness::history::DataLoss::IsLoss,
    );
    let mut verdict = verdict.unwrap_or_default();
    verdict.double = whole.double;
    verdict.wrong_replays.extend(whole.wrong_replays);
    for item in whole.unexpected {
        if !verdict.unexpected.contains(&item) {
            verdict.unexpected.push(item);
        }
    }
    Ok(Report {
        scenario: "disk-image".into(),
        injected: format!(
            "{images} images of ext4 on a loop device taken under load (idemd SIGSTOPped, backing file copied), each started with the boot id kept or changed; then a byte flipped in every block of one image's database file"
        ),
        verdict,
        recovery_ms,
        notes,
        seconds: run.started.elapsed().as_secs_f64(),
    })
}

/// Writes another boot id into the header of the checksum file at `path`
/// (bytes 24..60, the header's CRC-32C at 1100..1104 recomputed): what a
/// reboot between the image and the start would leave.
fn change_boot_id(path: &Path) -> anyhow::Result<()> {
    let mut bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() < 1104 {
        bail!("{} has no header", path.display());
    }
    bytes[24..60].copy_from_slice(b"00000000-1111-2222-3333-444444444444");
    let crc = idemd::store::embedded::wal::crc32c(&bytes[..1100]);
    bytes[1100..1104].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(path, &bytes)?;
    Ok(())
}

/// Flips a byte in every block of the database file of `image` (past the
/// header block) and starts idemd on it: the damage must be named, at the
/// start or by health turning NOT_SERVING. What it found, in words.
async fn flipped_bytes_are_found(
    setup: &Setup<'_>,
    image: &Path,
    at: &Path,
    run: &Run,
) -> anyhow::Result<String> {
    let mounted = Mounted::new(image, at)?;
    let data = mounted.at.join("data");
    let path = data.join("idemd.redb");
    let mut bytes = std::fs::read(&path)?;
    let blocks = bytes.len() / 4096;
    for block in 1..blocks {
        bytes[block * 4096 + 100] ^= 0x5a;
    }
    std::fs::write(&path, &bytes)?;
    let mut server = Server::new(setup.bin, &data, setup.log_dir, Vec::new())?;
    let said = match server.start_expecting_exit(Duration::from_secs(10)).await? {
        Some(status) => {
            let message = last_message(&server.log());
            if status.success() || !message.contains("damaged") {
                run.history.unexpected(format!(
                    "a byte flipped in each of {blocks} blocks: exit {status}, {message}"
                ));
            }
            format!("a byte flipped in each of {blocks} blocks: refused to start: {message}")
        }
        None => {
            let waited = Instant::now();
            let found = server.until_not_serving(Duration::from_secs(10)).await;
            let _ = server.stop().await;
            if found.is_none() {
                run.history.unexpected(format!(
                    "a byte flipped in each of {blocks} blocks: still SERVING {} ms after the start",
                    waited.elapsed().as_millis()
                ));
            }
            format!(
                "a byte flipped in each of {blocks} blocks: NOT_SERVING after the start: {}",
                found.is_some()
            )
        }
    };
    drop(mounted);
    Ok(said)
}
