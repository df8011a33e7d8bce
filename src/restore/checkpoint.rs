//! Whether a store partition's local checkpoint is usable against its
//! changelog as the brokers describe it now, or the store must be wiped and
//! restored in full (the restore acts on it, `estimate-restore` predicts with it).

use std::time::Duration;

/// Allowance for clocks of different machines when comparing the age of
/// local state with the changelog's tombstone retention (a tenth of the
/// retention, for short ones).
const CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(60);

/// What a store partition's local state says about its changelog position.
#[derive(Debug, Clone, Default)]
pub(crate) struct LocalCheckpoint {
    /// The offset of the last changelog record reflected locally.
    pub(crate) checkpoint: Option<i64>,
    /// The changelog topic id the state came from, if recorded.
    pub(crate) topic_id: Option<String>,
    /// No changelog record past the checkpoint was appended before this
    /// (ms since the epoch), if recorded.
    pub(crate) appended_after_ms: Option<i64>,
}

/// The changelog partition as the brokers describe it now.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChangelogState {
    /// Its start offset.
    pub(crate) low: i64,
    /// Its end offset.
    pub(crate) high: i64,
    /// The topic's id, if known.
    pub(crate) topic_id: Option<String>,
    /// Its `delete.retention.ms`, if known.
    pub(crate) tombstone_retention: Option<Duration>,
}

/// Why local state cannot be brought up to date by replaying the changelog
/// past its checkpoint, if it cannot (then it is wiped and restored in
/// full), with the reason's metric label. `now_ms` is when `changelog`'s
/// end offset was read. The restore acts on it; `kstate estimate-restore`
/// predicts with it.
pub(crate) fn full_restore_reason(
    local: &LocalCheckpoint,
    changelog: &ChangelogState,
    now_ms: i64,
) -> Option<(String, &'static str)> {
    if let (Some(recorded), Some(current)) = (&local.topic_id, &changelog.topic_id) {
        if recorded != current {
            return Some((format!("the changelog topic was recreated (topic id {recorded} -> {current})"), "changelog_recreated"));
        }
    }
    let c = local.checkpoint?;
    let (low, high) = (changelog.low, changelog.high);
    if c + 1 < low {
        return Some((
            format!("checkpoint {c} is before the changelog's start offset {low} (records were deleted)"),
            "checkpoint_before_changelog_start",
        ));
    }
    if c >= high {
        return Some((
            format!("checkpoint {c} is past the changelog's end offset {high} (changelog truncated or recreated)"),
            "checkpoint_after_changelog_end",
        ));
    }
    let (Some(retention), Some(after)) = (changelog.tombstone_retention, local.appended_after_ms) else { return None };
    // The broker keeps a tombstone `delete.retention.ms` after cleaning it;
    // the changelog past the checkpoint was appended after `after`. Past
    // that (less up to a minute for clock skew), a delete replayed from here
    // may be gone and its key would come back from the local state.
    let age = Duration::from_millis((now_ms - after).max(0) as u64);
    (age + CLOCK_SKEW_MARGIN.min(retention / 10) >= retention).then(|| {
        (
            format!(
                "local state is {}s behind the changelog, longer than its delete.retention.ms ({}s): \
                 tombstones past checkpoint {c} may have been compacted away",
                age.as_secs(),
                retention.as_secs()
            ),
            "checkpoint_older_than_tombstone_retention",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_restore_reasons_in_the_order_the_restore_checks_them() {
        let changelog = ChangelogState { low: 10, high: 100, topic_id: Some("b".into()), tombstone_retention: Some(Duration::from_secs(3600)) };
        let local = |checkpoint: Option<i64>, topic_id: Option<&str>, after: Option<i64>| LocalCheckpoint {
            checkpoint,
            topic_id: topic_id.map(String::from),
            appended_after_ms: after,
        };
        let kind = |l: &LocalCheckpoint, now: i64| full_restore_reason(l, &changelog, now).map(|(_, kind)| kind);
        let now = 10_000_000;
        assert_eq!(kind(&local(Some(50), Some("b"), Some(now)), now), None, "a tail replay");
        assert_eq!(kind(&local(None, None, None), now), None, "nothing local: a restore from the start anyway");
        assert_eq!(kind(&local(Some(50), Some("a"), Some(now)), now), Some("changelog_recreated"));
        assert_eq!(kind(&local(Some(50), None, Some(now)), now), None, "no recorded id: not compared");
        assert_eq!(kind(&local(Some(8), Some("b"), Some(now)), now), Some("checkpoint_before_changelog_start"));
        assert_eq!(kind(&local(Some(9), Some("b"), Some(now)), now), None, "the record before the start");
        assert_eq!(kind(&local(Some(100), Some("b"), Some(now)), now), Some("checkpoint_after_changelog_end"));
        let hour = 3_600_000;
        assert_eq!(kind(&local(Some(50), Some("b"), Some(now - hour)), now), Some("checkpoint_older_than_tombstone_retention"));
        assert_eq!(kind(&local(Some(50), Some("b"), Some(now - hour + 120_000)), now), None, "within the retention less the skew margin");
    }
}
