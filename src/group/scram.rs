//! The client side of SASL SCRAM-SHA-256/512 (RFC 5802, RFC 7677), as
//! Kafka brokers speak it, on OpenSSL's HMAC and PBKDF2.

use openssl::base64;
use openssl::hash::{hash, MessageDigest};
use openssl::pkey::PKey;
use openssl::sign::Signer;

use super::security::Mechanism;

/// One SCRAM exchange: client-first, server-first, client-final, server-final.
pub(crate) struct Scram {
    digest: MessageDigest,
    password: String,
    client_first_bare: String,
    nonce: String,
    /// ServerSignature expected in server-final (set by `client_final`).
    server_signature: Option<Vec<u8>>,
}

/// Servers ask for at least 4096 iterations; a much larger count would
/// let a rogue server burn the client's CPU.
const MAX_ITERATIONS: usize = 1 << 20;

impl Scram {
    /// Starts an exchange for `username` (escaped as RFC 5802 asks).
    pub(crate) fn new(mechanism: Mechanism, username: &str, password: &str) -> Result<Scram, String> {
        let digest = match mechanism {
            Mechanism::ScramSha256 => MessageDigest::sha256(),
            Mechanism::ScramSha512 => MessageDigest::sha512(),
            Mechanism::Plain => return Err("PLAIN is not a SCRAM mechanism".into()),
        };
        let mut raw = [0u8; 24];
        openssl::rand::rand_bytes(&mut raw).map_err(|e| e.to_string())?;
        let nonce = base64::encode_block(&raw);
        let name = username.replace('=', "=3D").replace(',', "=2C");
        Ok(Scram {
            digest,
            password: password.to_string(),
            client_first_bare: format!("n={name},r={nonce}"),
            nonce,
            server_signature: None,
        })
    }

    /// The client-first message (no channel binding, no authzid).
    pub(crate) fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Result<Vec<u8>, String> {
        let key = PKey::hmac(key).map_err(|e| e.to_string())?;
        let mut signer = Signer::new(self.digest, &key).map_err(|e| e.to_string())?;
        signer.update(data).map_err(|e| e.to_string())?;
        signer.sign_to_vec().map_err(|e| e.to_string())
    }

    /// The client-final message for the server-first message `server_first`.
    pub(crate) fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, String> {
        let server_first = std::str::from_utf8(server_first).map_err(|_| "server-first message is not UTF-8")?;
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for attr in server_first.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(base64::decode_block(v).map_err(|_| "server salt is not base64")?),
                Some(("i", v)) => iterations = v.parse::<usize>().ok(),
                Some(("e", v)) => return Err(format!("server error: {v}")),
                _ => {}
            }
        }
        let nonce = nonce.ok_or("server-first message has no nonce")?;
        if !nonce.starts_with(&self.nonce) {
            return Err("server nonce does not extend the client's".into());
        }
        let salt = salt.ok_or("server-first message has no salt")?;
        let iterations = iterations.ok_or("server-first message has no iteration count")?;
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err(format!("server asks for {iterations} iterations"));
        }
        let mut salted = vec![0u8; self.digest.size()];
        openssl::pkcs5::pbkdf2_hmac(self.password.as_bytes(), &salt, iterations, self.digest, &mut salted)
            .map_err(|e| e.to_string())?;
        let client_key = self.hmac(&salted, b"Client Key")?;
        let stored_key = hash(self.digest, &client_key).map_err(|e| e.to_string())?;
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = self.hmac(&stored_key, auth_message.as_bytes())?;
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        let server_key = self.hmac(&salted, b"Server Key")?;
        self.server_signature = Some(self.hmac(&server_key, auth_message.as_bytes())?);
        Ok(format!("{without_proof},p={}", base64::encode_block(&proof)).into_bytes())
    }

    /// Checks the server's signature: the server knew the password too.
    pub(crate) fn verify_server_final(&self, server_final: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(server_final).map_err(|_| "server-final message is not UTF-8")?;
        if let Some(error) = text.strip_prefix("e=") {
            return Err(format!("server error: {error}"));
        }
        let given = text
            .split(',')
            .find_map(|a| a.strip_prefix("v="))
            .ok_or("server-final message has no signature")?;
        let given = base64::decode_block(given).map_err(|_| "server signature is not base64")?;
        if Some(given) != self.server_signature {
            return Err("the server's SCRAM signature is wrong (not the broker we expected?)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example, with its client nonce.
    #[test]
    fn rfc7677_example() {
        let mut s = Scram::new(Mechanism::ScramSha256, "user", "pencil").unwrap();
        s.nonce = "rOprNGfwEbeRWgbNEkqO".into();
        s.client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO".into();
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let client_final = s.client_final(server_first).unwrap();
        assert_eq!(
            std::str::from_utf8(&client_final).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        s.verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").unwrap();
        assert!(s.verify_server_final(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").is_err());
    }

    #[test]
    fn a_server_nonce_not_extending_ours_is_refused() {
        let mut s = Scram::new(Mechanism::ScramSha512, "u", "p").unwrap();
        assert!(s.client_final(b"r=other,s=QUJD,i=4096").is_err());
    }
}
