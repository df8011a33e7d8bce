package kstate.bench;

import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.BytesDeserializer;
import org.apache.kafka.common.serialization.BytesSerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The one topology shared by restore, tail-restore and write: source(input topic) -> processor
 * that puts each record into a persistent RocksDB key-value store (null value = delete). The
 * store is change-logged with Streams' default changelog, named `<app-id>-<store>-changelog`.
 * With an output topic (write --output-topic), the processor also forwards every record
 * unchanged to a sink on that topic (the Processor API's `.to(topic)`).
 */
final class StoreApp {
    final String bootstrap;
    final String appId;
    final String store;
    final String inputTopic;
    final int partitions;
    final String stateDir;
    final int threads;
    /** write only: the sink topic for one output record per input record; null = no sink. */
    String outputTopic;
    /** window / window-restore: hopping-window counts instead of the put topology (see WindowBench). */
    WindowBench.Spec windowed;
    /** repartition: a count re-keyed through a repartition topic (see RepartitionBench). */
    boolean repartitioned;
    /** join: the table's topic of a stream-table join (see JoinBench); null = no join. */
    String tableTopic;
    /** --in-memory: Stores.inMemoryKeyValueStore instead of RocksDB (replayed in full on every start). */
    boolean inMemory;
    /** table-restore: only the table of `tableTopic` (see TableRestoreBench), no stream. */
    boolean tableOnly;

    StoreApp(Args a) {
        bootstrap = a.str("bootstrap");
        appId = a.str("app-id");
        store = a.str("store");
        inputTopic = a.str("input-topic");
        partitions = a.integer("partitions");
        stateDir = a.str("state-dir");
        threads = a.integer("threads", 1);
        inMemory = a.bool("in-memory", false);
    }

    String changelog() {
        return appId + "-" + store + "-changelog";
    }

    /** Documented defaults, plus: no record cache (every put reaches RocksDB and the changelog),
     *  explicit at-least-once, earliest offset reset, configurable thread count. */
    Properties config() {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        return p;
    }

    Topology topology(ProcessedCounter counter) {
        if (windowed != null) return WindowBench.topology(this, counter);
        if (repartitioned) return RepartitionBench.topology(this, counter);
        if (tableOnly) return TableRestoreBench.topology(this);
        if (tableTopic != null) return JoinBench.topology(this, counter);
        Topology t = new Topology();
        t.addSource("source", new BytesDeserializer(), new ByteArrayDeserializer(), inputTopic);
        boolean forward = outputTopic != null;
        t.addProcessor("put", () -> new PutProcessor(store, counter, forward), "source");
        // Default partitioner: murmur2 of the serialized key, as kstate's Output without a partition.
        if (forward) t.addSink("out", outputTopic, new BytesSerializer(), new ByteArraySerializer(), "put");
        t.addStateStore(
            Stores.keyValueStoreBuilder(
                    inMemory ? Stores.inMemoryKeyValueStore(store) : Stores.persistentKeyValueStore(store),
                    Serdes.Bytes(), Serdes.ByteArray())
                .withCachingDisabled()
                .withLoggingEnabled(java.util.Map.of()),
            "put");
        return t;
    }

    /** put(key, value) per record, delete for a null value; with `forward`, then forwards the
     *  record unchanged (to the sink); counts processed records. */
    private static final class PutProcessor implements Processor<Bytes, byte[], Bytes, byte[]> {
        private final String storeName;
        private final ProcessedCounter counter;
        private final boolean forward;
        private ProcessorContext<Bytes, byte[]> context;
        private KeyValueStore<Bytes, byte[]> kv;

        PutProcessor(String storeName, ProcessedCounter counter, boolean forward) {
            this.storeName = storeName;
            this.counter = counter;
            this.forward = forward;
        }

        @Override
        public void init(ProcessorContext<Bytes, byte[]> context) {
            this.context = context;
            kv = context.getStateStore(storeName);
        }

        @Override
        public void process(Record<Bytes, byte[]> r) {
            if (r.value() == null) kv.delete(r.key());
            else kv.put(r.key(), r.value());
            if (forward) context.forward(r);
            counter.processed();
        }
    }
}
