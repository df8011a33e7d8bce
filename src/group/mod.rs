//! kstate's own membership in the application's consumer group (DESIGN.md
//! §3): the classic group protocol spoken with the `kafka-protocol` codec
//! over connections of kstate's own, so that the leader can run kstate's
//! state-aware assignor and tell members their standby tasks.
//!
//! - [`security`]: the librdkafka security settings, read for kstate's own connections;
//! - [`conn`]: one broker connection (TCP, TLS, SASL, version negotiation);
//! - [`scram`]: SASL SCRAM;
//! - [`coordinator`]: finding the group's coordinator;
//! - [`end_offsets`]: the changelogs' end offsets (lags of members' copies);
//! - [`payload`]: subscription and assignment metadata (versioned);
//! - [`assignor`]: the leader's pure, deterministic task assignor;
//! - [`member`]: the membership thread (join, sync, heartbeat, leave).

pub(crate) mod assignor;
pub(crate) mod conn;
pub(crate) mod coordinator;
pub(crate) mod end_offsets;
pub(crate) mod failure;
pub(crate) mod member;
pub(crate) mod offsets;
pub(crate) mod payload;
pub(crate) mod scram;
pub(crate) mod security;

pub(crate) use coordinator::Brokers;
pub(crate) use end_offsets::start_offsets;
pub(crate) use failure::{CommitFailure, RetryRun};
pub(crate) use member::{Generation, GroupEvent, GroupSettings, Membership, SessionClock};
pub(crate) use offsets::{fetch_stable, CommitError, Committer, StableOffsets};
pub(crate) use security::Security;

#[cfg(test)]
mod tests;
