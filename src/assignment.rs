//! Where partition assignments come from.
//!
//! kstate's own group membership ([`crate::group`]) decides which tasks
//! this instance runs; the runtime turns each new assignment into task
//! events ([`AssignmentEvent`]), so the task manager does not know where
//! assignments come from.

/// The group assignment strategy of earlier versions, which joined the
/// group through librdkafka's `subscribe()`. Ignored: kstate now assigns
/// tasks with its own state-aware assignor, which always keeps partition
/// `p` of every input topic together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AssignmentStrategy {
    /// `cooperative-sticky` for one input topic, `range` for several
    /// (range keeps partition `p` of every input topic on one member, which
    /// a task of co-partitioned topics needs).
    #[default]
    Auto,
    /// Incremental cooperative rebalancing: only moved partitions pause.
    /// Does not keep co-partitioned topics together; use with one input topic.
    CooperativeSticky,
    /// Eager `range`: every rebalance revokes and reassigns all partitions,
    /// keeping partition `p` of every input topic together.
    Range,
}

/// A change of this member's assignment, whatever produced it.
#[derive(Debug, Clone)]
pub(crate) enum AssignmentEvent {
    /// These input partitions are now ours.
    Assigned(Vec<(String, i32)>),
    /// These input partitions are taken away; commit and close.
    Revoked(Vec<(String, i32)>),
    /// These input partitions were lost (e.g. session timeout): another
    /// member may own them already, so close without committing.
    Lost(Vec<(String, i32)>),
}
