//! [`TypedStore`]: a byte store read and written through codecs.

use std::marker::PhantomData;

use super::KeyValueStore;
use crate::codec::Codec;
use crate::error::Result;

/// A [`KeyValueStore`] seen through a key codec `K` and a value codec `V`.
///
/// ```no_run
/// # fn f(ctx: &mut kstate::ProcessorContext<'_>) -> kstate::Result<()> {
/// use kstate::codec::{U64Be, Utf8};
/// let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
/// let n = counts.get(&"apple".to_string())?.unwrap_or(0);
/// counts.put(&"apple".to_string(), &(n + 1))?;
/// # Ok(()) }
/// ```
pub struct TypedStore<'s, K, V> {
    inner: &'s mut KeyValueStore,
    _codecs: PhantomData<fn() -> (K, V)>,
}

impl<'s, K: Codec, V: Codec> TypedStore<'s, K, V> {
    /// Wraps a byte store.
    pub fn new(inner: &'s mut KeyValueStore) -> Self {
        TypedStore { inner, _codecs: PhantomData }
    }

    /// Reads a key.
    pub fn get(&self, key: &K::Item) -> Result<Option<V::Item>> {
        self.inner.get(&K::encode(key)?)?.map(|b| V::decode(&b)).transpose()
    }

    /// Writes a key; encoding errors and oversize records write nothing.
    pub fn put(&mut self, key: &K::Item, value: &V::Item) -> Result<()> {
        let k = K::encode(key)?;
        let v = V::encode(value)?;
        self.inner.put(&k, &v)
    }

    /// Deletes a key.
    pub fn delete(&mut self, key: &K::Item) -> Result<()> {
        self.inner.delete(&K::encode(key)?)
    }

    /// Entries with `from <= key < to` by encoded order, decoded one by
    /// one as the iterator goes (nothing collected in memory); an `Err`
    /// first if a bound does not encode.
    pub fn range(&self, from: &K::Item, to: &K::Item) -> Result<impl Iterator<Item = Result<(K::Item, V::Item)>> + '_> {
        let (f, t) = (K::encode(from)?, K::encode(to)?);
        Ok(self.inner.range(&f, &t).map(decode_pair::<K, V>))
    }

    /// Entries whose encoded key starts with `prefix`, decoded one by one.
    pub fn prefix_scan(&self, prefix: &[u8]) -> impl Iterator<Item = Result<(K::Item, V::Item)>> + '_ {
        self.inner.prefix_scan(prefix).map(decode_pair::<K, V>)
    }

    /// The underlying byte store.
    pub fn raw(&mut self) -> &mut KeyValueStore {
        self.inner
    }
}

fn decode_pair<K: Codec, V: Codec>(r: Result<(Vec<u8>, Vec<u8>)>) -> Result<(K::Item, V::Item)> {
    let (k, v) = r?;
    Ok((K::decode(&k)?, V::decode(&v)?))
}

