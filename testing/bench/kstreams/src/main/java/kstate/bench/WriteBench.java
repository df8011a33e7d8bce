package kstate.bench;

import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.streams.StreamsConfig;

/**
 * `write`: process a pre-filled input topic with the put/delete topology and time the first to
 * the N-th processed record. Streams creates the changelog itself, so use a fresh --app-id.
 * `--output-topic T` also sends every input record unchanged to T (which must exist with the
 * input's partition count: the broker does not create topics); `--eos` runs with
 * processing.guarantee=exactly_once_v2 instead of at_least_once.
 */
final class WriteBench {
    private WriteBench() {}

    static Json run(Args a) throws Exception {
        StoreApp app = new StoreApp(a);
        long records = a.lng("records");
        long timeoutSec = a.lng("timeout-sec", 1800);
        app.outputTopic = a.str("output-topic", null);
        boolean eos = a.bool("eos", false);
        a.requireAllUsed();

        try (Admin admin = Topics.admin(app.bootstrap)) {
            TopicDescription in = Topics.describe(admin, app.inputTopic).orElseThrow(() ->
                new IllegalStateException("input topic " + app.inputTopic + " does not exist; run generate --compact false first"));
            Topics.requirePartitions(in, app.partitions);
            long span = Topics.offsetSpan(admin, in);
            if (span < records) {
                throw new IllegalStateException("input topic " + app.inputTopic + " holds " + span + " < " + records + " records");
            }
            if (Topics.describe(admin, app.changelog()).isPresent()) {
                throw new IllegalStateException("changelog " + app.changelog() + " already exists; use a fresh --app-id per write run");
            }
            if (app.outputTopic != null) {
                TopicDescription out = Topics.describe(admin, app.outputTopic).orElseThrow(() ->
                    new IllegalStateException("output topic " + app.outputTopic + " does not exist; create it first"));
                Topics.requirePartitions(out, app.partitions);
            }
        }

        Properties cfg = app.config();
        cfg.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        // exactly_once_v2: one transactional producer per stream thread; every commit (each
        // commit.interval.ms, set explicitly to the same 100 ms as at-least-once) is a transaction.
        if (eos) cfg.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        ProcessedCounter counter = new ProcessedCounter(records);
        Json out = new Json().put("contender", "kafka-streams").put("mode", "write")
            .put("processing_guarantee", cfg.getProperty(StreamsConfig.PROCESSING_GUARANTEE_CONFIG))
            .put("output_topic", app.outputTopic);
        long closeStart;
        try (StreamsRun run = new StreamsRun(app, cfg, counter, null)) {
            run.streams.cleanUp(); // fresh app-id: nothing to restore, no stale local state
            run.start();
            run.await(counter::reachedTarget, timeoutSec, records + " processed records");
            double seconds = (counter.targetNanos() - counter.firstNanos()) / 1e9;
            out.put("records", records)
                .put("seconds", seconds)
                .put("records_per_sec", Json.perSec(records, seconds))
                .put("seconds_to_running", run.secondsToRunning())
                .put("seconds_to_first_record", (counter.firstNanos() - run.startNanos()) / 1e9)
                .put("threads", app.threads);
            closeStart = System.nanoTime();
        }
        // close() flushes the producer and commits: the changelog is complete after it. Under
        // exactly-once every committed transaction also left one marker per partition it wrote,
        // so the span is larger than N there.
        out.put("close_seconds", (System.nanoTime() - closeStart) / 1e9);
        try (Admin admin = Topics.admin(app.bootstrap)) {
            Optional<TopicDescription> cl = Topics.describe(admin, app.changelog());
            out.put("changelog_offset_span", cl.isPresent() ? Topics.offsetSpan(admin, cl.get()) : -1L);
        }
        return out;
    }
}
