package kstate.bench;

import java.io.InputStream;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.BytesDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.LagInfo;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.TaskMetadata;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * `failover`: one Kafka Streams instance of the failover scenario of testing/bench/run.py, the
 * counterpart of kstate's examples/failover_bench.rs (same lines on stdout, same meaning). Every
 * input record is put into the store `s` (delete on a null value). Unlike the other subcommands it
 * prints event lines, not one JSON line, and runs until its stdin closes:
 *
 *   ASSIGNED_FIRST_RECORD partition=P offset=O ts=T   first record of P, and again after a jump in P's offsets
 *   RESTORE_START partition=P ts=T start=S end=E      StateRestoreListener (active tasks only)
 *   RESTORE_END partition=P ts=T records=N
 *   STATUS ts=T active=P:AGE,... standby=P:LAG,...   once a second: partitions processed in the last 2 s
 *                                                     (age of the last record in ms), standby tasks and their
 *                                                     offset lag (allLocalStorePartitionLags)
 *   PROGRESS partition=P first=F last=L maxgap=G records=N
 *                                                     once a second for each partition processed since the
 *                                                     last such line: wall-clock ms of the first and last
 *                                                     record processed in that window, the largest gap in ms
 *                                                     between two consecutive records inside it, and how many
 *                                                     (run.py's scale-out scenario finds every pause from them)
 *
 * Timestamps are ms since the epoch. Settings: the bench's defaults (no record cache, one stream
 * thread, at_least_once) plus num.standby.replicas, session.timeout.ms and heartbeat.interval.ms
 * from the command line and commit.interval.ms=100 (kstate's commit interval).
 * acceptable.recovery.lag, max.warmup.replicas and probing.rebalance.interval.ms stay at defaults
 * unless --acceptable-lag, --max-warmups or --probing-ms is given (the scale-out scenario).
 */
final class FailoverBench {
    private FailoverBench() {}

    private static final String STORE = "s";

    /** partition -> {last offset, processed at ms, record timestamp ms} */
    private static final Map<Integer, long[]> SEEN = new ConcurrentHashMap<>();

    /** partition -> {first processed ms, last processed ms, largest gap ms, records} since the last PROGRESS line; guarded by itself */
    private static final Map<Integer, long[]> WINDOWS = new TreeMap<>();

    static void processedAt(int partition, long now) {
        synchronized (WINDOWS) {
            long[] w = WINDOWS.get(partition);
            if (w == null) {
                WINDOWS.put(partition, new long[] {now, now, 0, 1});
            } else {
                w[2] = Math.max(w[2], now - w[1]);
                w[1] = now;
                w[3]++;
            }
        }
    }

    /** Prints (and starts anew) the PROGRESS window of every partition processed since the last call. */
    static void printProgress() {
        Map<Integer, long[]> taken;
        synchronized (WINDOWS) {
            taken = new TreeMap<>(WINDOWS);
            WINDOWS.clear();
        }
        for (Map.Entry<Integer, long[]> e : taken.entrySet()) {
            long[] w = e.getValue();
            out("PROGRESS partition=" + e.getKey() + " first=" + w[0] + " last=" + w[1] + " maxgap=" + w[2] + " records=" + w[3]);
        }
    }

    static synchronized void out(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static Json run(Args a) throws Exception {
        String bootstrap = a.str("bootstrap");
        String appId = a.str("app-id");
        String input = a.str("input-topic");
        String stateDir = a.str("state-dir");
        int standbys = a.integer("standbys", 0);
        int sessionMs = a.integer("session-timeout-ms", 10000);
        int heartbeatMs = a.integer("heartbeat-ms", 1000);
        String acceptableLag = a.str("acceptable-lag", null);
        String maxWarmups = a.str("max-warmups", null);
        String probingMs = a.str("probing-ms", null);
        a.requireAllUsed();

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        p.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, standbys);
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), sessionMs);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), heartbeatMs);
        if (acceptableLag != null) p.put(StreamsConfig.ACCEPTABLE_RECOVERY_LAG_CONFIG, Long.parseLong(acceptableLag));
        if (maxWarmups != null) p.put(StreamsConfig.MAX_WARMUP_REPLICAS_CONFIG, Integer.parseInt(maxWarmups));
        if (probingMs != null) p.put(StreamsConfig.PROBING_REBALANCE_INTERVAL_MS_CONFIG, Long.parseLong(probingMs));

        Topology t = new Topology();
        t.addSource("source", new BytesDeserializer(), new ByteArrayDeserializer(), input);
        t.addProcessor("put", PutProcessor::new, "source");
        t.addStateStore(
            Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(STORE), Serdes.Bytes(), Serdes.ByteArray())
                .withCachingDisabled()
                .withLoggingEnabled(Map.of()),
            "put");

        KafkaStreams streams = new KafkaStreams(t, p);
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
                out("RESTORE_START partition=" + tp.partition() + " ts=" + System.currentTimeMillis() + " start=" + start + " end=" + end);
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {}

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                out("RESTORE_END partition=" + tp.partition() + " ts=" + System.currentTimeMillis() + " records=" + total);
            }

            @Override
            public void onRestoreSuspended(TopicPartition tp, String store, long total) {
                Log.info("restore suspended partition=%d restored=%d", tp.partition(), total);
            }
        });
        streams.setStateListener((now, before) -> Log.info("streams state %s -> %s", before, now));
        streams.setUncaughtExceptionHandler(e -> {
            Log.info("stream thread failed: %s", e);
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.cleanUp();
        streams.start();

        Thread status = new Thread(() -> {
            while (true) {
                try {
                    Thread.sleep(1000);
                    printProgress();
                    long now = System.currentTimeMillis();
                    StringBuilder active = new StringBuilder();
                    for (Map.Entry<Integer, long[]> e : new TreeMap<>(SEEN).entrySet()) {
                        if (now - e.getValue()[1] < 2000) {
                            if (active.length() > 0) active.append(',');
                            active.append(e.getKey()).append(':').append(now - e.getValue()[2]);
                        }
                    }
                    TreeMap<Integer, Long> standby = new TreeMap<>();
                    if (streams.state() == KafkaStreams.State.RUNNING || streams.state() == KafkaStreams.State.REBALANCING) {
                        Map<Integer, LagInfo> lags = streams.allLocalStorePartitionLags().getOrDefault(STORE, Map.of());
                        for (ThreadMetadata tm : streams.metadataForLocalThreads()) {
                            for (TaskMetadata task : tm.standbyTasks()) {
                                int part = task.taskId().partition();
                                LagInfo lag = lags.get(part);
                                standby.put(part, lag == null ? -1L : lag.offsetLag());
                            }
                        }
                    }
                    StringBuilder sb = new StringBuilder();
                    for (Map.Entry<Integer, Long> e : standby.entrySet()) {
                        if (sb.length() > 0) sb.append(',');
                        sb.append(e.getKey()).append(':').append(e.getValue());
                    }
                    out("STATUS ts=" + now + " active=" + (active.length() == 0 ? "-" : active)
                        + " standby=" + (sb.length() == 0 ? "-" : sb) + " state=" + streams.state());
                } catch (InterruptedException e) {
                    return;
                } catch (Exception e) {
                    Log.info("status failed: %s", e);
                }
            }
        }, "status");
        status.setDaemon(true);
        status.start();

        // Run until stdin closes (the runner closed it or died).
        InputStream in = System.in;
        byte[] buf = new byte[4096];
        while (in.read(buf) >= 0) { }
        status.interrupt();
        printProgress();
        streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
            .withTimeout(Duration.ofSeconds(30)));
        return new Json().put("contender", "kafka-streams").put("mode", "failover").put("stopped", true);
    }

    private static final class PutProcessor implements Processor<Bytes, byte[], Void, Void> {
        private KeyValueStore<Bytes, byte[]> kv;
        private ProcessorContext<Void, Void> ctx;

        @Override
        public void init(ProcessorContext<Void, Void> context) {
            ctx = context;
            kv = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<Bytes, byte[]> r) {
            if (r.value() == null) kv.delete(r.key());
            else kv.put(r.key(), r.value());
            var md = ctx.recordMetadata().orElseThrow();
            long now = System.currentTimeMillis();
            processedAt(md.partition(), now);
            long[] last = SEEN.put(md.partition(), new long[] {md.offset(), now, r.timestamp()});
            if (last == null || md.offset() != last[0] + 1) {
                out("ASSIGNED_FIRST_RECORD partition=" + md.partition() + " offset=" + md.offset() + " ts=" + now);
            }
        }
    }
}
