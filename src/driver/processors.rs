//! The test driver's processors: one per task built by the factory when
//! the task first needs it (as the runtime's `PerTask`), or one closure
//! for every task (as its `Closure`, without callbacks).

use std::collections::HashMap;

use crate::processor::Processor;

type Factory = Box<dyn FnMut(i32) -> Box<dyn Processor>>;

pub(super) enum Processors {
    PerTask { factory: Factory, live: HashMap<i32, Box<dyn Processor>> },
    Closure(Box<dyn Processor>),
}

impl Processors {
    pub(super) fn per_task(factory: Factory) -> Self {
        Processors::PerTask { factory, live: HashMap::new() }
    }

    pub(super) fn closure(closure: Box<dyn Processor>) -> Self {
        Processors::Closure(closure)
    }

    /// Whether the processors take timer and punctuation callbacks.
    pub(super) fn callbacks(&self) -> bool {
        matches!(self, Processors::PerTask { .. })
    }

    /// Task `partition`'s processor, built if it has none; `true` if it
    /// was just built (`init` is due).
    pub(super) fn get(&mut self, partition: i32) -> (&mut dyn Processor, bool) {
        match self {
            Processors::PerTask { factory, live } => {
                let fresh = !live.contains_key(&partition);
                let processor = live.entry(partition).or_insert_with(|| factory(partition));
                (processor.as_mut(), fresh)
            }
            Processors::Closure(closure) => (closure.as_mut(), false),
        }
    }

    /// Takes out task `partition`'s processor, to close it.
    pub(super) fn take(&mut self, partition: i32) -> Option<Box<dyn Processor>> {
        match self {
            Processors::PerTask { live, .. } => live.remove(&partition),
            Processors::Closure(_) => None,
        }
    }

    /// Drops every task's processor without closing it (a crash).
    pub(super) fn drop_all(&mut self) {
        if let Processors::PerTask { live, .. } = self {
            live.clear();
        }
    }
}
