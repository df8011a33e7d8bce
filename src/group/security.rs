//! The security settings of kstate's own broker connections, read from the
//! same librdkafka properties users pass through `kafka_config`, so the
//! membership connection authenticates exactly like the librdkafka clients.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

/// A SASL mechanism kstate's own connections support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    /// The name on the wire (SaslHandshake).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// Where a PEM item comes from: a file (`*.location`) or inline (`*.pem`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pem {
    File(PathBuf),
    Inline(String),
}

/// TLS settings (`ssl.*`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Tls {
    /// Trusted CAs; `None` uses the system's trust store.
    pub(crate) ca: Option<Pem>,
    /// Client certificate (chain) for mutual TLS.
    pub(crate) certificate: Option<Pem>,
    /// Client private key.
    pub(crate) key: Option<Pem>,
    /// Password of an encrypted private key.
    pub(crate) key_password: Option<String>,
    /// `enable.ssl.certificate.verification` (default true).
    pub(crate) verify_certificate: bool,
    /// `ssl.endpoint.identification.algorithm=https` (librdkafka's default):
    /// the broker certificate must name the host connected to.
    pub(crate) verify_hostname: bool,
}

/// SASL settings (`sasl.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sasl {
    pub(crate) mechanism: Mechanism,
    pub(crate) username: String,
    pub(crate) password: String,
}

/// Everything a connection needs to reach a broker like librdkafka would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Security {
    pub(crate) protocol: Protocol,
    pub(crate) tls: Option<Tls>,
    pub(crate) sasl: Option<Sasl>,
}

impl Security {
    /// Plaintext, no authentication.
    #[cfg(test)]
    pub(crate) fn plaintext() -> Security {
        Security { protocol: Protocol::Plaintext, tls: None, sasl: None }
    }

    /// Reads the librdkafka security properties among `config` (later
    /// entries win, as with librdkafka). Settings kstate's own connections
    /// cannot honour are a configuration error, not a silent downgrade.
    pub(crate) fn from_kafka_config(config: &[(String, String)]) -> Result<Security> {
        let get = |key: &str| config.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.trim().to_string());
        let flag = |key: &str, default: bool| -> Result<bool> {
            match get(key).as_deref().map(str::to_ascii_lowercase).as_deref() {
                None => Ok(default),
                Some("true" | "1") => Ok(true),
                Some("false" | "0") => Ok(false),
                Some(other) => Err(Error::Config(format!("`{key}` must be true or false, not `{other}`"))),
            }
        };
        let protocol = match get("security.protocol").as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("plaintext") => Protocol::Plaintext,
            Some("ssl") => Protocol::Ssl,
            Some("sasl_plaintext") => Protocol::SaslPlaintext,
            Some("sasl_ssl") => Protocol::SaslSsl,
            Some(other) => {
                return Err(Error::Config(format!(
                    "`security.protocol` must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, not `{other}`"
                )))
            }
        };
        let pem = |location: &str, inline: &str| -> Result<Option<Pem>> {
            match (get(location), get(inline)) {
                (Some(_), Some(_)) => Err(Error::Config(format!("set `{location}` or `{inline}`, not both"))),
                (Some(path), None) => Ok(Some(Pem::File(PathBuf::from(path)))),
                (None, Some(text)) => Ok(Some(Pem::Inline(text))),
                (None, None) => Ok(None),
            }
        };
        let tls = if matches!(protocol, Protocol::Ssl | Protocol::SaslSsl) {
            let ca = match get("ssl.ca.location").as_deref() {
                // librdkafka's "probe" searches well-known system paths: the
                // system trust store does the same here.
                Some("probe") => None,
                _ => pem("ssl.ca.location", "ssl.ca.pem")?,
            };
            let identification = get("ssl.endpoint.identification.algorithm").map(|v| v.to_ascii_lowercase());
            let verify_hostname = match identification.as_deref() {
                None | Some("https") => true,
                Some("none") => false,
                Some(other) => {
                    return Err(Error::Config(format!(
                        "`ssl.endpoint.identification.algorithm` must be https or none, not `{other}`"
                    )))
                }
            };
            let tls = Tls {
                ca,
                certificate: pem("ssl.certificate.location", "ssl.certificate.pem")?,
                key: pem("ssl.key.location", "ssl.key.pem")?,
                key_password: get("ssl.key.password"),
                verify_certificate: flag("enable.ssl.certificate.verification", true)?,
                verify_hostname,
            };
            if tls.certificate.is_some() != tls.key.is_some() {
                return Err(Error::Config(
                    "a TLS client certificate needs its key and the other way round (`ssl.certificate.*` and `ssl.key.*`)".into(),
                ));
            }
            for unsupported in ["ssl.keystore.location", "ssl.engine.location", "ssl.providers"] {
                if get(unsupported).is_some() {
                    return Err(Error::Config(format!(
                        "`{unsupported}` is not supported by kstate's group connection; use PEM files (`ssl.certificate.location`, `ssl.key.location`)"
                    )));
                }
            }
            Some(tls)
        } else {
            None
        };
        let sasl = if matches!(protocol, Protocol::SaslPlaintext | Protocol::SaslSsl) {
            let name = get("sasl.mechanism").or_else(|| get("sasl.mechanisms")).unwrap_or_else(|| "GSSAPI".into());
            let mechanism = match name.to_ascii_uppercase().as_str() {
                "PLAIN" => Mechanism::Plain,
                "SCRAM-SHA-256" => Mechanism::ScramSha256,
                "SCRAM-SHA-512" => Mechanism::ScramSha512,
                other => {
                    return Err(Error::Config(format!(
                        "SASL mechanism `{other}` is not supported; kstate supports PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (set `sasl.mechanism`)"
                    )))
                }
            };
            let username = get("sasl.username").ok_or_else(|| Error::Config("SASL needs `sasl.username`".into()))?;
            let password = get("sasl.password").ok_or_else(|| Error::Config("SASL needs `sasl.password`".into()))?;
            Some(Sasl { mechanism, username, password })
        } else {
            None
        };
        Ok(Security { protocol, tls, sasl })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn plaintext_by_default() {
        assert_eq!(Security::from_kafka_config(&[]).unwrap(), Security::plaintext());
    }

    #[test]
    fn sasl_ssl_with_scram_and_a_ca_file() {
        let s = Security::from_kafka_config(&cfg(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
            ("ssl.ca.location", "/ca.pem"),
        ]))
        .unwrap();
        assert_eq!(s.protocol, Protocol::SaslSsl);
        assert_eq!(s.sasl.unwrap().mechanism, Mechanism::ScramSha512);
        let tls = s.tls.unwrap();
        assert_eq!(tls.ca, Some(Pem::File("/ca.pem".into())));
        assert!(tls.verify_hostname && tls.verify_certificate);
    }

    #[test]
    fn bad_settings_are_config_errors() {
        for bad in [
            vec![("security.protocol", "tls")],
            vec![("security.protocol", "SASL_PLAINTEXT"), ("sasl.mechanism", "GSSAPI"), ("sasl.username", "u"), ("sasl.password", "p")],
            vec![("security.protocol", "SASL_PLAINTEXT"), ("sasl.mechanism", "PLAIN"), ("sasl.username", "u")],
            vec![("security.protocol", "SSL"), ("ssl.certificate.location", "/c.pem")],
            vec![("security.protocol", "SSL"), ("ssl.endpoint.identification.algorithm", "dns")],
            vec![("security.protocol", "SSL"), ("enable.ssl.certificate.verification", "maybe")],
        ] {
            let r = Security::from_kafka_config(&cfg(&bad));
            assert!(matches!(r, Err(Error::Config(_))), "{bad:?} gave {r:?}");
        }
    }
}
