//! The [`Processor`] trait: one value per task, with callbacks for the
//! task's start, its records, its timers and its punctuations.

use crate::context::ProcessorContext;
use crate::record::Record;
use crate::table::TableUpdate;
use crate::time::{Punctuation, Timer};
use crate::windows::ClosedWindow;

/// The error a processor callback returns (any error type converts into it with `?`).
pub type ProcessorError = Box<dyn std::error::Error + Send + Sync>;

/// Processes one task's records (Kafka Streams' `Processor`). The factory
/// given to [`App::run_processor`](crate::App::run_processor) builds one
/// value per task when the task starts running (after its stores are
/// restored), so per-task fields need no map keyed by partition; the value
/// is dropped when the task closes (revoked, lost, re-initialised).
///
/// Every callback sees the same [`ProcessorContext`]: the task's stores,
/// output records, its timers and punctuations. Their writes and outputs
/// belong to the commit that follows, in the same transaction under
/// exactly-once. An error from `process` goes to the processing exception
/// handler; an error from any other callback stops `run` with
/// [`Error::Callback`](crate::Error::Callback).
pub trait Processor {
    /// Called once when the task starts running, before its first record:
    /// schedule punctuations here (they are not kept across restarts;
    /// timers are).
    fn init(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
        let _ = ctx;
        Ok(())
    }

    /// Processes one input record of the task.
    fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError>;

    /// A timer registered with [`ProcessorContext::register_timer`] is due.
    /// It was removed before this call, in the same commit as this call's
    /// writes. The default fails: a processor that registers timers must
    /// handle them.
    fn on_timer(&mut self, ctx: &mut ProcessorContext<'_>, timer: &Timer) -> Result<(), ProcessorError> {
        let _ = ctx;
        Err(format!("timer {timer:?} fired but the processor does not implement Processor::on_timer").into())
    }

    /// A window or session of a store that emits final results
    /// ([`StoreDefinition::emit_final_results`](crate::StoreDefinition::emit_final_results))
    /// closed: called once per window that holds a value when stream time
    /// reaches its end plus grace (a session: passes its last record's time
    /// plus the gap plus grace, when no record can extend it any more), with
    /// its final value (Kafka Streams' `suppress(untilWindowCloses)`).
    /// Later records for it are late and dropped by the store, so the value
    /// cannot change afterwards. It runs before the record that moved
    /// stream time there, with the closing time as the context's timestamp; its writes and outputs land in the
    /// same commit as the window's closing (one transaction under
    /// exactly-once), so a crash before that commit calls it again after
    /// the restore. The default fails: a processor whose stores emit final
    /// results must handle them.
    fn on_window_close(&mut self, ctx: &mut ProcessorContext<'_>, closed: &ClosedWindow<'_>) -> Result<(), ProcessorError> {
        let _ = ctx;
        Err(format!(
            "store `{}` emits final results but the processor does not implement Processor::on_window_close",
            closed.store()
        )
        .into())
    }

    /// A record of a source table's topic ([`AppBuilder::table`](crate::AppBuilder::table))
    /// changed the table: the table's store has the new value already.
    /// The default does nothing (a processor that only reads the table
    /// needs no code). Errors go to the processing exception handler, as
    /// `process`'s do.
    fn on_table_update(&mut self, ctx: &mut ProcessorContext<'_>, update: &TableUpdate<'_>) -> Result<(), ProcessorError> {
        let _ = (ctx, update);
        Ok(())
    }

    /// A punctuation scheduled with [`ProcessorContext::schedule`] is due.
    fn punctuate(&mut self, ctx: &mut ProcessorContext<'_>, punctuation: &Punctuation) -> Result<(), ProcessorError> {
        let _ = (ctx, punctuation);
        Ok(())
    }

    /// Called once when the task closes here after running: revoked by a
    /// rebalance, or the application shutting down cleanly. It runs before
    /// the task's final commit, so what it writes and sends (a buffer
    /// flushed, say) is committed with it. Not called for a task lost
    /// without a commit (session expired, fenced) or re-initialised after
    /// a failure: nothing written then would be committed. An error is
    /// logged; the task closes anyway.
    fn close(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
        let _ = ctx;
        Ok(())
    }
}
