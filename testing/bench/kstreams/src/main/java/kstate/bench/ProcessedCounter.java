package kstate.bench;

import java.util.concurrent.atomic.AtomicLong;

/** Counts processed records; remembers when the first and the target-th record were processed. */
final class ProcessedCounter {
    private final long target;
    private final AtomicLong count = new AtomicLong();
    private volatile long firstNanos;
    private volatile long targetNanos;
    /** Set after targetNanos: a waiter that sees the count reach the target could otherwise read
     *  targetNanos before the processing thread wrote it (seen once: seconds = -31046). */
    private volatile boolean reached;

    ProcessedCounter(long target) {
        this.target = target;
    }

    void processed() {
        long n = count.incrementAndGet();
        if (n == 1) firstNanos = System.nanoTime();
        if (n == target) {
            targetNanos = System.nanoTime();
            reached = true;
        }
    }

    long count() { return count.get(); }

    boolean reachedTarget() { return reached; }

    long firstNanos() { return firstNanos; }

    long targetNanos() { return targetNanos; }
}
