//! Codecs turn typed keys and values into the bytes a store keeps.
//!
//! A store holds bytes; a [`TypedStore`](crate::TypedStore) puts a codec for
//! the key and one for the value in front of it. Six codecs come with the
//! crate: [`RawBytes`], [`Utf8`], [`U64Be`], [`I64`], [`Json`] and [`Prost`]. Write your own by
//! implementing [`Codec`].
//!
//! ```
//! use kstate::codec::{Codec, Json, Utf8};
//!
//! #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! struct Visit { page: String, count: u64 }
//!
//! let bytes = Json::<Visit>::encode(&Visit { page: "/".into(), count: 3 }).unwrap();
//! assert_eq!(Json::<Visit>::decode(&bytes).unwrap().count, 3);
//! assert_eq!(Utf8::decode(b"caf\xc3\xa9").unwrap(), "café");
//! assert!(Utf8::decode(&[0xff]).is_err());
//! ```

use std::marker::PhantomData;

use crate::error::{Error, Result};

/// Converts between a Rust type and its stored bytes.
///
/// For keys, the encoding decides the iteration order of range and prefix
/// scans: stores order keys by their encoded bytes.
pub trait Codec {
    /// The Rust type this codec handles.
    type Item;
    /// A short name used in error messages.
    const NAME: &'static str;
    /// Encodes an item.
    fn encode(item: &Self::Item) -> Result<Vec<u8>>;
    /// Decodes stored bytes; malformed input is an [`Error::Codec`].
    fn decode(bytes: &[u8]) -> Result<Self::Item>;
}

/// Bytes as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawBytes;

impl Codec for RawBytes {
    type Item = Vec<u8>;
    const NAME: &'static str = "raw-bytes";
    fn encode(item: &Vec<u8>) -> Result<Vec<u8>> {
        Ok(item.clone())
    }
    fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }
}

/// UTF-8 strings; invalid UTF-8 fails to decode.
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8;

impl Codec for Utf8 {
    type Item = String;
    const NAME: &'static str = "utf8";
    fn encode(item: &String) -> Result<Vec<u8>> {
        Ok(item.as_bytes().to_vec())
    }
    fn decode(bytes: &[u8]) -> Result<String> {
        String::from_utf8(bytes.to_vec()).map_err(|e| Error::codec(Self::NAME, e))
    }
}

/// Any serde type as JSON (serde_json).
pub struct Json<T>(PhantomData<fn() -> T>);

impl<T> Codec for Json<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    type Item = T;
    const NAME: &'static str = "json";
    fn encode(item: &T) -> Result<Vec<u8>> {
        serde_json::to_vec(item).map_err(|e| Error::codec(Self::NAME, e))
    }
    fn decode(bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|e| Error::codec(Self::NAME, e))
    }
}

/// Protocol Buffers messages (prost).
pub struct Prost<T>(PhantomData<fn() -> T>);

impl<T> Codec for Prost<T>
where
    T: prost::Message + Default,
{
    type Item = T;
    const NAME: &'static str = "prost";
    fn encode(item: &T) -> Result<Vec<u8>> {
        Ok(item.encode_to_vec())
    }
    fn decode(bytes: &[u8]) -> Result<T> {
        T::decode(bytes).map_err(|e| Error::codec(Self::NAME, e))
    }
}

/// Big-endian `u64`, so numeric order equals byte order (good for keys).
#[derive(Debug, Clone, Copy, Default)]
pub struct U64Be;

impl Codec for U64Be {
    type Item = u64;
    const NAME: &'static str = "u64-be";
    fn encode(item: &u64) -> Result<Vec<u8>> {
        Ok(item.to_be_bytes().to_vec())
    }
    fn decode(bytes: &[u8]) -> Result<u64> {
        let arr: [u8; 8] = bytes
            .try_into()
            .map_err(|_| Error::codec(Self::NAME, format!("expected 8 bytes, got {}", bytes.len())))?;
        Ok(u64::from_be_bytes(arr))
    }
}

/// `i64` in 8 bytes that sort in numeric order: big-endian with the sign
/// bit flipped, so -1 sorts before 0 and 0 before 1 (timestamps, signed
/// counters, and keys of range scans over them).
///
/// ```
/// use kstate::codec::{Codec, I64};
/// let (neg, zero, big) = (I64::encode(&-5).unwrap(), I64::encode(&0).unwrap(), I64::encode(&(1 << 40)).unwrap());
/// assert!(neg < zero && zero < big);
/// assert_eq!(I64::decode(&neg).unwrap(), -5);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct I64;

impl Codec for I64 {
    type Item = i64;
    const NAME: &'static str = "i64";
    fn encode(item: &i64) -> Result<Vec<u8>> {
        Ok(((*item as u64) ^ (1 << 63)).to_be_bytes().to_vec())
    }
    fn decode(bytes: &[u8]) -> Result<i64> {
        Ok((U64Be::decode(bytes).map_err(|_| Error::codec(Self::NAME, format!("expected 8 bytes, got {}", bytes.len())))? ^ (1 << 63)) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Point {
        #[prost(int32, tag = "1")]
        x: i32,
    }

    #[test]
    fn prost_round_trip_and_garbage() {
        let b = Prost::<Point>::encode(&Point { x: 7 }).unwrap();
        assert_eq!(Prost::<Point>::decode(&b).unwrap().x, 7);
        assert!(matches!(Prost::<Point>::decode(&[0xff, 0xff]), Err(Error::Codec { codec: "prost", .. })));
    }

    #[test]
    fn json_garbage_is_codec_error() {
        assert!(matches!(Json::<u32>::decode(b"{"), Err(Error::Codec { codec: "json", .. })));
    }

    proptest::proptest! {
        /// Byte order is numeric order, and every value comes back.
        #[test]
        fn i64_order_matches_bytes(a: i64, b: i64) {
            let (ea, eb) = (I64::encode(&a).unwrap(), I64::encode(&b).unwrap());
            proptest::prop_assert_eq!(ea.cmp(&eb), a.cmp(&b));
            proptest::prop_assert_eq!(I64::decode(&ea).unwrap(), a);
        }
    }

    #[test]
    fn i64_refuses_other_lengths() {
        assert!(matches!(I64::decode(&[0; 7]), Err(Error::Codec { codec: "i64", .. })));
        assert_eq!(I64::encode(&i64::MIN).unwrap(), [0; 8]);
    }

    #[test]
    fn u64_order_matches_bytes() {
        assert!(U64Be::encode(&2).unwrap() < U64Be::encode(&256).unwrap());
        assert!(U64Be::decode(&[1, 2]).is_err());
    }
}
