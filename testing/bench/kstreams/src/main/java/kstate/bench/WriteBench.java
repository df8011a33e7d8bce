package kstate.bench;

import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.streams.StreamsConfig;

/**
 * `write`: process a pre-filled input topic with the put/delete topology and time the first to
 * the N-th processed record. Streams creates the changelog itself, so use a fresh --app-id.
 */
final class WriteBench {
    private WriteBench() {}

    static Json run(Args a) throws Exception {
        StoreApp app = new StoreApp(a);
        long records = a.lng("records");
        long timeoutSec = a.lng("timeout-sec", 1800);
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
        }

        Properties cfg = app.config();
        cfg.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        ProcessedCounter counter = new ProcessedCounter(records);
        Json out = new Json().put("contender", "kafka-streams").put("mode", "write");
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
        // close() flushes the producer and commits: the changelog is complete after it.
        out.put("close_seconds", (System.nanoTime() - closeStart) / 1e9);
        try (Admin admin = Topics.admin(app.bootstrap)) {
            Optional<TopicDescription> cl = Topics.describe(admin, app.changelog());
            out.put("changelog_offset_span", cl.isPresent() ? Topics.offsetSpan(admin, cl.get()) : -1L);
        }
        return out;
    }
}
