//! Finding the group's coordinator: FindCoordinator on a bootstrap broker,
//! then a connection to the broker it names.

use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::FindCoordinatorRequest;
use kafka_protocol::protocol::StrBytes;

use super::conn::Connection;
use super::security::Security;
use crate::error::{Error, Result};

/// Where and how to connect: the bootstrap brokers and security settings.
#[derive(Debug, Clone)]
pub(crate) struct Brokers {
    pub(crate) bootstrap: Vec<String>,
    pub(crate) security: Security,
    pub(crate) client_id: String,
    /// Connect and request timeout of short requests.
    pub(crate) timeout: Duration,
}

impl Brokers {
    /// From a librdkafka-style `bootstrap.servers` list.
    pub(crate) fn new(bootstrap: &str, security: Security, client_id: String, timeout: Duration) -> Brokers {
        let bootstrap = bootstrap
            .split(',')
            .map(|b| b.trim())
            .filter(|b| !b.is_empty())
            .map(|b| b.split_once("://").map_or(b, |(_, rest)| rest).to_string())
            .collect();
        Brokers { bootstrap, security, client_id, timeout }
    }

    /// Connects to the first bootstrap broker that answers, starting at
    /// `start` (callers rotate it so one dead broker does not hold them up).
    pub(crate) fn any(&self, start: usize) -> Result<Connection> {
        let mut last = None;
        for i in 0..self.bootstrap.len() {
            let broker = &self.bootstrap[(start + i) % self.bootstrap.len()];
            match Connection::connect(broker, &self.security, &self.client_id, self.timeout) {
                Ok(c) => return Ok(c),
                Err(e @ Error::BrokerUnreachable { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Config("`bootstrap.servers` is empty".into())))
    }

    /// Waits until a bootstrap broker answers, with TLS and SASL done, for
    /// at most `timeout`: refused credentials or an untrusted certificate
    /// fail at once with their own error instead of a timeout.
    pub(crate) fn reach(&self, timeout: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        let mut attempt = 0;
        loop {
            match self.any(attempt) {
                Ok(_) => return Ok(()),
                Err(Error::BrokerUnreachable { detail, .. }) if std::time::Instant::now() >= deadline => {
                    return Err(Error::BrokerUnreachable { bootstrap: self.bootstrap.join(","), timeout, detail })
                }
                Err(Error::BrokerUnreachable { .. }) => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Connects to the coordinator of `group`. Retriable failures (no
    /// coordinator yet, brokers away) give [`Error::BrokerUnreachable`].
    pub(crate) fn coordinator(&self, group: &str, start: usize) -> Result<Connection> {
        let mut conn = self.any(start)?;
        let mut request = FindCoordinatorRequest::default();
        let version = conn.version::<FindCoordinatorRequest>()?;
        if version >= 4 {
            request.coordinator_keys = vec![StrBytes::from_string(group.to_string())];
        } else {
            request.key = StrBytes::from_string(group.to_string());
        }
        let (response, version) = conn.send(&request)?;
        let (code, message, host, port) = if version >= 4 {
            let c = response.coordinators.first().ok_or_else(|| Error::UnsupportedBroker {
                broker: conn.broker().to_string(),
                detail: "FindCoordinator answered no coordinator".into(),
            })?;
            (c.error_code, c.error_message.clone(), c.host.to_string(), c.port)
        } else {
            (response.error_code, response.error_message.clone(), response.host.to_string(), response.port)
        };
        if let Some(error) = ResponseError::try_from_code(code) {
            let detail = format!("{error}{}", message.map(|m| format!(": {}", m.as_str())).unwrap_or_default());
            return Err(match error {
                ResponseError::GroupAuthorizationFailed => Error::GroupMembership { group: group.to_string(), detail },
                _ => Error::BrokerUnreachable {
                    bootstrap: conn.broker().to_string(),
                    timeout: self.timeout,
                    detail: format!("no coordinator for group `{group}` yet: {detail}"),
                },
            });
        }
        let address = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        if address == conn.broker() {
            return Ok(conn);
        }
        Connection::connect(&address, &self.security, &self.client_id, self.timeout)
    }
}
