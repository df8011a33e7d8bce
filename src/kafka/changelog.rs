//! Changelog topics: naming, creation and validation, and the producer that
//! writes each commit's store writes to them.
//!
//! Store `S` of application `A` logs to the compacted topic `A-S-changelog`
//! (the same name Kafka Streams uses), one partition per input partition:
//! a write to store partition `p` goes to changelog partition `p`, a delete is
//! a tombstone. A commit sends the latest write of each key since the
//! previous commit (batched by the producer: idempotent, `acks=all`), waits
//! for the acknowledgements and reads, per store partition, the offset of the
//! last one: that offset becomes the store's checkpoint.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::bindings as rdsys;
use rdkafka::producer::{Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message};

use crate::error::{Error, Result};

/// Room left for record-batch and record headers when checking a record's
/// size against the changelog's `max.message.bytes`.
pub(crate) const RECORD_OVERHEAD: usize = 128;

/// The changelog topic name of `store` in application `application_id`.
///
/// ```
/// assert_eq!(kstate::changelog_topic("clicks", "counts"), "clicks-counts-changelog");
/// ```
pub fn changelog_topic(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}

/// What one changelog topic must look like.
#[derive(Debug, Clone)]
pub(crate) struct ChangelogSpec {
    pub(crate) topic: String,
    pub(crate) partitions: i32,
    pub(crate) replication: Option<i32>,
    pub(crate) extra_configs: Vec<(String, String)>,
}

/// A validated changelog topic.
#[derive(Debug, Clone)]
pub(crate) struct ChangelogInfo {
    /// The topic's `max.message.bytes`.
    pub(crate) max_message_bytes: usize,
    /// The topic's `delete.retention.ms`: how long the broker keeps a
    /// tombstone after cleaning its segment.
    pub(crate) tombstone_retention: Option<Duration>,
}

/// Creates missing changelog topics and checks existing ones: partition count
/// equal to the input's and `cleanup.policy=compact`.
pub(crate) fn ensure_topics(
    admin: &AdminClient<DefaultClientContext>,
    specs: &[ChangelogSpec],
    timeout: Duration,
) -> Result<HashMap<String, ChangelogInfo>> {
    let opts = AdminOptions::new().request_timeout(Some(timeout)).operation_timeout(Some(timeout));
    let mut missing = Vec::new();
    for spec in specs {
        match topic_partitions(admin, &spec.topic, timeout)? {
            None => missing.push(spec),
            Some(n) if n != spec.partitions => {
                return Err(Error::ChangelogTopicMismatch {
                    topic: spec.topic.clone(),
                    problem: format!(
                        "it has {n} partitions but the input topics have {}; \
                         delete it or fix the input topics",
                        spec.partitions
                    ),
                })
            }
            Some(_) => {}
        }
    }
    if !missing.is_empty() {
        let new_topics: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|s| {
                let rf = TopicReplication::Fixed(s.replication.unwrap_or(-1));
                let mut t = NewTopic::new(&s.topic, s.partitions, rf).set("cleanup.policy", "compact");
                for (k, v) in &s.extra_configs {
                    t = t.set(k, v);
                }
                t
            })
            .collect();
        for result in futures::executor::block_on(admin.create_topics(&new_topics, &opts))? {
            match result {
                Ok(topic) => tracing::info!(%topic, "created changelog topic"),
                Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    tracing::info!(%topic, "changelog topic was created concurrently")
                }
                Err((topic, code)) => {
                    return Err(Error::ChangelogTopicMismatch {
                        topic,
                        problem: format!("could not create it: {code}"),
                    })
                }
            }
        }
        for spec in &missing {
            wait_for_topic(admin, spec, timeout)?;
        }
    }

    if specs.is_empty() {
        // An application without stores; librdkafka refuses an empty describe.
        return Ok(HashMap::new());
    }
    let resources: Vec<ResourceSpecifier<'_>> =
        specs.iter().map(|s| ResourceSpecifier::Topic(&s.topic)).collect();
    let described = futures::executor::block_on(admin.describe_configs(&resources, &opts))?;
    let mut infos = HashMap::new();
    for (spec, res) in specs.iter().zip(described) {
        let res = res.map_err(|code| Error::ChangelogTopicMismatch {
            topic: spec.topic.clone(),
            problem: format!("could not describe its configuration: {code}"),
        })?;
        let policy = res.get("cleanup.policy").and_then(|e| e.value.clone()).unwrap_or_default();
        if policy.trim() != "compact" {
            return Err(Error::ChangelogTopicMismatch {
                topic: spec.topic.clone(),
                problem: format!(
                    "cleanup.policy is `{policy}`, but a changelog must be `compact` \
                     (with `delete`, old state would be lost from the changelog)"
                ),
            });
        }
        let number = |name: &str| res.get(name).and_then(|e| e.value.as_deref()).and_then(|v| v.parse::<u64>().ok());
        let delete_retention_ms = number("delete.retention.ms");
        if let Some(ms) = delete_retention_ms.filter(|ms| Duration::from_millis(*ms) < 10 * crate::store::engine::FLUSH_AT_LEAST_EVERY) {
            tracing::warn!(topic = %spec.topic, delete_retention_ms = ms,
                flushed_every_secs = crate::store::engine::FLUSH_AT_LEAST_EVERY.as_secs(),
                "the changelog keeps tombstones only briefly: a store restored after a crash replays from its last \
                 flush, and a delete whose tombstone the broker dropped meanwhile would come back");
        }
        let max_message_bytes = number("max.message.bytes").map_or(1_048_588, |n| n as usize);
        infos.insert(
            spec.topic.clone(),
            ChangelogInfo { max_message_bytes, tombstone_retention: delete_retention_ms.map(Duration::from_millis) },
        );
    }
    Ok(infos)
}

/// Partition count of `topic`, or `None` if it does not exist.
pub(crate) fn topic_partitions(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<i32>> {
    let md = admin.inner().fetch_metadata(Some(topic), timeout)?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else { return Ok(None) };
    match t.error() {
        None => Ok(Some(t.partitions().len() as i32)),
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => Ok(None),
        Some(e) => Err(Error::Kafka(KafkaError::MetadataFetch(e.into()))),
    }
}

fn wait_for_topic(
    admin: &AdminClient<DefaultClientContext>,
    spec: &ChangelogSpec,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if topic_partitions(admin, &spec.topic, timeout)? == Some(spec.partitions) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::ChangelogTopicMismatch {
                topic: spec.topic.clone(),
                problem: "created, but its metadata did not appear in time".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Delivery bookkeeping of one changelog partition.
///
/// The sending thread and the delivery thread each write their own
/// counters, so that a record costs no cache line passed between cores.
#[derive(Debug)]
pub(crate) struct DeliveryTracker {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    /// Its slot in [`DeliveryContext`]'s registry: the delivery opaque.
    slot: usize,
    /// Records sent (by the one thread that commits at a time).
    sent: Padded<AtomicU64>,
    /// Records acknowledged or failed (by the delivery thread; records that
    /// could not be queued, by the sender).
    delivered: AtomicU64,
    last_acked: AtomicI64,
    /// Acknowledgements since the last [`DeliveryTracker::take_acked_count`].
    acked: AtomicU64,
    /// The first delivery failure: the error, and the record's topic and
    /// partition (an output tracker's records go to many).
    failure: Mutex<Option<(KafkaError, String, i32)>>,
}

/// Trackers by slot, and the slots free for reuse.
#[derive(Default)]
struct Registry {
    slots: Vec<Option<Arc<DeliveryTracker>>>,
    free: Vec<usize>,
}

/// Keeps a value on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl DeliveryTracker {
    /// After a flush: the offset of the last acknowledged record (or `None`
    /// if nothing was ever acknowledged), or the first delivery failure.
    pub(crate) fn settle(&self) -> Result<Option<i64>> {
        if let Some((e, _, _)) = self.failure.lock().expect("tracker lock").clone() {
            return Err(Error::ChangelogDelivery {
                topic: self.topic.clone(),
                partition: self.partition,
                source: e,
            });
        }
        if self.delivered.load(Ordering::Acquire) != self.sent.0.load(Ordering::Acquire) {
            return Err(Error::CommitTimeout(Duration::ZERO));
        }
        let last = self.last_acked.load(Ordering::Acquire);
        Ok((last >= 0).then_some(last))
    }

    /// After a flush, for the outputs' tracker: the first output that could
    /// not be delivered, as [`Error::OutputDelivery`].
    pub(crate) fn settle_outputs(&self) -> Result<()> {
        match self.failure.lock().expect("tracker lock").clone() {
            Some((source, topic, partition)) => {
                Err(Error::OutputDelivery { topic, partition: (partition >= 0).then_some(partition), source })
            }
            None => Ok(()),
        }
    }

    /// Whether records of this tracker are queued and not yet delivered.
    pub(crate) fn in_flight(&self) -> bool {
        self.delivered.load(Ordering::Acquire) != self.sent.0.load(Ordering::Acquire)
    }

    /// Whether any record was sent through this tracker (or refused).
    pub(crate) fn used(&self) -> bool {
        self.sent.0.load(Ordering::Acquire) > 0
    }

    /// How many records were acknowledged since the last call.
    pub(crate) fn take_acked_count(&self) -> u64 {
        self.acked.swap(0, Ordering::AcqRel)
    }
}

/// Routes delivery reports back to their partition's tracker (the opaque of
/// each record is its tracker's slot) and counts deliveries, so that a
/// commit can wait for exactly the records sent before it.
pub(crate) struct DeliveryContext {
    /// The trackers of open stores, by slot.
    trackers: RwLock<Registry>,
    /// Records sent (by the one thread that commits at a time).
    sent: Padded<AtomicU64>,
    /// Records acknowledged or failed (as the tracker's `delivered`).
    delivered: Padded<AtomicU64>,
    /// The `delivered` count a flush waits for (`u64::MAX`: none waits).
    wanted: Padded<AtomicU64>,
    lock: Mutex<()>,
    settled: std::sync::Condvar,
}

impl Default for DeliveryContext {
    fn default() -> Self {
        DeliveryContext {
            trackers: RwLock::default(),
            sent: Padded::default(),
            delivered: Padded::default(),
            wanted: Padded(AtomicU64::new(u64::MAX)),
            lock: Mutex::default(),
            settled: std::sync::Condvar::default(),
        }
    }
}

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, slot: usize) {
        {
            let trackers = self.trackers.read().expect("tracker registry");
            // A slot is freed only once all its records were delivered.
            let tracker = trackers.slots[slot].as_ref().expect("a delivery for a registered tracker");
            match result {
                Ok(msg) => {
                    tracker.last_acked.fetch_max(msg.offset(), Ordering::AcqRel);
                    tracker.acked.fetch_add(1, Ordering::AcqRel);
                }
                Err((e, msg)) => {
                    let mut f = tracker.failure.lock().expect("tracker lock");
                    if f.is_none() {
                        tracing::error!(topic = %msg.topic(), partition = msg.partition(), error = %e,
                            "record not delivered; the next commit will fail");
                        *f = Some((e.clone(), msg.topic().to_string(), msg.partition()));
                    }
                }
            }
            tracker.delivered.fetch_add(1, Ordering::AcqRel);
        }
        // SeqCst pairs with `flush`: either it sees this delivery, or this
        // sees what it waits for and wakes it (under the lock it waits with).
        let delivered = self.delivered.0.fetch_add(1, Ordering::SeqCst) + 1;
        if delivered >= self.wanted.0.load(Ordering::SeqCst) {
            let _guard = self.lock.lock().expect("delivery lock");
            self.settled.notify_all();
        }
    }
}

/// Asks the CPU to load `bytes` into its cache ahead of use.
///
/// A commit's overlay (~15 MB per 100 ms at 1M records/s) was written by
/// the processing thread on another core and is out of the cache by the
/// time librdkafka copies it: one miss after the other, each copy waited
/// for memory. Prefetching a chunk's records first overlaps those misses.
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes.len()).step_by(64).chain(bytes.len().checked_sub(1)) {
        // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes.as_ptr().add(line).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The producer shared by every store of a runtime.
pub(crate) struct ChangelogProducer {
    producer: ThreadedProducer<DeliveryContext>,
    /// How long a full local queue is waited out before a write fails.
    queue_timeout: Duration,
    /// librdkafka topic handles by name, for batch produce.
    topics: Mutex<HashMap<String, TopicHandle>>,
    /// Exactly-once: the transactional producer's state.
    txn: Option<Transactions>,
}

/// The transactions of an exactly-once producer. One is open from the
/// first record sent after a commit (changelog or output) until that
/// commit; only the thread that commits sends meanwhile.
pub(crate) struct Transactions {
    /// The producer's `transactional.id`.
    pub(crate) id: String,
    open: std::sync::atomic::AtomicBool,
    /// A send of the open transaction was refused in a way that dooms the
    /// transaction (see [`dooms_transaction_only`]): it must be aborted.
    broken: std::sync::atomic::AtomicBool,
}

/// Exactly-once: whether a send or delivery failure dooms only the open
/// transaction (a record timed out while the instance was frozen or the
/// brokers away, the producer is in an abortable state or was fenced):
/// the commit aborts and its tasks process their input again, where at
/// least once such a failure would end `run`.
pub(crate) fn dooms_transaction_only(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageTimedOut
                | C::State
                | C::PurgeQueue
                | C::PurgeInflight
                | C::Fatal
                | C::Fenced
                | C::InvalidProducerEpoch
                | C::InvalidProducerIdMapping
                | C::TransactionCoordinatorFenced
                | C::ProducerFenced
        )
    )
}

/// How librdkafka classified a failed transactional call.
#[derive(Debug, Clone)]
pub(crate) struct TxnError {
    pub(crate) operation: &'static str,
    pub(crate) code: RDKafkaErrorCode,
    pub(crate) detail: String,
    /// The producer is unusable (fenced by a newer one with the same id,
    /// or the transaction coordinator bumped its epoch).
    pub(crate) fatal: bool,
    /// The transaction must be aborted; the producer stays usable.
    pub(crate) abortable: bool,
    /// The call may be repeated.
    pub(crate) retriable: bool,
}

impl std::fmt::Display for TxnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.fatal {
            "fatal"
        } else if self.abortable {
            "abortable"
        } else if self.retriable {
            "retriable"
        } else {
            "error"
        };
        write!(f, "{} failed ({kind}, {:?}): {}", self.operation, self.code, self.detail)
    }
}

impl TxnError {
    /// Takes over a librdkafka error object (`None` if there was no error).
    ///
    /// SAFETY: `ptr` is null or an error object librdkafka handed over.
    unsafe fn take(operation: &'static str, ptr: *mut rdsys::rd_kafka_error_t) -> Option<TxnError> {
        if ptr.is_null() {
            return None;
        }
        let text = std::ffi::CStr::from_ptr(rdsys::rd_kafka_error_string(ptr)).to_string_lossy().into_owned();
        let e = TxnError {
            operation,
            code: RDKafkaErrorCode::from(rdsys::rd_kafka_error_code(ptr)),
            detail: text,
            fatal: rdsys::rd_kafka_error_is_fatal(ptr) != 0,
            abortable: rdsys::rd_kafka_error_txn_requires_abort(ptr) != 0,
            retriable: rdsys::rd_kafka_error_is_retriable(ptr) != 0,
        };
        rdsys::rd_kafka_error_destroy(ptr);
        Some(e)
    }

    /// Whether the failed call may simply be made again (it timed out;
    /// librdkafka resumes what it started).
    pub(crate) fn resumable(&self) -> bool {
        self.retriable && !self.abortable && !self.fatal
    }

    /// As the error `run` ends with.
    pub(crate) fn into_error(self, transactional_id: &str) -> Error {
        Error::Transaction { transactional_id: transactional_id.to_string(), operation: self.operation, detail: self.detail }
    }
}

/// A librdkafka topic handle (thread-safe in librdkafka).
#[derive(Clone, Copy)]
struct TopicHandle(*mut rdsys::rd_kafka_topic_t);

// SAFETY: librdkafka topic handles may be used from any thread.
unsafe impl Send for TopicHandle {}

impl Drop for ChangelogProducer {
    fn drop(&mut self) {
        // Before the producer (a field, dropped after this) destroys the client.
        for (_, h) in self.topics.get_mut().expect("topic handles").drain() {
            // SAFETY: created by `topic_handle` on this producer's client, destroyed once.
            unsafe { rdsys::rd_kafka_topic_destroy(h.0) };
        }
    }
}

impl ChangelogProducer {
    /// Creates the producer; `message_max_bytes` should not exceed any
    /// changelog topic's `max.message.bytes`.
    pub(crate) fn new(mut config: ClientConfig, message_max_bytes: usize, queue_timeout: Duration) -> Result<Self> {
        Self::create(config_for_changelogs(&mut config, message_max_bytes), queue_timeout, None)
    }

    /// An exactly-once producer: transactional with `transactional_id`,
    /// its transactions aborted by the brokers after `transaction_timeout`.
    /// Initialising it aborts whatever its previous incarnation (same id)
    /// left open and fences that one, waiting up to `init_timeout`.
    pub(crate) fn transactional(
        mut config: ClientConfig,
        message_max_bytes: usize,
        queue_timeout: Duration,
        transactional_id: String,
        transaction_timeout: Duration,
        init_timeout: Duration,
    ) -> Result<Self> {
        config_for_changelogs(&mut config, message_max_bytes)
            .set("transactional.id", &transactional_id)
            .set("transaction.timeout.ms", transaction_timeout.as_millis().to_string());
        let txn = Transactions { id: transactional_id, open: Default::default(), broken: Default::default() };
        let producer = Self::create(&mut config, queue_timeout, Some(txn))?;
        let started = Instant::now();
        loop {
            let remaining = init_timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(1));
            // SAFETY: a live producer handle.
            let e = unsafe {
                TxnError::take("init", rdsys::rd_kafka_init_transactions(producer.native(), remaining.as_millis() as c_int))
            };
            match e {
                None => return Ok(producer),
                Some(e) if e.retriable && started.elapsed() < init_timeout => {
                    tracing::warn!(error = %e, "initialising the transactional producer; retrying");
                }
                Some(e) => return Err(e.into_error(&producer.txn.as_ref().expect("transactional").id)),
            }
        }
    }

    fn create(config: &mut ClientConfig, queue_timeout: Duration, txn: Option<Transactions>) -> Result<Self> {
        let producer: ThreadedProducer<DeliveryContext> = config.create_with_context(DeliveryContext::default())?;
        Ok(ChangelogProducer { producer, queue_timeout, topics: Mutex::default(), txn })
    }

    fn native(&self) -> *mut rdsys::rd_kafka_t {
        self.producer.client().native_ptr()
    }

    /// The exactly-once producer's transactions (`None`: at-least-once).
    pub(crate) fn transactions(&self) -> Option<&Transactions> {
        self.txn.as_ref()
    }

    /// The exactly-once producer's `transactional.id` (empty: at-least-once).
    pub(crate) fn transactional_id(&self) -> &str {
        self.txn.as_ref().map_or("", |t| t.id.as_str())
    }

    /// Whether a send of the open transaction was refused in a way that
    /// dooms it (it must be aborted, not committed).
    pub(crate) fn transaction_broken(&self) -> bool {
        self.txn.as_ref().is_some_and(|t| t.broken.load(Ordering::Acquire))
    }

    /// Whether a transaction is open (records were sent since the last
    /// commit or abort).
    pub(crate) fn in_transaction(&self) -> bool {
        self.txn.as_ref().is_some_and(|t| t.open.load(Ordering::Acquire))
    }

    /// Exactly-once: opens a transaction unless one is open. Every send
    /// calls this first.
    fn begin_if_needed(&self) -> std::result::Result<(), TxnError> {
        let Some(txn) = &self.txn else { return Ok(()) };
        if txn.open.load(Ordering::Acquire) {
            return Ok(());
        }
        // SAFETY: a live producer handle.
        match unsafe { TxnError::take("begin", rdsys::rd_kafka_begin_transaction(self.native())) } {
            None => {
                txn.open.store(true, Ordering::Release);
                Ok(())
            }
            Some(e) => Err(e),
        }
    }

    fn begin_or_error(&self) -> Result<()> {
        self.begin_if_needed().map_err(|e| e.into_error(self.transactional_id()))
    }

    /// Exactly-once: adds `offsets` (topic, partition, next offset) of
    /// `group` under `generation` to the open transaction (opening one if
    /// nothing was sent). Every record sent must have been acknowledged
    /// (see [`ChangelogProducer::settle_trackers`]). Then
    /// [`ChangelogProducer::commit_transaction`]; the generation matters only
    /// up to here.
    pub(crate) fn send_offsets(
        &self,
        group: &str,
        generation: &crate::group::Generation,
        offsets: &[(String, i32, i64)],
        timeout: Duration,
    ) -> std::result::Result<(), TxnError> {
        if self.txn.is_none() || offsets.is_empty() {
            return Ok(());
        }
        self.begin_if_needed()?;
        let ms = timeout.as_millis().min(i32::MAX as u128) as c_int;
        let mut tpl = rdkafka::TopicPartitionList::new();
        for (topic, partition, offset) in offsets {
            tpl.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(*offset)).map_err(|e| TxnError {
                operation: "send offsets",
                code: RDKafkaErrorCode::InvalidArgument,
                detail: e.to_string(),
                fatal: false,
                abortable: true,
                retriable: false,
            })?;
        }
        let cstr = |s: &str| std::ffi::CString::new(s).unwrap_or_default();
        let (group, member) = (cstr(group), cstr(&generation.member_id));
        let instance = generation.instance_id.as_deref().map(cstr);
        // SAFETY: valid C strings for the call; librdkafka copies them; the
        // metadata is destroyed below.
        let cgm = unsafe {
            rdsys::rd_kafka_consumer_group_metadata_new_with_genid(
                group.as_ptr(),
                generation.id,
                member.as_ptr(),
                instance.as_ref().map_or(std::ptr::null(), |i| i.as_ptr()),
            )
        };
        // SAFETY: live producer, list and metadata handles.
        unsafe {
            let e = rdsys::rd_kafka_send_offsets_to_transaction(self.native(), tpl.ptr(), cgm, ms);
            rdsys::rd_kafka_consumer_group_metadata_destroy(cgm);
            match TxnError::take("send offsets", e) {
                None => Ok(()),
                Some(e) => Err(e),
            }
        }
    }

    /// Exactly-once: commits the open transaction (no-op without one). A
    /// retriable failure (timed out) may be retried with this call alone:
    /// librdkafka resumes the commit it started.
    pub(crate) fn commit_transaction(&self, timeout: Duration) -> std::result::Result<(), TxnError> {
        // Not rust-rdkafka's commit_transaction: it flushes first, which with
        // a ThreadedProducer waits at least 100 ms (see `flush`).
        self.end_transaction("commit", rdsys::rd_kafka_commit_transaction, timeout)
    }

    /// Exactly-once: aborts the open transaction, if any (its records stay
    /// invisible to `read_committed` readers).
    pub(crate) fn abort_transaction(&self, timeout: Duration) -> std::result::Result<(), TxnError> {
        self.end_transaction("abort", rdsys::rd_kafka_abort_transaction, timeout)
    }

    /// Commits or aborts (`end`) the open transaction, if any.
    fn end_transaction(
        &self,
        operation: &'static str,
        end: unsafe extern "C" fn(*mut rdsys::rd_kafka_t, c_int) -> *mut rdsys::rd_kafka_error_t,
        timeout: Duration,
    ) -> std::result::Result<(), TxnError> {
        let Some(txn) = &self.txn else { return Ok(()) };
        if !txn.open.load(Ordering::Acquire) {
            return Ok(());
        }
        let ms = timeout.as_millis().min(i32::MAX as u128) as c_int;
        // SAFETY: a live producer handle; `end` is librdkafka's commit or abort.
        match unsafe { TxnError::take(operation, end(self.native(), ms)) } {
            None => {
                txn.open.store(false, Ordering::Release);
                txn.broken.store(false, Ordering::Release);
                Ok(())
            }
            Some(e) => Err(e),
        }
    }
}

/// The settings every changelog producer has.
fn config_for_changelogs(config: &mut ClientConfig, message_max_bytes: usize) -> &mut ClientConfig {
    {
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.max.bytes", message_max_bytes.to_string());
        crate::kafka::client::set_default(config, "linger.ms", "5");
        // Output records without an explicit partition: by key, as Java clients.
        crate::kafka::client::set_default(config, "partitioner", "murmur2_random");
        crate::kafka::client::set_default(config, "batch.size", "1000000");
        crate::kafka::client::set_default(config, "queue.buffering.max.messages", "1000000");
    }
    config
}

impl ChangelogProducer {

    /// A tracker for the deliveries of one changelog partition's records,
    /// for a store opened on it.
    pub(crate) fn tracker(&self, topic: String, partition: i32) -> Arc<DeliveryTracker> {
        let mut trackers = self.producer.context().trackers.write().expect("tracker registry");
        let slot = trackers.free.pop().unwrap_or_else(|| {
            trackers.slots.push(None);
            trackers.slots.len() - 1
        });
        let tracker = Arc::new(DeliveryTracker {
            topic,
            partition,
            slot,
            sent: Padded::default(),
            delivered: AtomicU64::new(0),
            last_acked: AtomicI64::new(-1),
            acked: AtomicU64::new(0),
            failure: Mutex::new(None),
        });
        trackers.slots[slot] = Some(tracker.clone());
        tracker
    }

    /// Frees the slot of a closing store's tracker for reuse, unless a
    /// commit still holds the tracker or records of it are still in flight
    /// (their deliveries need the slot; it then stays registered).
    pub(crate) fn release(&self, tracker: &Arc<DeliveryTracker>) {
        let mut trackers = self.producer.context().trackers.write().expect("tracker registry");
        let registered = trackers.slots.get(tracker.slot).and_then(Option::as_ref).is_some_and(|t| Arc::ptr_eq(t, tracker));
        // Held only by the registry and the caller; no record undelivered.
        let idle = Arc::strong_count(tracker) == 2
            && tracker.delivered.load(Ordering::Acquire) == tracker.sent.0.load(Ordering::Acquire);
        if registered && idle {
            trackers.slots[tracker.slot] = None;
            trackers.free.push(tracker.slot);
        }
    }

    /// Queues records for the tracker's changelog partition, in order
    /// (`None` value: tombstone).
    ///
    /// Through `rd_kafka_produce_batch`, 1024 records per call: one topic
    /// and partition lookup and one clock read per call rather than per
    /// record (`send` per record was 0.6 µs of the commit thread's time per
    /// record, ahead of everything else it does). `after_chunk` sees each
    /// chunk once it is queued, while its bytes are still in the cache.
    pub(crate) fn send_all<'a>(
        &self,
        tracker: &DeliveryTracker,
        records: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        mut after_chunk: impl FnMut(&[(&'a [u8], Option<&'a [u8]>)]),
    ) -> Result<()> {
        const CHUNK: usize = 1024;
        self.begin_or_error()?;
        let rkt = self.topic_handle(&tracker.topic)?;
        let mut batch: Vec<rdsys::rd_kafka_message_t> = Vec::with_capacity(CHUNK);
        let mut chunk: Vec<(&'a [u8], Option<&'a [u8]>)> = Vec::with_capacity(CHUNK);
        let mut records = records.peekable();
        while records.peek().is_some() {
            chunk.clear();
            chunk.extend(records.by_ref().take(CHUNK));
            for &(key, value) in &chunk {
                prefetch(key);
                prefetch(value.unwrap_or_default());
            }
            batch.clear();
            batch.extend(chunk.iter().map(|&(key, value)| rdsys::rd_kafka_message_t {
                err: RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
                rkt: std::ptr::null_mut(),
                partition: tracker.partition,
                payload: value.map_or(std::ptr::null_mut(), |v| v.as_ptr() as *mut c_void),
                len: value.map_or(0, <[u8]>::len),
                key: key.as_ptr() as *mut c_void,
                key_len: key.len(),
                offset: 0,
                // The delivery opaque (see `DeliveryContext::delivery`).
                _private: tracker.slot as *mut c_void,
            }));
            self.enqueue(rkt.0, tracker, &mut batch)?;
            after_chunk(&chunk);
        }
        Ok(())
    }

    /// Queues `batch` in order, waiting out a full local queue for up to
    /// `queue_timeout`.
    fn enqueue(&self, rkt: *mut rdsys::rd_kafka_topic_t, tracker: &DeliveryTracker, batch: &mut [rdsys::rd_kafka_message_t]) -> Result<()> {
        let context = self.producer.context();
        let mut rest = batch;
        let mut started = None;
        loop {
            let n = rest.len() as u64;
            // Counted before: deliveries may be reported at once.
            tracker.sent.0.fetch_add(n, Ordering::AcqRel);
            context.sent.0.fetch_add(n, Ordering::SeqCst);
            // SAFETY: `rkt` is a live topic handle of this producer; every
            // message points at key and value bytes that outlive the call
            // (RD_KAFKA_MSG_F_COPY: librdkafka copies them).
            let queued = unsafe {
                rdsys::rd_kafka_produce_batch(rkt, tracker.partition, rdsys::RD_KAFKA_MSG_F_COPY, rest.as_mut_ptr(), n as c_int)
            } as u64;
            if queued == n {
                return Ok(());
            }
            // Never queued, so never delivered: count them as delivered (not
            // acknowledged) so that flushes do not wait for them.
            tracker.delivered.fetch_add(n - queued, Ordering::AcqRel);
            context.delivered.0.fetch_add(n - queued, Ordering::SeqCst);
            let first = rest.iter().position(|m| m.err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR).unwrap_or(0);
            let queue_full = rest[first..].iter().all(|m| m.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__QUEUE_FULL);
            // A full queue fails a suffix of the batch: retry it, in order.
            if queue_full && started.get_or_insert_with(Instant::now).elapsed() < self.queue_timeout {
                rest = &mut rest[first..];
                for m in rest.iter_mut() {
                    m.err = RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR;
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            return Err(Error::ChangelogDelivery {
                topic: tracker.topic.clone(),
                partition: tracker.partition,
                source: KafkaError::MessageProduction(RDKafkaErrorCode::from(rest[first].err)),
            });
        }
    }

    /// Queues one output record, counted on `tracker` (the outputs'
    /// tracker), waiting out a full local queue for up to `queue_timeout`.
    /// A record librdkafka refuses at once (too large, unknown partition)
    /// is [`Error::OutputDelivery`].
    pub(crate) fn send_output(&self, tracker: &DeliveryTracker, out: &crate::output::Output<'_>, default_timestamp: Option<i64>) -> Result<()> {
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::BaseRecord;
        if let Err(e) = self.begin_if_needed() {
            // As a refused output below: the next commit aborts (and
            // replaces a fatal producer); the processor need not know.
            if let Some(txn) = &self.txn {
                if !txn.broken.swap(true, Ordering::AcqRel) {
                    tracing::warn!(error = %e, "no transaction could begin; the next commit aborts and retries");
                }
            }
            return Ok(());
        }
        let context = self.producer.context();
        let mut record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(out.topic, tracker.slot);
        if let Some(k) = out.key {
            record = record.key(k);
        }
        if let Some(v) = out.value {
            record = record.payload(v);
        }
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        if let Some(t) = out.timestamp.or(default_timestamp) {
            record = record.timestamp(t);
        }
        if !out.headers.is_empty() {
            let headers = out.headers.iter().fold(OwnedHeaders::new_with_capacity(out.headers.len()), |h, (key, value)| {
                h.insert(Header { key, value: *value })
            });
            record = record.headers(headers);
        }
        let mut started = None;
        loop {
            // Counted before: the delivery may be reported at once.
            tracker.sent.0.fetch_add(1, Ordering::AcqRel);
            context.sent.0.fetch_add(1, Ordering::SeqCst);
            let refused = match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((e, back)) => {
                    record = back;
                    e
                }
            };
            // Never queued: count it delivered so that flushes do not wait.
            tracker.delivered.fetch_add(1, Ordering::AcqRel);
            context.delivered.0.fetch_add(1, Ordering::SeqCst);
            if let Some(txn) = self.txn.as_ref().filter(|_| dooms_transaction_only(&refused)) {
                // The transaction is lost anyway: the commit aborts it and the
                // input is processed again; the processor need not know.
                if !txn.broken.swap(true, Ordering::AcqRel) {
                    tracing::warn!(topic = %out.topic, error = %refused, "output refused: the open transaction cannot commit; the next commit aborts it");
                }
                return Ok(());
            }
            let queue_full = matches!(refused, KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull));
            if queue_full && started.get_or_insert_with(Instant::now).elapsed() < self.queue_timeout {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            // Also fails the commit, should the processor (or its exception
            // handler) go on without this output.
            let mut f = tracker.failure.lock().expect("tracker lock");
            if f.is_none() {
                *f = Some((refused.clone(), out.topic.to_string(), out.partition.unwrap_or(-1)));
            }
            return Err(Error::OutputDelivery { topic: out.topic.to_string(), partition: out.partition, source: refused });
        }
    }

    /// After a flush, waits until none of `trackers` has a record in
    /// flight. The flush counts every record of the producer, and records
    /// queued while it waited (outputs of the next commit) may be
    /// acknowledged before older ones: only the trackers say that exactly
    /// these records were delivered. Same patience as the flush.
    pub(crate) fn settle_trackers(&self, trackers: &[&DeliveryTracker], timeout: Duration, patience: Duration) -> Result<()> {
        let started = Instant::now();
        while trackers.iter().any(|t| t.in_flight()) {
            if started.elapsed() >= patience {
                return Err(Error::CommitTimeout(started.elapsed()));
            }
            self.flush_patiently(timeout, patience.saturating_sub(started.elapsed()))?;
        }
        Ok(())
    }

    /// librdkafka's handle of `topic` (created once, destroyed with the producer).
    fn topic_handle(&self, topic: &str) -> Result<TopicHandle> {
        let mut topics = self.topics.lock().expect("topic handles");
        if let Some(h) = topics.get(topic) {
            return Ok(*h);
        }
        let name = std::ffi::CString::new(topic).map_err(|_| Error::Config(format!("topic name `{topic}` contains NUL")))?;
        // SAFETY: the client handle is live; a NULL conf takes the producer's defaults.
        let rkt = unsafe { rdsys::rd_kafka_topic_new(self.producer.client().native_ptr(), name.as_ptr(), std::ptr::null_mut()) };
        if rkt.is_null() {
            return Err(Error::ChangelogDelivery {
                topic: topic.to_string(),
                partition: -1,
                source: KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopic),
            });
        }
        topics.insert(topic.to_string(), TopicHandle(rkt));
        Ok(TopicHandle(rkt))
    }

    /// Flushes, and while records are still unacknowledged after `timeout`
    /// (brokers restarting, a leader moving) keeps waiting, with a warning
    /// each `timeout`, up to `patience` in all; the producer retries them
    /// meanwhile. Fails with [`Error::CommitTimeout`] after that.
    pub(crate) fn flush_patiently(&self, timeout: Duration, patience: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            match self.flush(timeout) {
                Err(Error::CommitTimeout(_)) if started.elapsed() < patience => {
                    tracing::warn!(waited = ?started.elapsed(), ?patience,
                        "changelog acknowledgements are late (brokers unavailable?); still waiting");
                }
                Err(Error::CommitTimeout(_)) => return Err(Error::CommitTimeout(started.elapsed())),
                other => return other,
            }
        }
    }

    /// Waits until every queued record is acknowledged or failed.
    ///
    /// Not `Producer::flush`: with a `ThreadedProducer` its wait loop polls
    /// an event queue that the producer's own thread drains, so every flush
    /// with records in flight took at least 100 ms (measured: 100.0 ms per
    /// commit, most of the write path's time). kstate counts its own
    /// deliveries instead and wakes up when the last one is reported.
    pub(crate) fn flush(&self, timeout: Duration) -> Result<()> {
        let context = self.producer.context();
        let wanted = context.sent.0.load(Ordering::SeqCst);
        if context.delivered.0.load(Ordering::SeqCst) >= wanted {
            return Ok(());
        }
        // A zero-timeout flush makes librdkafka send lingering batches now.
        match self.producer.flush(Duration::ZERO) {
            Ok(()) | Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {}
            Err(e) => return Err(e.into()),
        }
        let deadline = Instant::now() + timeout;
        let mut guard = context.lock.lock().expect("delivery lock");
        context.wanted.0.store(wanted, Ordering::SeqCst);
        while context.delivered.0.load(Ordering::SeqCst) < wanted {
            let now = Instant::now();
            if now >= deadline {
                context.wanted.0.store(u64::MAX, Ordering::SeqCst);
                return Err(Error::CommitTimeout(timeout));
            }
            // Bounded waits: a notification between the check and the wait is never lost for long.
            let wait = (deadline - now).min(Duration::from_millis(5));
            guard = context.settled.wait_timeout(guard, wait).expect("delivery lock").0;
        }
        context.wanted.0.store(u64::MAX, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_stores_tracker_slot_is_reused_unless_a_commit_holds_it() {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:1"); // never contacted: nothing is sent
        let producer = ChangelogProducer::new(config, 1_000_000, Duration::from_secs(1)).unwrap();
        let a = producer.tracker("t".into(), 0);
        producer.release(&a);
        let b = producer.tracker("t".into(), 1);
        assert_eq!(b.slot, a.slot, "a released slot is reused");
        let in_commit = b.clone(); // as a sealed commit holds it
        producer.release(&b);
        let c = producer.tracker("t".into(), 2);
        assert_ne!(c.slot, b.slot, "a tracker a commit holds keeps its slot");
        drop(in_commit);
        let a_held = a.clone(); // two holders, as a registered tracker has
        producer.release(&a); // stale: its slot belongs to `b` now
        drop(a_held);
        assert!(producer.producer.context().trackers.read().unwrap().slots[b.slot].is_some());
    }
}
