//! What the processor sees besides the record: the stores of the record's
//! partition, the output producer, the task's clocks, timers and
//! punctuations.

use std::collections::HashMap;
use std::time::Duration;

use crate::codec::Codec;
use crate::config::AppConfig;
use crate::record::Headers;
use crate::error::{Error, Result};
use crate::global::{GlobalTable, GlobalTables};
use crate::kafka::OutputSink;
use crate::output::Output;
use crate::store::closing::Closing;
use crate::store::{KeyValueStore, SessionStore, TypedStore, WindowStore};
use crate::windows::Shape;
use crate::time::{PunctuationId, TimeDomain};
use crate::timers::TaskTime;

/// What the processor can reach while handling a record, a timer or a
/// punctuation: the stores of its task's partition, kstate's producer for
/// output records, and the task's time.
pub struct ProcessorContext<'t> {
    partition: i32,
    /// The partition's stores, in definition order (the time store last).
    stores: &'t mut [KeyValueStore],
    store_index: &'t HashMap<String, usize>,
    outputs: &'t OutputSink,
    /// The record's (extracted) timestamp, or the time of the timer or
    /// punctuation being run: the outputs' default.
    timestamp: Option<i64>,
    time: &'t mut TaskTime,
    /// Where the time store is in `stores` (timers enabled).
    time_store: Option<usize>,
    /// Whether the processor takes timer and punctuation callbacks (a
    /// [`Processor`](crate::Processor), not a closure).
    callbacks: bool,
    globals: Option<&'t GlobalTables>,
    /// The application's settings (repartition topics, the partitioner).
    config: &'t AppConfig,
    /// The headers of the record being processed (none for callbacks).
    headers: Headers<'t>,
}

/// Sends output records while stores are borrowed (see
/// [`ProcessorContext::split`]); the same as [`ProcessorContext::send`].
pub struct Outputs<'c> {
    sink: &'c OutputSink,
    timestamp: Option<i64>,
}

impl Outputs<'_> {
    /// Sends an output record, as [`ProcessorContext::send`] does.
    pub fn send(&self, output: Output<'_>) -> Result<()> {
        self.sink.send(&output, self.timestamp)
    }
}

/// What a [`ProcessorContext`] is made of (built by the runtime).
pub(crate) struct ContextParts<'t> {
    pub(crate) partition: i32,
    pub(crate) stores: &'t mut [KeyValueStore],
    pub(crate) store_index: &'t HashMap<String, usize>,
    pub(crate) outputs: &'t OutputSink,
    pub(crate) timestamp: Option<i64>,
    pub(crate) time: &'t mut TaskTime,
    pub(crate) time_store: Option<usize>,
    pub(crate) callbacks: bool,
    pub(crate) globals: Option<&'t GlobalTables>,
    pub(crate) config: &'t AppConfig,
    pub(crate) headers: Headers<'t>,
}

impl<'t> ProcessorContext<'t> {
    pub(crate) fn new(parts: ContextParts<'t>) -> Self {
        let ContextParts { partition, stores, store_index, outputs, timestamp, time, time_store, callbacks, globals, config, headers } = parts;
        ProcessorContext { partition, stores, store_index, outputs, timestamp, time, time_store, callbacks, globals, config, headers }
    }

    /// The partition being processed.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The key-value store named `name` for this partition, as bytes
    /// (keys and values are `&[u8]`). For keys and values through codecs,
    /// use [`typed_store`](Self::typed_store): the same store, typed. A
    /// window or session store is [`Error::InvalidUse`] here: its keys have
    /// a layout of their own (use the typed
    /// [`window_store`](Self::window_store) or
    /// [`session_store`](Self::session_store)).
    pub fn store(&mut self, name: &str) -> Result<&mut KeyValueStore> {
        let store = self.any_store(name)?;
        if let Some(shape) = store.shape {
            return Err(Error::InvalidUse(format!(
                "store `{name}` is a {} store: use ProcessorContext::{}_store",
                shape.kind(),
                shape.kind()
            )));
        }
        Ok(store)
    }

    fn store_at(&self, name: &str) -> Result<usize> {
        self.store_index.get(name).copied().ok_or_else(|| Error::UnknownStore(name.to_string()))
    }

    fn any_store(&mut self, name: &str) -> Result<&mut KeyValueStore> {
        let i = self.store_at(name)?;
        Ok(&mut self.stores[i])
    }

    /// The window store named `name` (defined with
    /// [`StoreDefinition::window`](crate::StoreDefinition::window)) with
    /// key codec `K` and value codec `V`; its writes into windows closed at
    /// the task's stream time are dropped as late.
    pub fn window_store<K: Codec, V: Codec>(&mut self, name: &str) -> Result<WindowStore<'_, K, V>> {
        let stream_time = self.time.stream_time();
        let i = self.store_at(name)?;
        let Some(Shape::Window(windows)) = self.stores[i].shape else {
            return Err(Error::InvalidUse(format!("store `{name}` is not a window store (StoreDefinition::window)")));
        };
        let (store, closing) = self.with_closing(i)?;
        Ok(WindowStore::new(store, windows, stream_time).closing(closing))
    }

    /// The session store named `name` (defined with
    /// [`StoreDefinition::session`](crate::StoreDefinition::session)) with
    /// key codec `K` and value codec `V`.
    pub fn session_store<K: Codec, V: Codec>(&mut self, name: &str) -> Result<SessionStore<'_, K, V>> {
        let stream_time = self.time.stream_time();
        let i = self.store_at(name)?;
        let Some(Shape::Session(sessions)) = self.stores[i].shape else {
            return Err(Error::InvalidUse(format!("store `{name}` is not a session store (StoreDefinition::session)")));
        };
        let (store, closing) = self.with_closing(i)?;
        Ok(SessionStore::new(store, sessions, stream_time).closing(closing))
    }

    /// Store `i`, and for a store that emits final results, where its new
    /// windows register their closing: kstate's own stream-time timers in
    /// the time store (the last store, so split off after `i`).
    fn with_closing(&mut self, i: usize) -> Result<(&mut KeyValueStore, Option<Closing<'_>>)> {
        if !self.stores[i].final_results {
            return Ok((&mut self.stores[i], None));
        }
        let Some(t) = self.time_store.filter(|_| self.callbacks) else {
            return Err(Error::InvalidUse(format!("store `{}`'s final results need App::run_processor", self.stores[i].name())));
        };
        let (head, tail) = self.stores.split_at_mut(t);
        Ok((&mut head[i], Some(Closing { timers: &mut *self.time, time_store: &mut tail[0] })))
    }

    /// Several stores at once, and the output records, in one scope: read
    /// one store while writing another and send outputs meanwhile, without
    /// fetching stores again per call. The stores come in the order of
    /// `names`, as byte stores ([`KeyValueStore::typed`] adds codecs); a
    /// name given twice, a window or session store or an unknown store is
    /// an error.
    ///
    /// ```no_run
    /// # fn f(ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> kstate::Result<()> {
    /// use kstate::codec::{U64Be, Utf8};
    /// let ([clicks, totals], out) = ctx.split(["clicks", "totals"])?;
    /// let (mut clicks, mut totals) = (clicks.typed::<Utf8, U64Be>(), totals.typed::<Utf8, U64Be>());
    /// let user = String::from_utf8_lossy(rec.key.unwrap_or_default()).into_owned();
    /// let n = clicks.get(&user)?.unwrap_or(0) + 1;
    /// clicks.put(&user, &n)?;
    /// totals.put(&"all".to_string(), &(totals.get(&"all".to_string())?.unwrap_or(0) + 1))?;
    /// out.send(kstate::Output::to("click-counts").key(user.as_bytes()).value(&n.to_be_bytes()))?;
    /// # Ok(()) }
    /// ```
    pub fn split<const N: usize>(&mut self, names: [&str; N]) -> Result<([&mut KeyValueStore; N], Outputs<'_>)> {
        let mut indices = [0usize; N];
        for (i, name) in names.iter().enumerate() {
            let index = *self.store_index.get(*name).ok_or_else(|| Error::UnknownStore(name.to_string()))?;
            if let Some(shape) = self.stores[index].shape {
                return Err(Error::InvalidUse(format!(
                    "store `{name}` is a {} store: use ProcessorContext::{}_store",
                    shape.kind(),
                    shape.kind()
                )));
            }
            indices[i] = index;
        }
        let outputs = Outputs { sink: self.outputs, timestamp: self.timestamp };
        let stores = self
            .stores
            .get_disjoint_mut(indices)
            .map_err(|_| Error::InvalidUse(format!("ProcessorContext::split names a store twice: {names:?}")))?;
        Ok((stores, outputs))
    }

    /// The global table named `name` (see
    /// [`AppBuilder::global_table`](crate::AppBuilder::global_table)):
    /// read-only, the same on every task and instance as far as each has
    /// read its topic. An unknown name is [`Error::UnknownStore`].
    pub fn global_table(&self, name: &str) -> Result<GlobalTable<'_>> {
        self.globals.and_then(|g| g.get(name)).map(GlobalTable::new).ok_or_else(|| Error::UnknownStore(name.to_string()))
    }

    /// The store named `name` with key codec `K` and value codec `V`.
    pub fn typed_store<K: Codec, V: Codec>(&mut self, name: &str) -> Result<TypedStore<'_, K, V>> {
        Ok(TypedStore::new(self.store(name)?))
    }

    /// Sends an output record (see [`Output`]). It is part of the commit
    /// of the record being processed: input offsets are committed only once
    /// every output sent before the commit is acknowledged, so a crash may
    /// send an output again but never loses one (at-least-once). Its
    /// timestamp defaults to [`timestamp`](Self::timestamp).
    ///
    /// Fails with [`Error::OutputDelivery`] if the producer refuses the
    /// record at once (larger than `message.max.bytes`, a partition that
    /// does not exist, its queue full for `commit_timeout`); a record the
    /// brokers refuse later (unknown topic, not authorised) makes the next
    /// commit fail with the same error, which ends `run`.
    pub fn send(&mut self, output: Output<'_>) -> Result<()> {
        self.outputs.send(&output, self.timestamp)
    }

    /// Re-keys a record: sends `key` and `value` to the repartition topic
    /// `name` ([`AppBuilder::repartition`](crate::AppBuilder::repartition)),
    /// to the partition the application's
    /// [`Partitioner`](crate::Partitioner) gives `key`, with the current
    /// record's timestamp and headers. The task owning that partition gets
    /// it back as an input record (its topic is the repartition topic), so
    /// state keyed by `key` lives in one task. Sent like an output: in the
    /// commit of the record that caused it (its transaction under
    /// exactly-once). An undeclared name is [`Error::InvalidUse`].
    ///
    /// ```no_run
    /// # fn f(ctx: &mut kstate::ProcessorContext<'_>, record: &kstate::Record<'_>) -> kstate::Result<()> {
    /// // Word count from a topic of lines: each word to the task that counts it.
    /// if record.topic == "lines" {
    ///     for word in record.value_str().unwrap_or_default().split_whitespace() {
    ///         ctx.repartition("words", word.as_bytes(), b"")?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn repartition(&mut self, name: &str, key: &[u8], value: &[u8]) -> Result<()> {
        let Some(r) = self.config.repartitions.iter().find(|r| r.name == name) else {
            let declared: Vec<&str> = self.config.repartitions.iter().map(|r| r.name.as_str()).collect();
            return Err(Error::InvalidUse(format!("repartition `{name}` is not declared (AppBuilder::repartition); declared: {declared:?}")));
        };
        let partitions = self.config.published.partitions();
        let partition = self.config.partitioner.checked(key, partitions).map_err(|why| Error::InvalidUse(format!("{why} for a record to repartition `{name}`")))?;
        let mut output = Output::to(&r.topic).key(key).value(value).partition(partition);
        output.headers = self.headers.iter().collect();
        self.outputs.send(&output, self.timestamp)
    }

    /// The timestamp of what is being processed: the record's (as the
    /// timestamp extractor read it), or the time of the timer or
    /// punctuation being run.
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    /// The task's stream time: the largest record timestamp it has
    /// processed (committed with the task when timers are enabled, so it
    /// survives restarts and failovers); `None` before its first record.
    pub fn stream_time(&self) -> Option<i64> {
        self.time.stream_time()
    }

    /// The wall clock, in milliseconds since the Unix epoch.
    pub fn wall_clock_time(&self) -> i64 {
        crate::time::wall_clock_ms()
    }

    fn time_store(&self, what: &str) -> Result<usize> {
        if !self.callbacks {
            return Err(Error::InvalidUse(format!(
                "{what} needs a Processor (App::run_processor) to call back; a closure processor has none"
            )));
        }
        match self.time_store {
            Some(i) => Ok(i),
            None => Err(Error::InvalidUse(format!("{what} needs timers enabled: AppBuilder::timers(true), or a window or session store"))),
        }
    }

    /// Registers a timer for `key` at `timestamp` on `domain`'s clock: once
    /// the clock reaches `timestamp`, the timer is removed and
    /// [`Processor::on_timer`](crate::Processor::on_timer) runs, in
    /// timestamp order (then key order). A timer is state: it is written in
    /// the task's next commit and survives crashes, restarts and
    /// failovers; the removal and the callback's writes land in the same
    /// commit. Registering the same key and time again is one timer; a
    /// time already reached fires right after the current callback.
    /// Needs timers on (a window or session store turns them on, else
    /// [`AppBuilder::timers`](crate::AppBuilder::timers)) and
    /// [`App::run_processor`](crate::App::run_processor), else
    /// [`Error::InvalidUse`]; so are keys starting with
    /// `b"\xffkstate.close\x00"` (kstate's own, for final results). Nothing
    /// checks that `key` belongs to this partition: the timer belongs to the
    /// task.
    pub fn register_timer(&mut self, domain: TimeDomain, key: &[u8], timestamp: i64) -> Result<()> {
        let i = self.time_store("a timer")?;
        not_reserved(key)?;
        self.time.register_timer(&mut self.stores[i], domain, key, timestamp)
    }

    /// Deletes the timer for `key` at `timestamp` on `domain`'s clock, if
    /// there is one.
    pub fn delete_timer(&mut self, domain: TimeDomain, key: &[u8], timestamp: i64) -> Result<()> {
        let i = self.time_store("a timer")?;
        not_reserved(key)?;
        self.time.delete_timer(&mut self.stores[i], domain, key, timestamp)
    }

    /// Schedules [`Processor::punctuate`](crate::Processor::punctuate)
    /// every `interval` of `domain`'s clock for this task (Kafka Streams'
    /// `schedule`): on stream time first as soon as the task has a stream
    /// time (its first record, or right away when its committed stream
    /// time came back with it), then whenever stream time reaches the next
    /// multiple of `interval` (a jump over several intervals runs it once); on the wall clock first
    /// `interval` from now, then every `interval`, idle or not. Schedules
    /// are not state: schedule them in
    /// [`Processor::init`](crate::Processor::init), which runs whenever
    /// the task starts. An interval under 1 ms is [`Error::InvalidUse`].
    pub fn schedule(&mut self, domain: TimeDomain, interval: Duration) -> Result<PunctuationId> {
        if !self.callbacks {
            return Err(Error::InvalidUse(
                "a punctuation needs a Processor (App::run_processor) to call back; a closure processor has none".into(),
            ));
        }
        self.time.schedule(domain, interval, crate::time::wall_clock_ms())
    }

    /// Cancels a punctuation; `false` if it was not scheduled.
    pub fn cancel(&mut self, id: PunctuationId) -> bool {
        self.time.cancel(id)
    }
}

/// Refuses a timer key of kstate's own (final results, `store/closing.rs`).
fn not_reserved(key: &[u8]) -> Result<()> {
    if crate::store::closing::is_reserved(key) {
        return Err(Error::InvalidUse("timer keys starting with b\"\\xffkstate.close\\x00\" are kstate's own (final results)".into()));
    }
    Ok(())
}
