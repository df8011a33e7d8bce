//! One blocking connection to one broker, speaking the Kafka wire protocol
//! through the `kafka-protocol` codec: TCP, then TLS and SASL as the
//! security settings say, then ApiVersions; every request afterwards uses
//! the highest version both sides support.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};

use super::scram::Scram;
use super::security::{Mechanism, Pem, Protocol, Security, Tls};
use crate::error::{Error, Result};

/// The largest response kstate accepts (a JoinGroup response of a large
/// group with every member's metadata stays far below).
const MAX_RESPONSE_BYTES: usize = 256 << 20;
/// UNSUPPORTED_VERSION: an ApiVersions reply in version 0.
const UNSUPPORTED_VERSION: i16 = 35;

enum Stream {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A connection to one broker, ready for requests.
pub(crate) struct Connection {
    stream: Stream,
    /// `host:port` as connected to (for errors and logs).
    broker: String,
    client_id: StrBytes,
    correlation: i32,
    /// The broker's supported version range per API key.
    versions: HashMap<i16, (i16, i16)>,
    /// How long a request may take before the connection counts as broken.
    request_timeout: Duration,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("broker", &self.broker).finish_non_exhaustive()
    }
}

/// An I/O failure reaching or talking to `broker` (retriable).
fn unreachable(broker: &str, timeout: Duration, detail: impl std::fmt::Display) -> Error {
    Error::BrokerUnreachable { bootstrap: broker.to_string(), timeout, detail: detail.to_string() }
}

/// A TLS failure in an I/O error, if it is one: after a TLS 1.3 handshake a
/// broker that refuses the client certificate says so at the first read.
fn tls_failure(e: &std::io::Error) -> Option<String> {
    let inner = e.get_ref()?;
    let ssl = inner.downcast_ref::<openssl::ssl::Error>()?;
    ssl.ssl_error().map(|stack| stack.to_string())
}

impl Connection {
    /// Connects to `broker` (`host:port`), sets up TLS and SASL as
    /// `security` says and learns the broker's API versions. Unreachable
    /// brokers give [`Error::BrokerUnreachable`] (retriable); a refused
    /// certificate [`Error::Tls`] and refused credentials
    /// [`Error::Authentication`] (not retriable).
    pub(crate) fn connect(broker: &str, security: &Security, client_id: &str, timeout: Duration) -> Result<Connection> {
        let started = Instant::now();
        let addrs: Vec<_> = broker
            .to_socket_addrs()
            .map_err(|e| unreachable(broker, timeout, format!("cannot resolve: {e}")))?
            .collect();
        let mut last = None;
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let tcp = tcp.ok_or_else(|| {
            unreachable(broker, timeout, last.map_or_else(|| "no address".to_string(), |e| e.to_string()))
        })?;
        let _ = tcp.set_nodelay(true);
        tcp.set_read_timeout(Some(timeout)).map_err(|e| unreachable(broker, timeout, e))?;
        tcp.set_write_timeout(Some(timeout)).map_err(|e| unreachable(broker, timeout, e))?;
        let stream = match (&security.protocol, &security.tls) {
            (Protocol::Ssl | Protocol::SaslSsl, Some(tls)) => Stream::Tls(Box::new(tls_handshake(broker, tcp, tls)?)),
            (Protocol::Ssl | Protocol::SaslSsl, None) => Stream::Tls(Box::new(tls_handshake(broker, tcp, &Tls::default())?)),
            _ => Stream::Plain(tcp),
        };
        let mut conn = Connection {
            stream,
            broker: broker.to_string(),
            client_id: StrBytes::from_string(client_id.to_string()),
            correlation: 0,
            versions: HashMap::new(),
            request_timeout: timeout,
        };
        conn.api_versions()?;
        if let Some(sasl) = &security.sasl {
            conn.authenticate(sasl.mechanism, &sasl.username, &sasl.password)?;
        }
        tracing::debug!(broker, elapsed = ?started.elapsed(), "connected");
        Ok(conn)
    }

    /// The broker this connection goes to.
    pub(crate) fn broker(&self) -> &str {
        &self.broker
    }

    /// Sets how long each request may take (a JoinGroup waits for the
    /// whole group, up to the rebalance timeout).
    pub(crate) fn set_request_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.request_timeout = timeout;
        let tcp = self.stream.tcp();
        tcp.set_read_timeout(Some(timeout)).map_err(|e| unreachable(&self.broker, timeout, e))?;
        tcp.set_write_timeout(Some(timeout)).map_err(|e| unreachable(&self.broker, timeout, e))
    }

    /// The highest version of `R` both kstate's codec and the broker speak.
    pub(crate) fn version<R: Request>(&self) -> Result<i16> {
        let ours = R::VERSIONS;
        let name = ApiKey::try_from(R::KEY).map_or_else(|_| format!("API key {}", R::KEY), |k| format!("{k:?}"));
        let Some(&(min, max)) = self.versions.get(&R::KEY) else {
            return Err(Error::UnsupportedBroker { broker: self.broker.clone(), detail: format!("{name} is not supported") });
        };
        let (lo, hi) = (ours.min.max(min), ours.max.min(max));
        if lo > hi {
            return Err(Error::UnsupportedBroker {
                broker: self.broker.clone(),
                detail: format!("{name}: broker speaks versions {min}..={max}, kstate {}..={}", ours.min, ours.max),
            });
        }
        Ok(hi)
    }

    /// Sends `request` in the negotiated version and waits for its response.
    pub(crate) fn send<R: Request>(&mut self, request: &R) -> Result<(R::Response, i16)> {
        let version = self.version::<R>()?;
        Ok((self.send_version(request, version)?, version))
    }

    /// Sends `request` in the negotiated version, but at most `max` (a
    /// newer version changes the request's shape).
    pub(crate) fn send_at_most<R: Request>(&mut self, request: &R, max: i16) -> Result<(R::Response, i16)> {
        let version = self.version::<R>()?.min(max);
        Ok((self.send_version(request, version)?, version))
    }

    fn send_version<R: Request>(&mut self, request: &R, version: i16) -> Result<R::Response> {
        let mut body = self.roundtrip::<R>(request, version)?;
        R::Response::decode(&mut body, version).map_err(|e| self.protocol_error(R::KEY, e))
    }

    /// Writes one request frame and reads its response body (after the
    /// response header).
    fn roundtrip<R: Request>(&mut self, request: &R, version: i16) -> Result<BytesMut> {
        self.correlation = self.correlation.wrapping_add(1);
        let mut header = RequestHeader::default();
        header.request_api_key = R::KEY;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(self.client_id.clone());
        let mut frame = BytesMut::with_capacity(256);
        frame.extend_from_slice(&[0; 4]);
        header.encode(&mut frame, R::header_version(version)).map_err(|e| self.protocol_error(R::KEY, e))?;
        request.encode(&mut frame, version).map_err(|e| self.protocol_error(R::KEY, e))?;
        let len = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&frame).map_err(|e| self.io_error(e))?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(|e| self.io_error(e))?;
        let size = i32::from_be_bytes(size);
        if size < 4 || size as usize > MAX_RESPONSE_BYTES {
            return Err(self.protocol_error(R::KEY, format!("response of {size} bytes")));
        }
        let mut body = BytesMut::zeroed(size as usize);
        self.stream.read_exact(&mut body).map_err(|e| self.io_error(e))?;
        let header = ResponseHeader::decode(&mut body, R::Response::header_version(version))
            .map_err(|e| self.protocol_error(R::KEY, e))?;
        if header.correlation_id != self.correlation {
            return Err(self.protocol_error(
                R::KEY,
                format!("correlation id {} for request {}", header.correlation_id, self.correlation),
            ));
        }
        Ok(body)
    }

    /// ApiVersions: in version 3, or 0 if the broker is older (it answers
    /// UNSUPPORTED_VERSION in version 0 then).
    fn api_versions(&mut self) -> Result<()> {
        let mut request = ApiVersionsRequest::default();
        request.client_software_name = StrBytes::from_static_str("kstate");
        request.client_software_version = StrBytes::from_static_str(env!("CARGO_PKG_VERSION"));
        let mut body = self.roundtrip::<ApiVersionsRequest>(&request, 3)?;
        let error = body.clone().get_i16();
        let response = if error == UNSUPPORTED_VERSION {
            let mut body = self.roundtrip::<ApiVersionsRequest>(&request, 0)?;
            ApiVersionsResponse::decode(&mut body, 0)
        } else {
            ApiVersionsResponse::decode(&mut body, 3)
        }
        .map_err(|e| self.protocol_error(ApiKey::ApiVersions as i16, e))?;
        if response.error_code != 0 {
            return Err(Error::UnsupportedBroker {
                broker: self.broker.clone(),
                detail: format!("ApiVersions failed with error code {}", response.error_code),
            });
        }
        self.versions = response.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect();
        Ok(())
    }

    /// SASL: SaslHandshake (version 1), then SaslAuthenticate exchanges.
    fn authenticate(&mut self, mechanism: Mechanism, username: &str, password: &str) -> Result<()> {
        let auth_error = |broker: &str, detail: String| Error::Authentication {
            broker: broker.to_string(),
            mechanism: mechanism.name(),
            detail,
        };
        let mut handshake = SaslHandshakeRequest::default();
        handshake.mechanism = StrBytes::from_static_str(mechanism.name());
        // Version 1 frames the exchange in SaslAuthenticate requests (every
        // broker since Kafka 1.0, and Redpanda).
        if self.version::<SaslHandshakeRequest>()? < 1 {
            return Err(auth_error(&self.broker, "the broker does not support SaslHandshake v1".into()));
        }
        let response = self.send_version(&handshake, 1)?;
        if response.error_code != 0 {
            let offered: Vec<&str> = response.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(auth_error(
                &self.broker,
                format!("mechanism not enabled on this listener (it offers {offered:?}; error code {})", response.error_code),
            ));
        }
        let exchange = |conn: &mut Connection, bytes: Vec<u8>| -> Result<Vec<u8>> {
            let mut request = SaslAuthenticateRequest::default();
            request.auth_bytes = bytes.into();
            let (response, _) = conn.send(&request)?;
            if response.error_code != 0 {
                let message = response.error_message.as_ref().map_or("", |m| m.as_str());
                return Err(auth_error(&conn.broker, format!("{message} (error code {})", response.error_code)));
            }
            Ok(response.auth_bytes.to_vec())
        };
        match mechanism {
            Mechanism::Plain => {
                let token = format!("\0{username}\0{password}");
                exchange(self, token.into_bytes())?;
            }
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                let mut scram = Scram::new(mechanism, username, password).map_err(|e| auth_error(&self.broker, e))?;
                let server_first = exchange(self, scram.client_first())?;
                let client_final = scram.client_final(&server_first).map_err(|e| auth_error(&self.broker, e))?;
                let server_final = exchange(self, client_final)?;
                scram.verify_server_final(&server_final).map_err(|e| auth_error(&self.broker, e))?;
            }
        }
        tracing::debug!(broker = %self.broker, mechanism = mechanism.name(), "authenticated");
        Ok(())
    }

    fn io_error(&self, e: std::io::Error) -> Error {
        match tls_failure(&e) {
            Some(detail) => Error::Tls { broker: self.broker.clone(), detail },
            None => unreachable(&self.broker, self.request_timeout, e),
        }
    }

    fn protocol_error(&self, key: i16, e: impl std::fmt::Display) -> Error {
        let name = ApiKey::try_from(key).map_or_else(|_| format!("API key {key}"), |k| format!("{k:?}"));
        Error::UnsupportedBroker { broker: self.broker.clone(), detail: format!("malformed {name} exchange: {e}") }
    }
}

fn read_pem(pem: &Pem, what: &str) -> Result<Vec<u8>> {
    match pem {
        Pem::Inline(text) => Ok(text.clone().into_bytes()),
        Pem::File(path) => std::fs::read(path)
            .map_err(|e| Error::Config(format!("cannot read the {what} at `{}`: {e}", path.display()))),
    }
}

/// The TLS handshake with the settings of `tls`.
fn tls_handshake(broker: &str, tcp: TcpStream, tls: &Tls) -> Result<SslStream<TcpStream>> {
    let tls_error = |detail: String| Error::Tls { broker: broker.to_string(), detail };
    let config_error = |what: &str, e: openssl::error::ErrorStack| Error::Config(format!("TLS {what}: {e}"));
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(|e| config_error("setup", e))?;
    match &tls.ca {
        Some(Pem::File(path)) if path.is_dir() => {
            builder.load_verify_locations(None, Some(path)).map_err(|e| config_error("CA directory", e))?
        }
        Some(pem) => {
            let bytes = read_pem(pem, "CA certificate")?;
            let certs = openssl::x509::X509::stack_from_pem(&bytes).map_err(|e| config_error("CA certificate", e))?;
            let store = builder.cert_store_mut();
            for cert in certs {
                store.add_cert(cert).map_err(|e| config_error("CA certificate", e))?;
            }
        }
        None => builder.set_default_verify_paths().map_err(|e| config_error("system trust store", e))?,
    }
    if let (Some(cert), Some(key)) = (&tls.certificate, &tls.key) {
        let chain = openssl::x509::X509::stack_from_pem(&read_pem(cert, "client certificate")?)
            .map_err(|e| config_error("client certificate", e))?;
        let mut chain = chain.into_iter();
        let leaf = chain.next().ok_or_else(|| Error::Config("the client certificate file holds no certificate".into()))?;
        builder.set_certificate(&leaf).map_err(|e| config_error("client certificate", e))?;
        for extra in chain {
            builder.add_extra_chain_cert(extra).map_err(|e| config_error("client certificate chain", e))?;
        }
        let key_bytes = read_pem(key, "client key")?;
        let key = match &tls.key_password {
            Some(pass) => openssl::pkey::PKey::private_key_from_pem_passphrase(&key_bytes, pass.as_bytes()),
            None => openssl::pkey::PKey::private_key_from_pem(&key_bytes),
        }
        .map_err(|e| config_error("client key (wrong `ssl.key.password`?)", e))?;
        builder.set_private_key(&key).map_err(|e| config_error("client key", e))?;
        builder.check_private_key().map_err(|e| config_error("client key does not match the certificate", e))?;
    }
    if !tls.verify_certificate {
        builder.set_verify(SslVerifyMode::NONE);
    }
    let connector = builder.build();
    let mut config = connector.configure().map_err(|e| config_error("setup", e))?;
    config.set_verify_hostname(tls.verify_hostname && tls.verify_certificate);
    let host = broker.rsplit_once(':').map_or(broker, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    // A certificate check that failed or a TLS alert is the listener's
    // answer (not retried); a connection that broke or timed out during the
    // handshake (a broker restarting) is only unreachable.
    config.connect(host, tcp).map_err(|e| match e {
        openssl::ssl::HandshakeError::Failure(mid) => {
            let verify = mid.ssl().verify_result();
            if verify != openssl::x509::X509VerifyResult::OK {
                tls_error(format!("broker certificate not trusted: {}", verify.error_string()))
            } else if mid.error().ssl_error().is_none() {
                unreachable(broker, Duration::ZERO, format!("connection lost during the TLS handshake: {}", mid.error()))
            } else {
                tls_error(mid.error().to_string())
            }
        }
        openssl::ssl::HandshakeError::SetupFailure(stack) => tls_error(stack.to_string()),
        openssl::ssl::HandshakeError::WouldBlock(_) => unreachable(broker, Duration::ZERO, "TLS handshake timed out"),
    })
}
