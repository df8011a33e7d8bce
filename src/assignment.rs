//! Where partition assignments come from.
//!
//! Today kstate joins the application's consumer group through librdkafka's
//! own `subscribe()` and maps its rebalance callbacks to task events
//! ([`AssignmentEvent`]). DESIGN.md §3 plans a state-aware assignor (own
//! group protocol, standbys, warmups) that will produce the same events, so
//! the task manager does not change when it lands.

/// The group assignment strategy used with librdkafka's `subscribe()`.
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

impl AssignmentStrategy {
    /// The librdkafka `partition.assignment.strategy` for `input_topics` topics.
    pub(crate) fn librdkafka_name(self, input_topics: usize) -> &'static str {
        match self {
            AssignmentStrategy::Auto if input_topics <= 1 => "cooperative-sticky",
            AssignmentStrategy::Auto | AssignmentStrategy::Range => "range",
            AssignmentStrategy::CooperativeSticky => "cooperative-sticky",
        }
    }
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
