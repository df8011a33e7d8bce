//! A topic's id: Kafka gives every topic a UUID at creation, so a changelog
//! deleted and recreated under the same name has a new one. kstate keeps the
//! id beside each store's checkpoint and restores in full when it changed
//! (a recreated changelog refilled past the old checkpoint would otherwise
//! look valid). librdkafka exposes the id only through its DescribeTopics
//! admin call, which rust-rdkafka does not wrap.

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rdsys;

/// Describes `topic` through the client handle `rk` (any client type) and
/// returns its id as 32 hex digits. `Err` says why it is unknown (timeout,
/// unknown topic, a broker without DescribeTopics support).
pub(crate) fn describe(rk: *mut rdsys::rd_kafka_t, topic: &str, timeout: Duration) -> Result<String, String> {
    let name = CString::new(topic).map_err(|e| e.to_string())?;
    let names = [name.as_ptr()];
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `rk` is a live client handle owned by the caller; every object
    // created here is destroyed before returning, and the event's contents
    // are read before the event is destroyed.
    unsafe {
        let topics = rdsys::rd_kafka_TopicCollection_of_topic_names(names.as_ptr() as *mut _, 1);
        let options = rdsys::rd_kafka_AdminOptions_new(rk, rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS);
        let mut errbuf = [0 as std::ffi::c_char; 256];
        rdsys::rd_kafka_AdminOptions_set_request_timeout(options, timeout_ms, errbuf.as_mut_ptr(), errbuf.len());
        let queue = rdsys::rd_kafka_queue_new(rk);
        rdsys::rd_kafka_DescribeTopics(rk, topics, options, queue);
        // A little longer than the request timeout, so the request's own
        // timeout error is what comes back.
        let event = rdsys::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(1000));
        let result = read_event(event);
        if !event.is_null() {
            rdsys::rd_kafka_event_destroy(event);
        }
        rdsys::rd_kafka_queue_destroy(queue);
        rdsys::rd_kafka_AdminOptions_destroy(options);
        rdsys::rd_kafka_TopicCollection_destroy(topics);
        result
    }
}

/// # Safety
/// `event` is null or a live DescribeTopics result event.
unsafe fn read_event(event: *mut rdsys::rd_kafka_event_t) -> Result<String, String> {
    if event.is_null() {
        return Err("DescribeTopics timed out".into());
    }
    let text = |p: *const std::ffi::c_char| if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() };
    if rdsys::rd_kafka_event_error(event) != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(text(rdsys::rd_kafka_event_error_string(event)));
    }
    let result = rdsys::rd_kafka_event_DescribeTopics_result(event);
    if result.is_null() {
        return Err("not a DescribeTopics result".into());
    }
    let mut count = 0;
    let descriptions = rdsys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
    if count != 1 || descriptions.is_null() {
        return Err(format!("DescribeTopics returned {count} topics"));
    }
    let description = *descriptions;
    let error = rdsys::rd_kafka_TopicDescription_error(description);
    if !error.is_null() && rdsys::rd_kafka_error_code(error) != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(text(rdsys::rd_kafka_error_string(error)));
    }
    let id = rdsys::rd_kafka_TopicDescription_topic_id(description);
    if id.is_null() {
        return Err("no topic id in the description".into());
    }
    let (msb, lsb) = (rdsys::rd_kafka_Uuid_most_significant_bits(id), rdsys::rd_kafka_Uuid_least_significant_bits(id));
    if msb == 0 && lsb == 0 {
        return Err("the broker reported no topic id".into());
    }
    Ok(format!("{:016x}{:016x}", msb as u64, lsb as u64))
}
