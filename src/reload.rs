//! Re-reading files while running: one loop for every file idemd watches.
//!
//! # Why one loop
//!
//! Tokens, the client-certificate mapping and the TLS certificate are
//! rotated by rewriting mounted files (Kubernetes Secrets, cert-manager).
//! Each used to have its own watcher with its own one-second poll and its
//! own SIGHUP handler. Now one task polls every registered [`Source`]
//! (modification time and size, every `--reload-interval`) and re-reads all
//! of them on SIGHUP, so there is one signal handler, one interval, and one
//! stream of outcomes: a log line, the [`crate::metrics::RELOADS`] counter,
//! and [`Reloader::subscribe`], which lets a test wait for the reload it
//! caused instead of sleeping past the poll.
//!
//! # Contract of a source
//!
//! [`Source::reload`] either swaps in the new version or, when the file is
//! unusable, keeps the previous one and returns why: a half-written or bad
//! rotation never takes the server down or locks callers out.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;

/// Default of `--reload-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Events kept for a subscriber that falls behind (older ones are dropped;
/// subscribers are tests and are never that slow).
const EVENT_BACKLOG: usize = 64;

/// Modification time and size of a file (`None` if it cannot be read).
pub type Stamp = Option<(SystemTime, u64)>;

/// The stamp of `path` now.
pub fn file_stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// Something built from files that can be re-read in place.
pub trait Source: Send + Sync + 'static {
    /// Short name for logs, metrics and events (`auth tokens`).
    fn name(&self) -> &'static str;
    /// The files it is built from: a change to any of them reloads it.
    fn paths(&self) -> Vec<PathBuf>;
    /// Re-reads the files. `Ok` describes what is now in force (for the
    /// log); `Err` says why the files are unusable, and the previous
    /// version stays in force.
    fn reload(&self) -> Result<String, String>;
}

/// Why a reload ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP: every source is re-read.
    Signal,
    /// A file of this source changed.
    FileChanged,
}

/// The outcome of one reload of one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadEvent {
    /// [`Source::name`].
    pub source: &'static str,
    /// Why it ran.
    pub trigger: Trigger,
    /// What [`Source::reload`] returned.
    pub result: Result<String, String>,
}

/// Subscribes to a running [`Reloader`]'s outcomes.
#[derive(Debug, Clone)]
pub struct ReloadEvents(broadcast::Sender<ReloadEvent>);

impl ReloadEvents {
    /// Reload outcomes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ReloadEvent> {
        self.0.subscribe()
    }
}

/// The registered sources and the loop that watches them.
pub struct Reloader {
    /// How often file stamps are compared.
    interval: Duration,
    /// Every source with the stamps of its files when last looked at.
    sources: Vec<(Arc<dyn Source>, Vec<Stamp>)>,
    /// Where outcomes go besides the log and the metric.
    events: broadcast::Sender<ReloadEvent>,
}

impl Reloader {
    /// A reloader that compares stamps every `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            sources: Vec::new(),
            events: broadcast::channel(EVENT_BACKLOG).0,
        }
    }

    /// Watches `source` from now on (its current files count as loaded).
    pub fn add(&mut self, source: Arc<dyn Source>) {
        let stamps = stamps(source.as_ref());
        self.sources.push((source, stamps));
    }

    /// Whether anything is watched.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Reload outcomes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ReloadEvent> {
        self.events.subscribe()
    }

    /// A handle to subscribe with after the reloader has moved into its
    /// task.
    pub fn events(&self) -> ReloadEvents {
        ReloadEvents(self.events.clone())
    }

    /// Compares stamps (every source on a signal) and reloads what
    /// changed. One pass of [`Reloader::run`].
    pub fn check(&mut self, trigger: Trigger) {
        for (source, last) in &mut self.sources {
            let now = stamps(source.as_ref());
            if trigger == Trigger::FileChanged && now == *last {
                continue;
            }
            // Recorded before reloading: a bad file is reported once, and
            // the next write to it (the fix) is a change again.
            *last = now;
            let result = source.reload();
            let name = source.name();
            match &result {
                Ok(summary) => {
                    tracing::info!(source = name, ?trigger, %summary, "reloaded");
                }
                Err(error) => tracing::error!(
                    source = name,
                    ?trigger,
                    %error,
                    "file unusable; keeping the previous version"
                ),
            }
            let outcome = if result.is_ok() { "ok" } else { "error" };
            metrics::counter!(crate::metrics::RELOADS, "source" => name, "result" => outcome)
                .increment(1);
            let _ = self.events.send(ReloadEvent {
                source: name,
                trigger,
                result,
            });
        }
    }

    /// Polls every `interval` and reloads everything on SIGHUP, until the
    /// task is dropped.
    pub async fn run(mut self) {
        #[cfg(unix)]
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let signalled = async {
                match hangup.as_mut() {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let signalled = std::future::pending::<()>();
            let trigger = tokio::select! {
                () = signalled => Trigger::Signal,
                () = tokio::time::sleep(self.interval) => Trigger::FileChanged,
            };
            self.check(trigger);
        }
    }
}

fn stamps(source: &dyn Source) -> Vec<Stamp> {
    source.paths().iter().map(|path| file_stamp(path)).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A source that reads one file and refuses the text "bad".
    struct FileText {
        path: PathBuf,
        current: Mutex<String>,
    }

    impl Source for FileText {
        fn name(&self) -> &'static str {
            "text"
        }
        fn paths(&self) -> Vec<PathBuf> {
            vec![self.path.clone()]
        }
        fn reload(&self) -> Result<String, String> {
            let text = std::fs::read_to_string(&self.path).map_err(|e| e.to_string())?;
            if text == "bad" {
                return Err("bad text".to_string());
            }
            *self.current.lock().expect("lock") = text.clone();
            Ok(text)
        }
    }

    #[test]
    fn reloads_changed_files_keeps_the_last_good_version_and_reports_each_outcome() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        // Sizes differ on every write: two writes within one tick of the
        // file system's clock have the same modification time.
        std::fs::write(&path, "first").expect("write");
        let source = Arc::new(FileText {
            path: path.clone(),
            current: Mutex::new("first".to_string()),
        });
        let mut reloader = Reloader::new(DEFAULT_INTERVAL);
        reloader.add(source.clone());
        let mut events = reloader.subscribe();

        reloader.check(Trigger::FileChanged);
        assert!(events.try_recv().is_err(), "nothing changed, nothing read");

        std::fs::write(&path, "bad").expect("write");
        reloader.check(Trigger::FileChanged);
        let event = events.try_recv().expect("an event");
        assert_eq!(event.result, Err("bad text".to_string()));
        assert_eq!(*source.current.lock().expect("lock"), "first");
        reloader.check(Trigger::FileChanged);
        assert!(events.try_recv().is_err(), "a bad file is reported once");

        std::fs::write(&path, "two!").expect("write");
        reloader.check(Trigger::FileChanged);
        assert_eq!(events.try_recv().expect("event").result, Ok("two!".into()));
        reloader.check(Trigger::Signal);
        let event = events.try_recv().expect("a signal re-reads");
        assert_eq!(event.trigger, Trigger::Signal);
        assert_eq!(*source.current.lock().expect("lock"), "two!");
    }
}
