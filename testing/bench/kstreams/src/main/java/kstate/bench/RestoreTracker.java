package kstate.bench;

import java.util.HashSet;
import java.util.Set;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.streams.processor.StateRestoreListener;

/** Global restore listener: first onRestoreStart, last onRestoreEnd, total records restored. */
final class RestoreTracker implements StateRestoreListener {
    private final Set<TopicPartition> started = new HashSet<>();
    private final Set<TopicPartition> ended = new HashSet<>();
    private long firstStartNanos;
    private long lastEndNanos;
    private long restored;
    private long batches;

    @Override
    public synchronized void onRestoreStart(TopicPartition tp, String store, long startOffset, long endOffset) {
        if (started.isEmpty()) firstStartNanos = System.nanoTime();
        started.add(tp);
        Log.info("restore start %s store=%s offsets [%d, %d)", tp, store, startOffset, endOffset);
    }

    @Override
    public synchronized void onBatchRestored(TopicPartition tp, String store, long batchEndOffset, long numRestored) {
        batches++;
    }

    @Override
    public synchronized void onRestoreEnd(TopicPartition tp, String store, long totalRestored) {
        ended.add(tp);
        restored += totalRestored;
        lastEndNanos = System.nanoTime();
        Log.info("restore end   %s store=%s restored=%d", tp, store, totalRestored);
    }

    @Override
    public synchronized void onRestoreSuspended(TopicPartition tp, String store, long totalRestored) {
        // Only on a rebalance that takes the task away; counted so the totals stay honest.
        ended.add(tp);
        restored += totalRestored;
        lastEndNanos = System.nanoTime();
        Log.info("restore SUSPENDED %s store=%s restored=%d", tp, store, totalRestored);
    }

    /** Every partition whose restore started has ended (vacuously true if none started). */
    synchronized boolean allEnded() { return ended.containsAll(started); }

    synchronized int partitionsRestored() { return ended.size(); }

    synchronized long restored() { return restored; }

    synchronized long batches() { return batches; }

    /** Seconds from the first onRestoreStart to the last onRestoreEnd (0 if nothing was restored). */
    synchronized double restoreSeconds() {
        return started.isEmpty() ? 0.0 : (lastEndNanos - firstStartNanos) / 1e9;
    }
}
