package kstate.bench;

import java.time.Duration;
import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.state.WindowStore;

/**
 * `window`: hopping-window counts (groupByKey().windowedBy(TimeWindows).count()) over a
 * pre-filled input topic, timed from the first to the N-th processed record. Event time is a
 * function of the offset (event-base-ms + offset * event-step-ms; changelog records carry it, so
 * the base must be recent enough for the broker's retention), the same for kstate's contender, so both see
 * the same windows close and expire. `window-restore`: start on the same application id with an
 * empty state dir and time the restore of the window store's changelog.
 */
final class WindowBench {
    private WindowBench() {}

    /** The windowing both contenders use. */
    static final class Spec {
        final long sizeMs, advanceMs, stepMs, baseMs, cacheBytes;

        Spec(Args a) {
            sizeMs = a.lng("window-size-ms", 300_000);
            advanceMs = a.lng("advance-ms", 60_000);
            stepMs = a.lng("event-step-ms", 5);
            baseMs = a.lng("event-base-ms", 0);
            cacheBytes = a.lng("cache-bytes", 10L * 1024 * 1024);
        }
    }

    /** Event time = base + offset * step (per partition). */
    public static final class OffsetTime implements TimestampExtractor {
        static volatile long step = 5;
        static volatile long base = 0;

        @Override
        public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
            return base + record.offset() * step;
        }
    }

    static Topology topology(StoreApp app, ProcessedCounter counter) {
        Spec w = app.windowed;
        OffsetTime.step = w.stepMs;
        OffsetTime.base = w.baseMs;
        StreamsBuilder b = new StreamsBuilder();
        b.stream(app.inputTopic, Consumed.with(Serdes.Bytes(), Serdes.ByteArray()).withTimestampExtractor(new OffsetTime()))
            .peek((k, v) -> counter.processed())
            .filter((k, v) -> v != null)
            .groupByKey()
            .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(w.sizeMs), Duration.ZERO).advanceBy(Duration.ofMillis(w.advanceMs)))
            .count(Materialized.<Bytes, Long, WindowStore<Bytes, byte[]>>as(app.store).withKeySerde(Serdes.Bytes()));
        return b.build();
    }

    static Json run(Args a, boolean restore) throws Exception {
        StoreApp app = new StoreApp(a);
        app.windowed = new Spec(a);
        long records = restore ? 0 : a.lng("records");
        long timeoutSec = a.lng("timeout-sec", 1800);
        a.requireAllUsed();
        Properties cfg = app.config();
        cfg.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        cfg.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, app.windowed.cacheBytes);
        Json out = new Json().put("contender", "kafka-streams").put("mode", restore ? "window-restore" : "window")
            .put("cache_bytes", app.windowed.cacheBytes);
        if (restore) {
            RestoreTracker tracker = new RestoreTracker();
            try (StreamsRun run = new StreamsRun(app, cfg, new ProcessedCounter(Long.MAX_VALUE), tracker)) {
                run.streams.cleanUp();
                run.start();
                run.await(() -> run.isRunning() && tracker.allEnded(), timeoutSec, "RUNNING with all restores ended");
                double seconds = tracker.restoreSeconds();
                out.put("records", tracker.restored()).put("seconds", seconds)
                    .put("records_per_sec", Json.perSec(tracker.restored(), seconds))
                    .put("seconds_to_running", run.secondsToRunning());
            }
            return out;
        }
        try (Admin admin = Topics.admin(app.bootstrap)) {
            TopicDescription in = Topics.describe(admin, app.inputTopic).orElseThrow(() ->
                new IllegalStateException("input topic " + app.inputTopic + " does not exist"));
            Topics.requirePartitions(in, app.partitions);
        }
        ProcessedCounter counter = new ProcessedCounter(records);
        long closeStart;
        try (StreamsRun run = new StreamsRun(app, cfg, counter, null)) {
            run.streams.cleanUp();
            run.start();
            run.await(counter::reachedTarget, timeoutSec, records + " processed records");
            double seconds = (counter.targetNanos() - counter.firstNanos()) / 1e9;
            out.put("records", records).put("seconds", seconds).put("records_per_sec", Json.perSec(records, seconds));
            closeStart = System.nanoTime();
        }
        out.put("close_seconds", (System.nanoTime() - closeStart) / 1e9);
        try (Admin admin = Topics.admin(app.bootstrap)) {
            String changelog = app.appId + "-" + app.store + "-changelog";
            Optional<TopicDescription> cl = Topics.describe(admin, changelog);
            out.put("changelog_offset_span", cl.isPresent() ? Topics.offsetSpan(admin, cl.get()) : -1L);
        }
        return out;
    }
}
