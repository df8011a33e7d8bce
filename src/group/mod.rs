//! kstate's own membership in the application's consumer group (docs/architecture.md
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
//! - [`assignor`]: the leader's pure, deterministic task assignor (its tests in `assignor/tests.rs`);
//! - [`member`]: the membership thread (join, sync, heartbeat, leave);
//! - `leader`: the leader's assignment step between JoinGroup and SyncGroup;
//! - `warmups`: a member's warmups (KIP-441) and the check that asks for their move;
//! - [`peers`]: failure detection among the instances (`peer_address`): drops a dead or silent peer at once;
//! - [`session`]: the generation and the session clock that fence a frozen member;
//! - [`offsets`]: offset commits under the member's generation, and reading committed offsets;
//! - [`failure`]: which errors mean the group moved on, which are retried and for how long.

pub(crate) mod assignor;
pub(crate) mod conn;
pub(crate) mod coordinator;
pub(crate) mod end_offsets;
pub(crate) mod failure;
mod leader;
pub(crate) mod member;
pub(crate) mod offsets;
pub(crate) mod payload;
pub(crate) mod peers;
pub(crate) mod scram;
pub(crate) mod security;
pub(crate) mod session;
mod warmups;

pub(crate) use coordinator::Brokers;
pub(crate) use end_offsets::start_offsets;
pub(crate) use failure::{CommitFailure, RetryRun};
pub(crate) use member::{GroupEvent, GroupSettings, Membership, PollSignal};
pub(crate) use session::{Generation, SessionClock};
pub(crate) use payload::HostTasks;
pub(crate) use offsets::{fetch_committed, fetch_stable, CommitError, Committer, StableOffsets};
pub(crate) use security::Security;

#[cfg(test)]
mod tests;
