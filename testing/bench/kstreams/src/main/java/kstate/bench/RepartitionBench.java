package kstate.bench;

import java.util.Properties;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * `repartition`: a count re-keyed through a repartition topic (Kafka Streams'
 * `groupBy((k, v) -> newKey).count()`, the shape of a word count with one word per record).
 * The new key is the first two bytes of the value (65,536 keys), the same for kstate's
 * contender. Timed from the first input record to the N-th count update (each input record
 * counted once after its trip through the repartition topic). The count is an `aggregate`
 * equal to `count()` whose adder counts the updates; no record cache, as the other scenarios.
 */
final class RepartitionBench {
    private RepartitionBench() {}

    /** The new key: the value's first two bytes. */
    static Bytes newKey(byte[] value) {
        byte[] k = new byte[2];
        if (value != null && value.length >= 2) {
            k[0] = value[0];
            k[1] = value[1];
        }
        return Bytes.wrap(k);
    }

    static Topology topology(StoreApp app, ProcessedCounter counter) {
        StreamsBuilder b = new StreamsBuilder();
        b.stream(app.inputTopic, Consumed.with(Serdes.Bytes(), Serdes.ByteArray()))
            .filter((k, v) -> v != null)
            .groupBy((k, v) -> newKey(v), Grouped.with("by-prefix", Serdes.Bytes(), Serdes.ByteArray()))
            .aggregate(() -> 0L, (k, v, n) -> {
                counter.processed();
                return n + 1;
            }, Materialized.<Bytes, Long, KeyValueStore<Bytes, byte[]>>as(app.store)
                .withKeySerde(Serdes.Bytes()).withValueSerde(Serdes.Long()));
        return b.build();
    }

    static Json run(Args a) throws Exception {
        StoreApp app = new StoreApp(a);
        app.repartitioned = true;
        long records = a.lng("records");
        long timeoutSec = a.lng("timeout-sec", 1800);
        a.requireAllUsed();
        Properties cfg = app.config();
        cfg.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        ProcessedCounter counter = new ProcessedCounter(records);
        Json out = new Json().put("contender", "kafka-streams").put("mode", "repartition");
        try (StreamsRun run = new StreamsRun(app, cfg, counter, null)) {
            run.streams.cleanUp();
            run.start();
            run.await(counter::reachedTarget, timeoutSec, records + " counted records");
            double seconds = (counter.targetNanos() - counter.firstNanos()) / 1e9;
            out.put("records", records).put("seconds", seconds).put("records_per_sec", Json.perSec(records, seconds));
        }
        return out;
    }
}
