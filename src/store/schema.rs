//! Schema versions of a store's values (architecture.md §11).
//!
//! A store definition names the version of the value format its code
//! writes ([`StoreDefinition::schema_version`], default 1). Every changelog
//! record of a store at a version other than 1 carries it in the
//! `kstate.schema` header (no header: version 1, so stores that never
//! change version cost nothing); local state records it in its meta column
//! family, snapshots in their manifest. Data of another version is never
//! read as this version's: local state of another version is rebuilt from
//! the changelog, and a restore converts each record of another version
//! with the definition's [`StoreDefinition::upgrade`] function or, without
//! one, refuses it ([`Error::SchemaVersion`]) unless a later record of the
//! same key in this version replaces it (as a savepoint restore writes).
//!
//! [`StoreDefinition::schema_version`]: crate::StoreDefinition::schema_version
//! [`StoreDefinition::upgrade`]: crate::StoreDefinition::upgrade
//! [`Error::SchemaVersion`]: crate::Error::SchemaVersion

use std::sync::Arc;

/// The changelog header naming a record's schema version.
pub const SCHEMA_HEADER: &str = "kstate.schema";

/// Converts a value written at schema version `from` (first argument) for
/// `key` (second) to the store's current version; an `Err` fails the restore.
pub type UpgradeFn = dyn Fn(u32, &[u8], &[u8]) -> std::result::Result<Vec<u8>, String> + Send + Sync;

/// A store's schema version and its upgrade function.
#[derive(Clone)]
pub(crate) struct Schema {
    pub(crate) version: u32,
    pub(crate) upgrade: Option<Arc<UpgradeFn>>,
    /// Bytes in front of each value that are kstate's, not the user's (a
    /// TTL store's write time): kept as they are by an upgrade.
    pub(crate) value_skip: usize,
}

impl Default for Schema {
    fn default() -> Self {
        Schema { version: 1, upgrade: None, value_skip: 0 }
    }
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema").field("version", &self.version).field("upgrade", &self.upgrade.is_some()).finish()
    }
}

/// What a restore does with one changelog record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Converted {
    /// Written as it is (this version, or a tombstone).
    Same,
    /// Written with this value.
    Value(Vec<u8>),
    /// Another version and no upgrade function: not written.
    Refused,
}

impl Schema {
    /// The header value every changelog record carries (`None`: version 1).
    pub(crate) fn header(&self) -> Option<Vec<u8>> {
        (self.version != 1).then(|| self.version.to_string().into_bytes())
    }

    /// The version a record's header value names (no header: 1; an
    /// unreadable one: `u32::MAX`, newer than any code).
    pub(crate) fn version_of(header: Option<Option<&[u8]>>) -> u32 {
        match header {
            None => 1,
            Some(v) => v.and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| s.parse().ok()).unwrap_or(u32::MAX),
        }
    }

    /// Converts a record written at version `from` to this version.
    pub(crate) fn convert(&self, from: u32, key: &[u8], value: Option<&[u8]>) -> std::result::Result<Converted, String> {
        let Some(value) = value else { return Ok(Converted::Same) };
        if from == self.version {
            return Ok(Converted::Same);
        }
        let Some(upgrade) = &self.upgrade else { return Ok(Converted::Refused) };
        let skip = self.value_skip.min(value.len());
        let mut out = value[..skip].to_vec();
        out.extend(upgrade(from, key, &value[skip..]).map_err(|e| format!("the upgrade function refused a value of version {from}: {e}"))?);
        Ok(Converted::Value(out))
    }
}

/// The version a consumed record's headers name (see [`Schema::version_of`]).
pub(crate) fn version_in(headers: Option<&rdkafka::message::BorrowedHeaders>) -> u32 {
    use rdkafka::message::Headers;
    let found = headers.and_then(|h| h.iter().filter(|h| h.key == SCHEMA_HEADER).last()).map(|h| h.value);
    Schema::version_of(found)
}

/// Keys refused by an earlier restore are stale once the store has an
/// upgrade function (it reads every version): their records are behind the
/// checkpoint, so only a full restore reads them again.
pub(crate) fn refusals_now_readable(store: &crate::store::KeyValueStore) -> crate::error::Result<Option<(String, &'static str)>> {
    if store.schema().upgrade.is_none() {
        return Ok(None);
    }
    let refused = store.engine().refused_keys()?.len();
    Ok((refused > 0).then(|| (format!("{refused} key(s) refused by an earlier restore can now be upgraded"), "schema_changed")))
}

/// A restore's view of a store's schema: converts records, and keeps the
/// keys whose latest record was refused (another version, no upgrade
/// function). Those are deleted from the data and recorded in the store's
/// meta column family with each batch, so that a restore resumed later (a
/// crash, a standby promoted) still knows them; the restore fails at its
/// end if any is left.
pub(crate) struct RestoreSchema {
    schema: Schema,
    refused: std::collections::HashMap<Vec<u8>, u32>,
    /// Changes to the recorded refused keys since the last batch.
    changes: Vec<(Vec<u8>, Option<u32>)>,
}

impl RestoreSchema {
    /// For a store whose meta records `refused` keys.
    pub(crate) fn new(schema: Schema, refused: std::collections::HashMap<Vec<u8>, u32>) -> RestoreSchema {
        RestoreSchema { schema, refused, changes: Vec::new() }
    }

    /// The value to write for a record of `version` (`None`: a delete).
    pub(crate) fn apply<'v>(&mut self, version: u32, key: &[u8], value: Option<&'v [u8]>) -> std::result::Result<Option<std::borrow::Cow<'v, [u8]>>, String> {
        let out = match self.schema.convert(version, key, value)? {
            Converted::Same => value.map(std::borrow::Cow::Borrowed),
            Converted::Value(v) => Some(std::borrow::Cow::Owned(v)),
            Converted::Refused => {
                self.refused.insert(key.to_vec(), version);
                self.changes.push((key.to_vec(), Some(version)));
                return Ok(None);
            }
        };
        if !self.refused.is_empty() && self.refused.remove(key).is_some() {
            self.changes.push((key.to_vec(), None));
        }
        Ok(out)
    }

    /// The version the store's code writes.
    pub(crate) fn version(&self) -> u32 {
        self.schema.version
    }

    /// Whether refused keys changed since the last batch.
    pub(crate) fn has_changes(&self) -> bool {
        !self.changes.is_empty()
    }

    /// No longer refuses the keys `gone` says are (dropped with their
    /// window's segment: never read again).
    pub(crate) fn forget(&mut self, gone: impl Fn(&[u8]) -> bool) {
        let dropped: Vec<Vec<u8>> = self.refused.keys().filter(|k| gone(k)).cloned().collect();
        for k in dropped {
            self.refused.remove(&k);
            self.changes.push((k, None));
        }
    }

    /// Takes the changes to record with the next batch.
    pub(crate) fn take_changes(&mut self) -> Vec<(Vec<u8>, Option<u32>)> {
        std::mem::take(&mut self.changes)
    }

    /// The error for keys still refused at the end of a restore.
    pub(crate) fn leftover(&self, store: &str, partition: i32) -> Option<crate::error::Error> {
        let (key, found) = self.refused.iter().min_by(|a, b| a.0.cmp(b.0))?;
        Some(crate::error::Error::SchemaVersion {
            store: store.to_string(),
            partition,
            found: *found,
            expected: self.schema.version,
            detail: format!(
                "{} key(s) hold values of another version and the store has no upgrade function for it, e.g. {:?}",
                self.refused.len(),
                String::from_utf8_lossy(key)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_headers_and_conversion() {
        assert_eq!(Schema::default().header(), None);
        let v2 = Schema { version: 2, upgrade: None, value_skip: 0 };
        assert_eq!(v2.header(), Some(b"2".to_vec()));
        assert_eq!(Schema::version_of(None), 1);
        assert_eq!(Schema::version_of(Some(Some(b"3"))), 3);
        assert_eq!(Schema::version_of(Some(Some(b"x"))), u32::MAX);
        assert_eq!(v2.convert(2, b"k", Some(b"v")), Ok(Converted::Same));
        assert_eq!(v2.convert(1, b"k", None), Ok(Converted::Same));
        assert_eq!(v2.convert(1, b"k", Some(b"v")), Ok(Converted::Refused));
        let up: Arc<UpgradeFn> = Arc::new(|from, _k, v| if from == 1 { Ok([b"2:", v].concat()) } else { Err(format!("from {from}")) });
        let ttl = Schema { version: 2, upgrade: Some(up), value_skip: 2 };
        assert_eq!(ttl.convert(1, b"k", Some(b"TTv")), Ok(Converted::Value(b"TT2:v".to_vec())));
        assert!(ttl.convert(3, b"k", Some(b"TTv")).unwrap_err().contains("from 3"));
    }
}
