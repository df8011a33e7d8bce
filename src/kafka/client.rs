//! librdkafka client configuration shared by kstate's clients.

/// Sets a librdkafka property unless the user already set it.
pub(crate) fn set_default(config: &mut rdkafka::ClientConfig, key: &str, value: &str) {
    if config.get(key).is_none() {
        config.set(key, value);
    }
}
