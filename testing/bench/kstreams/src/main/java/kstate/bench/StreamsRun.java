package kstate.bench;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;

import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;

/** One KafkaStreams instance: start time, time to RUNNING, fatal errors, bounded waits, close. */
final class StreamsRun implements AutoCloseable {
    final KafkaStreams streams;
    private final AtomicReference<Throwable> error = new AtomicReference<>();
    private volatile long startNanos;
    private volatile long runningNanos; // first transition to RUNNING, 0 before

    StreamsRun(StoreApp app, Properties config, ProcessedCounter counter, RestoreTracker tracker) {
        streams = new KafkaStreams(app.topology(counter), config);
        if (tracker != null) streams.setGlobalStateRestoreListener(tracker);
        streams.setStateListener((now, before) -> {
            Log.info("streams state %s -> %s", before, now);
            if (now == KafkaStreams.State.RUNNING && runningNanos == 0) runningNanos = System.nanoTime();
            if (now == KafkaStreams.State.ERROR) error.compareAndSet(null, new IllegalStateException("Kafka Streams went to ERROR"));
        });
        streams.setUncaughtExceptionHandler(e -> {
            error.compareAndSet(null, e);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    }

    void start() {
        startNanos = System.nanoTime();
        streams.start();
    }

    boolean isRunning() { return runningNanos != 0 && streams.state() == KafkaStreams.State.RUNNING; }

    long startNanos() { return startNanos; }

    double secondsToRunning() { return runningNanos == 0 ? Double.NaN : (runningNanos - startNanos) / 1e9; }

    /** Polls `done` until true; throws on a Streams error or after timeoutSec. */
    void await(BooleanSupplier done, long timeoutSec, String what) throws Exception {
        long deadline = System.nanoTime() + timeoutSec * 1_000_000_000L;
        while (!done.getAsBoolean()) {
            Throwable t = error.get();
            if (t != null) throw new IllegalStateException("Kafka Streams failed while waiting for " + what + ": " + t, t);
            if (System.nanoTime() > deadline) throw new IllegalStateException("timed out after " + timeoutSec + " s waiting for " + what);
            Thread.sleep(5);
        }
    }

    @Override
    public void close() {
        long t0 = System.nanoTime();
        // Leave the group on close: otherwise the next run of the same application id waits for
        // the dead member's session timeout (45 s) before its first rebalance completes.
        streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
            .withTimeout(Duration.ofSeconds(60)));
        Log.info("streams closed in %.3f s", (System.nanoTime() - t0) / 1e9);
    }
}
