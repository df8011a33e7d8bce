//! librdkafka's cached watermarks of a partition: the low and high offsets
//! of its last fetch response (or watermark query), read without a request.

use rdkafka::bindings as rdsys;

/// `(low, high)` of `topic`/`partition` as `rk` last saw them; `None` if
/// it has not seen any yet.
pub(crate) fn cached(rk: *mut rdsys::rd_kafka_t, topic: &str, partition: i32) -> Option<(i64, i64)> {
    let topic_c = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: `rk` is a live client handle owned by the caller, the topic
    // name is NUL-terminated; the call only reads librdkafka's cached
    // offsets into the two locals.
    let err = unsafe { rdsys::rd_kafka_get_watermark_offsets(rk, topic_c.as_ptr(), partition, &mut low, &mut high) };
    (err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some((low, high))
}
