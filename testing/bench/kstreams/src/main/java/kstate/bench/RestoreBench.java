package kstate.bench;

import java.io.File;
import java.util.Optional;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;

/**
 * `restore` (cleanUp() first: restore the store from scratch from its changelog) and
 * `tail-restore` (keep local state: restore only what was appended since the last checkpoint).
 */
final class RestoreBench {
    private RestoreBench() {}

    static Json run(Args a, boolean fromScratch) throws Exception {
        StoreApp app = new StoreApp(a);
        long timeoutSec = a.lng("timeout-sec", 1800);
        a.requireAllUsed();

        long changelogSpan = -1;
        String changelogPolicy = "";
        try (Admin admin = Topics.admin(app.bootstrap)) {
            if (Topics.ensure(admin, app.inputTopic, app.partitions, Topics.policy(false))) {
                Log.info("created input topic %s with %d partitions", app.inputTopic, app.partitions);
            } else {
                long inputSpan = Topics.offsetSpan(admin, Topics.describe(admin, app.inputTopic).orElseThrow());
                if (inputSpan > 0) {
                    // Unprocessed input would be put into the store, appending to the changelog.
                    Log.info("WARNING: input topic %s is not empty (%d records); records not yet committed by"
                        + " group %s will be processed and written to the changelog", app.inputTopic, inputSpan, app.appId);
                }
            }
            Optional<TopicDescription> cl = Topics.describe(admin, app.changelog());
            if (cl.isPresent()) {
                // Streams itself fails on a partition-count mismatch; say so up front.
                Topics.requirePartitions(cl.get(), app.partitions);
                changelogPolicy = Topics.cleanupPolicy(admin, app.changelog());
                changelogSpan = Topics.offsetSpan(admin, cl.get());
                Log.info("changelog %s: cleanup.policy=%s, offset span %d", app.changelog(), changelogPolicy, changelogSpan);
                if (!changelogPolicy.contains("compact")) {
                    // Streams 4.4 restores from it anyway; it does not check the policy of an existing changelog.
                    Log.info("WARNING: changelog %s has cleanup.policy=%s, not compact", app.changelog(), changelogPolicy);
                }
            } else {
                Log.info("changelog %s does not exist; Streams will create it and restore nothing", app.changelog());
            }
        }

        boolean localState = new File(app.stateDir, app.appId).isDirectory();
        RestoreTracker tracker = new RestoreTracker();
        Json out = new Json().put("contender", "kafka-streams").put("mode", fromScratch ? "restore" : "tail-restore");
        try (StreamsRun run = new StreamsRun(app, app.config(), new ProcessedCounter(Long.MAX_VALUE), tracker)) {
            if (fromScratch) run.streams.cleanUp();
            run.start();
            run.await(() -> run.isRunning() && tracker.allEnded(), timeoutSec, "RUNNING with all restores ended");
            long records = tracker.restored();
            double restoreSeconds = tracker.restoreSeconds();
            double toRunning = run.secondsToRunning();
            // restore: first onRestoreStart -> last onRestoreEnd; tail-restore: start() -> RUNNING.
            double seconds = fromScratch ? restoreSeconds : toRunning;
            out.put("records", records)
                .put("seconds", seconds)
                .put("records_per_sec", Json.perSec(records, seconds))
                .put("seconds_to_running", toRunning)
                .put("restore_seconds", restoreSeconds)
                .put("partitions_restored", tracker.partitionsRestored())
                .put("restore_batches", tracker.batches())
                .put("changelog_offset_span", changelogSpan)
                .put("changelog_cleanup_policy", changelogPolicy)
                .put("threads", app.threads);
            if (!fromScratch) out.put("local_state_found", localState);
        }
        return out;
    }
}
