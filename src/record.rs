//! The input record handed to the processor, with its metadata.

use std::ffi::{c_char, c_void, CStr};
use std::marker::PhantomData;

use rdkafka::bindings as rdsys;

/// One input record, as handed to the processor.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Input topic.
    pub topic: &'a str,
    /// Input partition (the task's partition).
    pub partition: i32,
    /// Offset in the input partition.
    pub offset: i64,
    /// Record timestamp in milliseconds since the epoch, if any.
    pub timestamp: Option<i64>,
    /// What the timestamp means (producer's create time or the broker's
    /// log append time).
    pub timestamp_type: TimestampType,
    /// Record key.
    pub key: Option<&'a [u8]>,
    /// Record value (`None` for a tombstone).
    pub value: Option<&'a [u8]>,
    /// Record headers.
    pub headers: Headers<'a>,
}

impl<'a> Record<'a> {
    /// The value as UTF-8, if it is valid UTF-8.
    pub fn value_str(&self) -> Option<&'a str> {
        self.value.and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The key as UTF-8, if it is valid UTF-8.
    pub fn key_str(&self) -> Option<&'a str> {
        self.key.and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// The meaning of a record's timestamp (the topic's `message.timestamp.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    /// Set by the producer when it created the record.
    CreateTime,
    /// Set by the broker when it appended the record.
    LogAppendTime,
    /// The record has no timestamp.
    NotAvailable,
}

impl TimestampType {
    pub(crate) fn from_native(kind: rdsys::rd_kafka_timestamp_type_t) -> Self {
        match kind {
            rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => TimestampType::CreateTime,
            rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => TimestampType::LogAppendTime,
            _ => TimestampType::NotAvailable,
        }
    }
}

/// A record's headers, in order (a name may appear several times).
#[derive(Clone, Copy)]
pub struct Headers<'a> {
    raw: *const rdsys::rd_kafka_headers_t,
    _message: PhantomData<&'a ()>,
}

// SAFETY: the headers list is only read, and librdkafka never changes a
// delivered message's headers.
unsafe impl Send for Headers<'_> {}
// SAFETY: as above.
unsafe impl Sync for Headers<'_> {}

impl std::fmt::Debug for Headers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(|(n, v)| (n, v.map(String::from_utf8_lossy)))).finish()
    }
}

impl<'a> Headers<'a> {
    /// No headers.
    pub const fn empty() -> Self {
        Headers { raw: std::ptr::null(), _message: PhantomData }
    }

    /// The headers of a librdkafka message that outlives `'a`.
    ///
    /// # Safety
    /// `message` must be a valid message that stays alive for `'a`.
    pub(crate) unsafe fn of_message(message: *const rdsys::rd_kafka_message_t) -> Self {
        let mut raw: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: the caller guarantees a live message; librdkafka parses
        // the headers once and keeps them with the message.
        let err = unsafe { rdsys::rd_kafka_message_headers(message, &mut raw) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || raw.is_null() {
            return Headers::empty();
        }
        Headers { raw, _message: PhantomData }
    }

    /// The headers of `owned` (a test driver's input record).
    pub(crate) fn of_owned(owned: &'a rdkafka::message::OwnedHeaders) -> Self {
        // rust-rdkafka's `BorrowedHeaders` reference is the native list's
        // address (it makes it by casting the pointer).
        let raw = (owned.as_borrowed() as *const rdkafka::message::BorrowedHeaders).cast::<rdsys::rd_kafka_headers_t>();
        Headers { raw, _message: PhantomData }
    }

    /// The number of headers.
    pub fn len(&self) -> usize {
        if self.raw.is_null() {
            return 0;
        }
        // SAFETY: a live headers list (see `of_message`).
        unsafe { rdsys::rd_kafka_header_cnt(self.raw) }
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The header at `index`: its name and value (`None`: a null value).
    pub fn get(&self, index: usize) -> Option<(&'a str, Option<&'a [u8]>)> {
        if self.raw.is_null() {
            return None;
        }
        let mut name: *const c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: a live headers list; librdkafka hands out pointers into
        // it, valid as long as the message.
        let err = unsafe { rdsys::rd_kafka_header_get_all(self.raw, index, &mut name, &mut value, &mut size) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            return None;
        }
        // SAFETY: NUL-terminated name owned by the headers list.
        let name = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
        // SAFETY: `size` bytes at `value`, owned by the headers list.
        let value = (!value.is_null()).then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
        Some((name, value))
    }

    /// The value of the last header named `name` (`Some(None)`: present with
    /// a null value).
    pub fn last(&self, name: &str) -> Option<Option<&'a [u8]>> {
        self.iter().filter(|(n, _)| *n == name).last().map(|(_, v)| v)
    }

    /// Every header, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, Option<&'a [u8]>)> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}
