//! Exactly-once: the transactional producer's constructor and transaction
//! steps (begin, send offsets, commit, abort) over librdkafka's
//! transactional calls, and how their failures are classified.

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;

use super::producer::{config_for_changelogs, ChangelogProducer};
use crate::error::{Error, Result};

/// The transactions of an exactly-once producer. One is open from the
/// first record sent after a commit (changelog or output) until that
/// commit; only the thread that commits sends meanwhile.
pub(crate) struct Transactions {
    /// The producer's `transactional.id`.
    pub(crate) id: String,
    open: std::sync::atomic::AtomicBool,
    /// Held while a transaction begins: with several processing threads
    /// two first sends of a transaction may race to begin it.
    beginning: std::sync::Mutex<()>,
    /// A send of the open transaction was refused in a way that dooms the
    /// transaction (see [`dooms_transaction_only`]): it must be aborted.
    pub(super) broken: std::sync::atomic::AtomicBool,
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

impl ChangelogProducer {
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
        let txn = Transactions { id: transactional_id, open: Default::default(), beginning: Default::default(), broken: Default::default() };
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
    pub(super) fn begin_if_needed(&self) -> std::result::Result<(), TxnError> {
        let Some(txn) = &self.txn else { return Ok(()) };
        if txn.open.load(Ordering::Acquire) {
            return Ok(());
        }
        let _beginning = txn.beginning.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if txn.open.load(Ordering::Acquire) {
            return Ok(()); // another thread began it meanwhile
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

    pub(super) fn begin_or_error(&self) -> Result<()> {
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
