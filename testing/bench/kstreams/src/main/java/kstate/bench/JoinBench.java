package kstate.bench;

import java.util.Properties;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * `join`: a stream-table left join (`stream.leftJoin(table)`), the table read from a compacted
 * topic (`builder.table`, its source topic as its changelog: no -changelog topic), no output
 * topic. Timed from the first to the N-th joined stream record (both topics are filled
 * before the start, the table first, so the table is loaded by the time the stream's records
 * come in timestamp order). No record cache, as the other scenarios.
 */
final class JoinBench {
    private JoinBench() {}

    static Topology topology(StoreApp app, ProcessedCounter counter) {
        StreamsBuilder b = new StreamsBuilder();
        KTable<Bytes, byte[]> table = b.table(app.tableTopic, Consumed.with(Serdes.Bytes(), Serdes.ByteArray()),
            Materialized.<Bytes, byte[], KeyValueStore<Bytes, byte[]>>as(app.store)
                .withKeySerde(Serdes.Bytes()).withValueSerde(Serdes.ByteArray()).withCachingDisabled());
        b.stream(app.inputTopic, Consumed.with(Serdes.Bytes(), Serdes.ByteArray()))
            .leftJoin(table, (s, t) -> t == null ? 0 : t.length)
            .foreach((k, v) -> counter.processed());
        return b.build();
    }

    static Json run(Args a) throws Exception {
        StoreApp app = new StoreApp(a);
        app.tableTopic = a.str("table-topic");
        long records = a.lng("records");
        long timeoutSec = a.lng("timeout-sec", 1800);
        a.requireAllUsed();
        Properties cfg = app.config();
        cfg.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        cfg.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
        ProcessedCounter counter = new ProcessedCounter(records);
        Json out = new Json().put("contender", "kafka-streams").put("mode", "join");
        try (StreamsRun run = new StreamsRun(app, cfg, counter, null)) {
            run.streams.cleanUp();
            run.start();
            run.await(counter::reachedTarget, timeoutSec, records + " joined records");
            double seconds = (counter.targetNanos() - counter.firstNanos()) / 1e9;
            out.put("records", records).put("seconds", seconds).put("records_per_sec", Json.perSec(records, seconds));
        }
        return out;
    }
}
