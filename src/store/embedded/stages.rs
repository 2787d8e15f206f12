//! Where a write's time goes in the writer, per operation, as metrics: what
//! tells the cause of a slow write.
//!
//! Every answered write is split into stages, each recorded in
//! [`EMBEDDED_WRITE_STAGE`](crate::metrics::EMBEDDED_WRITE_STAGE) (weighted
//! per operation, so percentiles are what callers see), and its whole time
//! in the store in [`EMBEDDED_WRITE`](crate::metrics::EMBEDDED_WRITE)
//! labelled with the stage that took the largest share: the worst 0.1% of
//! that histogram name their own cause. Checkpoints are timed on their own
//! in [`EMBEDDED_CHECKPOINT`](crate::metrics::EMBEDDED_CHECKPOINT).

use std::time::{Duration, Instant};

use crate::metrics::{EMBEDDED_WRITE, EMBEDDED_WRITE_STAGE};

/// The stages of a write, in the order it passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// In the queue while the writer worked on other batches.
    Queue,
    /// In the queue while the writer did its own part of a checkpoint:
    /// taking the outcome of a background checkpoint and folding the
    /// overlay into redb (the checkpoint itself runs beside the writer).
    CheckpointWait,
    /// The batch's operations applied (reads, conditions, encoding).
    Apply,
    /// The log frame written (`write`, no sync).
    LogWrite,
    /// The log frame synced (`fdatasync`).
    Fsync,
    /// The batch made visible to readers (a non-durable redb commit, or
    /// the publication of the overlay).
    Commit,
}

impl Stage {
    /// Every stage, in order.
    const ALL: [Stage; 6] = [
        Stage::Queue,
        Stage::CheckpointWait,
        Stage::Apply,
        Stage::LogWrite,
        Stage::Fsync,
        Stage::Commit,
    ];

    /// The `stage` label value.
    pub(super) fn name(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::CheckpointWait => "checkpoint_wait",
            Stage::Apply => "apply",
            Stage::LogWrite => "log_write",
            Stage::Fsync => "fsync",
            Stage::Commit => "commit",
        }
    }
}

/// The batch-wide stages of one batch (every operation of it shares them).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct BatchTimes {
    /// [`Stage::Apply`].
    pub(super) apply: Duration,
    /// [`Stage::LogWrite`].
    pub(super) log_write: Duration,
    /// [`Stage::Fsync`].
    pub(super) fsync: Duration,
    /// [`Stage::Commit`].
    pub(super) commit: Duration,
}

/// The stages of one operation: the batch's, and its own time in the queue
/// split by what the writer was doing meanwhile.
fn stages_of(
    queued_at: Instant,
    started: Instant,
    checkpoint: Option<(Instant, Instant)>,
    batch: &BatchTimes,
) -> [Duration; 6] {
    let waited = started.saturating_duration_since(queued_at);
    // The part of the wait that overlapped the writer's part of the last
    // checkpoint (the writer does nothing else meanwhile).
    let behind_checkpoint = checkpoint.map_or(Duration::ZERO, |(from, to)| {
        to.saturating_duration_since(from.max(queued_at))
            .min(waited)
    });
    [
        waited - behind_checkpoint,
        behind_checkpoint,
        batch.apply,
        batch.log_write,
        batch.fsync,
        batch.commit,
    ]
}

/// Records the stages of every operation of a batch that started at
/// `started`, answered now; `checkpoint` is the span of the writer's part
/// of the last checkpoint before it.
pub(super) fn record(
    queued: impl Iterator<Item = Instant>,
    started: Instant,
    checkpoint: Option<(Instant, Instant)>,
    batch: &BatchTimes,
) {
    let answered = Instant::now();
    let stage = Stage::ALL.map(|stage| {
        metrics::histogram!(EMBEDDED_WRITE_STAGE, "backend" => "embedded", "stage" => stage.name())
    });
    let slowest = Stage::ALL.map(|stage| {
        metrics::histogram!(EMBEDDED_WRITE, "backend" => "embedded", "slowest_stage" => stage.name())
    });
    // The batch-wide stages are the same for every operation: recorded
    // once with a count.
    let mut count = 0;
    for queued_at in queued {
        count += 1;
        let times = stages_of(queued_at, started, checkpoint, batch);
        stage[0].record(times[0].as_secs_f64());
        stage[1].record(times[1].as_secs_f64());
        let (index, _) = times
            .iter()
            .enumerate()
            .max_by_key(|(_, time)| **time)
            .unwrap_or((0, &Duration::ZERO));
        slowest[index].record(answered.saturating_duration_since(queued_at).as_secs_f64());
    }
    for (index, time) in [batch.apply, batch.log_write, batch.fsync, batch.commit]
        .into_iter()
        .enumerate()
    {
        stage[index + 2].record_many(time.as_secs_f64(), count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_behind_a_checkpoint_is_split_from_the_queue() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let batch = BatchTimes {
            apply: ms(1),
            log_write: ms(0),
            fsync: ms(2),
            commit: ms(0),
        };
        // Queued at 0, a checkpoint ran from 5 to 45, the batch started at
        // 50: 40 ms behind the checkpoint, 10 ms behind other batches.
        let times = stages_of(t0, t0 + ms(50), Some((t0 + ms(5), t0 + ms(45))), &batch);
        assert_eq!(times, [ms(10), ms(40), ms(1), ms(0), ms(2), ms(0)]);
        // Queued after the checkpoint began: only the rest of it counts.
        let times = stages_of(
            t0 + ms(20),
            t0 + ms(50),
            Some((t0 + ms(5), t0 + ms(45))),
            &batch,
        );
        assert_eq!(times[..2], [ms(5), ms(25)]);
        // Queued after the checkpoint ended: none of it.
        let times = stages_of(
            t0 + ms(46),
            t0 + ms(50),
            Some((t0 + ms(5), t0 + ms(45))),
            &batch,
        );
        assert_eq!(times[..2], [ms(4), ms(0)]);
    }
}
