package kstate.bench;

import java.util.HashMap;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * `table-restore`: a source table's restore. The topology is `builder.table(T)` alone, with
 * `topology.optimization=all`, so the topic itself is the store's changelog (no -changelog
 * topic). The group's offsets are first set to T's end, so that Streams restores the whole
 * topic (a source table restores up to the committed offset) and processes nothing; the state
 * dir is cleaned first. Timed as `restore`: first onRestoreStart to last onRestoreEnd.
 */
final class TableRestoreBench {
    private TableRestoreBench() {}

    static Topology topology(StoreApp app) {
        StreamsBuilder b = new StreamsBuilder();
        b.table(app.tableTopic, Consumed.with(Serdes.Bytes(), Serdes.ByteArray()),
            Materialized.<Bytes, byte[], KeyValueStore<Bytes, byte[]>>as(app.store)
                .withKeySerde(Serdes.Bytes()).withValueSerde(Serdes.ByteArray()).withCachingDisabled());
        Properties p = new Properties();
        p.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
        return b.build(p);
    }

    static Json run(Args a) throws Exception {
        StoreApp app = new StoreApp(a);
        app.tableTopic = a.str("table-topic");
        app.tableOnly = true;
        long timeoutSec = a.lng("timeout-sec", 1800);
        a.requireAllUsed();
        try (Admin admin = Topics.admin(app.bootstrap)) {
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            for (TopicPartition tp : Topics.partitions(Topics.describe(admin, app.tableTopic).orElseThrow())) {
                latest.put(tp, OffsetSpec.latest());
            }
            Map<TopicPartition, OffsetAndMetadata> ends = new HashMap<>();
            for (Map.Entry<TopicPartition, ListOffsetsResultInfo> e : admin.listOffsets(latest).all().get().entrySet()) {
                ends.put(e.getKey(), new OffsetAndMetadata(e.getValue().offset()));
            }
            admin.alterConsumerGroupOffsets(app.appId, ends).all().get();
        }
        Properties cfg = app.config();
        cfg.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
        RestoreTracker tracker = new RestoreTracker();
        Json out = new Json().put("contender", "kafka-streams").put("mode", "table-restore");
        try (StreamsRun run = new StreamsRun(app, cfg, new ProcessedCounter(Long.MAX_VALUE), tracker)) {
            run.streams.cleanUp();
            run.start();
            run.await(() -> run.isRunning() && tracker.allEnded(), timeoutSec, "RUNNING with all restores ended");
            long records = tracker.restored();
            double seconds = tracker.restoreSeconds();
            out.put("records", records)
                .put("seconds", seconds)
                .put("records_per_sec", Json.perSec(records, seconds))
                .put("seconds_to_running", run.secondsToRunning())
                .put("partitions_restored", tracker.partitionsRestored())
                .put("restore_batches", tracker.batches());
        }
        return out;
    }
}
