//! The handle the task manager holds on the restore thread: it starts the
//! thread and its consumer, submits and cancels jobs, reads their outcomes
//! and the standby checkpoints.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;

use super::restore_loop::RestoreLoop;
use super::RestoreListener;
use crate::error::{Error, Result};
use crate::store::published::Role;
use crate::store::KeyValueStore;

/// The stores of one partition to bring up to date.
pub(crate) struct RestoreJob {
    pub(crate) partition: i32,
    pub(crate) stores: Vec<KeyValueStore>,
    /// A standby: follow the changelogs until cancelled instead of
    /// completing at their end.
    pub(crate) standby: bool,
    /// The task's tracing span: the restore thread logs the job's lines in it.
    pub(crate) span: tracing::Span,
}

/// What the restore thread hands back.
pub(crate) enum RestoreOutcome {
    /// Every store of the partition is up to date.
    Done(RestoreJob),
    /// The restore failed; the job's stores are returned unchanged past the failure.
    Failed(RestoreJob, Error),
}

pub(super) enum Command {
    Start(RestoreJob),
    Cancel(i32, Sender<Option<RestoreJob>>),
    Shutdown,
}

/// The checkpoints of the standby stores the restore thread follows, by
/// (partition, store index), as of their last written batch.
#[derive(Clone)]
pub(crate) struct StandbyOffsets(Arc<std::sync::Mutex<HashMap<(i32, usize), i64>>>);

impl StandbyOffsets {
    /// Per standby partition, the sum of its stores' (checkpoint + 1).
    pub(crate) fn sums(&self) -> std::collections::BTreeMap<i32, i64> {
        let mut sums = std::collections::BTreeMap::new();
        for ((p, _), c) in self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            *sums.entry(*p).or_insert(0) += c + 1;
        }
        sums
    }
}

/// Handle to the restore thread.
pub(crate) struct Restorer {
    commands: Sender<Command>,
    pub(crate) outcomes: Receiver<RestoreOutcome>,
    thread: Option<JoinHandle<()>>,
    /// Per (standby partition, store index), the store's checkpoint
    /// ([`StandbyOffsets::sums`] adds them up per partition).
    standby_offsets: Arc<std::sync::Mutex<HashMap<(i32, usize), i64>>>,
}

/// librdkafka's pause for a partition whose fetch queue is full: short
/// enough that a 16 MiB queue never runs dry, long enough that the fetch
/// thread sleeps instead of spinning (shared with the processing consumer).
pub(crate) const FETCH_QUEUE_BACKOFF_MS: &str = "10";

impl Restorer {
    /// Starts the restore thread with a consumer built from `config`.
    pub(crate) fn start(
        mut config: ClientConfig,
        listener: Arc<dyn RestoreListener>,
        timeout: Duration,
        committed: Option<super::restore_loop::CommittedOffsets>,
    ) -> Result<Restorer> {
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            // Exactly-once commits write changelogs in transactions: apply
            // committed records only (librdkafka's default, set so that no
            // `kafka_config` override changes it). The end of a restore is
            // then the last stable offset, and transaction markers (offsets
            // without records) are passed by the position checks.
            .set("isolation.level", "read_committed");
        // Bulk reading: once a partition has queued.min.messages (default
        // 100000) queued, librdkafka pauses its fetches for
        // fetch.queue.backoff.ms (default 1 s), which throttled restores to a
        // fraction of the broker's rate. A short pause, a deeper
        // per-partition queue, and a 16 MiB payload cap on the whole queue:
        // every queued message costs several hundred bytes beyond its
        // payload, so the cap is what bounds RSS (5M records: 32 MiB ->
        // ~450 MiB RSS, 16 MiB -> ~280 MiB, same rate; BENCHMARKS.md). The
        // pause must not be 0: with a full queue librdkafka's fetch thread
        // then re-checks it in a busy loop (2M records: 2.97 s of fetch
        // thread CPU instead of 0.58 s, and a 40% slower restore).
        crate::kafka::client::set_default(&mut config, "fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
        crate::kafka::client::set_default(&mut config, "queued.min.messages", "500000");
        crate::kafka::client::set_default(&mut config, "queued.max.messages.kbytes", "16384");
        crate::kafka::client::set_default(&mut config, "max.partition.fetch.bytes", "8388608");
        // A fetch parked at the broker (default up to 500 ms once a partition
        // is caught up) delays every request behind it on the connection:
        // the next restore's watermark query and its first fetch.
        crate::kafka::client::set_default(&mut config, "fetch.wait.max.ms", "10");
        let consumer: BaseConsumer = config.create()?;
        // The live-tail search reads a few records per probe: small fetches
        // (the restore's 8 MiB per partition would be fetched per probe).
        let mut probe_config = config.clone();
        probe_config
            .set("max.partition.fetch.bytes", "65536")
            .set("queued.min.messages", "1000")
            .set("queued.max.messages.kbytes", "1024");
        let (ctx, crx) = mpsc::channel();
        let (otx, orx) = mpsc::channel();
        let standby_offsets = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let published = standby_offsets.clone();
        let thread = std::thread::Builder::new()
            .name("kstate-restore".into())
            .spawn(move || RestoreLoop::new(consumer, probe_config, listener, timeout, otx, published, committed).run(crx))
            .map_err(|e| Error::io("kstate-restore thread", e))?;
        Ok(Restorer { commands: ctx, outcomes: orx, thread: Some(thread), standby_offsets })
    }

    /// The standby checkpoints, readable from any thread without the task
    /// manager (the group subscription reads them).
    pub(crate) fn standby_offsets(&self) -> StandbyOffsets {
        StandbyOffsets(self.standby_offsets.clone())
    }

    /// Queues a partition's stores for restore.
    pub(crate) fn submit(&self, job: RestoreJob) {
        // Queries may read the copy as what it now is (a restore from
        // empty withdraws it until its bulk load ends).
        let role = if job.standby { Role::Standby } else { Role::Restoring };
        for store in &job.stores {
            store.publish(role);
        }
        let _ = self.commands.send(Command::Start(job));
    }

    /// Stops restoring `partition` and returns its stores (partially
    /// restored, consistent at their checkpoint). `None` if not restoring.
    pub(crate) fn cancel(&self, partition: i32) -> Option<RestoreJob> {
        let (tx, rx) = mpsc::channel();
        self.commands.send(Command::Cancel(partition, tx)).ok()?;
        rx.recv().ok().flatten()
    }
}

impl Drop for Restorer {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
