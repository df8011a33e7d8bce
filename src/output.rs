//! Output records: what a processor sends to other topics as part of its
//! work (counts, joins, deduplicated events).
//!
//! Outputs go through kstate's producer (idempotent, `acks=all`) as soon
//! as the processor sends them. A commit waits until every output sent
//! before it was acknowledged, then commits the input offsets: after a
//! crash the records past the last committed offsets are processed again
//! and their outputs sent again (duplicates are possible, loss is not:
//! at-least-once). Under exactly-once they are part of the commit's
//! transaction.



/// An output record, built with [`Output::to`] and sent with
/// [`ProcessorContext::send`](crate::ProcessorContext::send).
///
/// ```
/// # use kstate::Output;
/// let out = Output::to("counts").key(b"apple").value(b"3").header("source", b"kstate");
/// ```
#[derive(Debug, Clone)]
pub struct Output<'a> {
    pub(crate) topic: &'a str,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) value: Option<&'a [u8]>,
    pub(crate) partition: Option<i32>,
    pub(crate) timestamp: Option<i64>,
    pub(crate) headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

impl<'a> Output<'a> {
    /// A record for `topic`, without key or value yet. Its partition is
    /// chosen by the producer's partitioner: the murmur2 hash of the key, as
    /// Java clients and Kafka Streams do (a record without key goes to a
    /// random partition); `partitioner` in `kafka_config` changes it. Its
    /// timestamp is the input record's.
    pub fn to(topic: &'a str) -> Self {
        Output { topic, key: None, value: None, partition: None, timestamp: None, headers: Vec::new() }
    }

    /// The record key.
    pub fn key(mut self, key: &'a [u8]) -> Self {
        self.key = Some(key);
        self
    }

    /// The record value (without one the record is a tombstone).
    pub fn value(mut self, value: &'a [u8]) -> Self {
        self.value = Some(value);
        self
    }

    /// Sends to this partition instead of the partitioner's choice.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// The record timestamp, milliseconds since the epoch (default: the
    /// input record's timestamp, or the time of sending if it has none).
    pub fn timestamp(mut self, millis: i64) -> Self {
        self.timestamp = Some(millis);
        self
    }

    /// Adds a header (several with the same name are kept in order).
    pub fn header(mut self, name: &'a str, value: &'a [u8]) -> Self {
        self.headers.push((name, Some(value)));
        self
    }

    /// Adds a header without a value.
    pub fn null_header(mut self, name: &'a str) -> Self {
        self.headers.push((name, None));
        self
    }
}

/// A record as a topic received it: an output record, or a store's
/// changelog record (see [`TestDriver`](crate::TestDriver), which keeps
/// both in memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentRecord {
    /// The topic.
    pub topic: String,
    /// The partition, if the sender named one (a changelog record always
    /// does; an output without [`Output::partition`] leaves it to the
    /// producer's partitioner).
    pub partition: Option<i32>,
    /// The key.
    pub key: Option<Vec<u8>>,
    /// The value (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// The timestamp, if it had one.
    pub timestamp: Option<i64>,
    /// The headers, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl SentRecord {
    /// An output record as sent with `default_timestamp` (the time of what
    /// was being processed) unless it names its own.
    pub(crate) fn of_output(output: &Output<'_>, default_timestamp: Option<i64>) -> Self {
        SentRecord {
            topic: output.topic.to_string(),
            partition: output.partition,
            key: output.key.map(<[u8]>::to_vec),
            value: output.value.map(<[u8]>::to_vec),
            timestamp: output.timestamp.or(default_timestamp),
            headers: output.headers.iter().map(|(n, v)| (n.to_string(), v.map(<[u8]>::to_vec))).collect(),
        }
    }

    /// The key as UTF-8 (lossy), `""` without one.
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(self.key.as_deref().unwrap_or_default()).into_owned()
    }

    /// The value as UTF-8 (lossy), `None` for a tombstone.
    pub fn value_str(&self) -> Option<String> {
        self.value.as_deref().map(|v| String::from_utf8_lossy(v).into_owned())
    }
}
