package kstate.bench;

import java.util.Optional;
import java.util.Properties;
import java.util.SplittableRandom;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * `generate`: the shared data generator. Record i goes to partition i % P. In each partition a
 * record is a tombstone of an earlier key (delete-fraction), an overwrite of an earlier key
 * (overwrite-fraction) or a new key. Keys are a pure function of (seed, partition, key index), so
 * no key set is kept in memory; values are random bytes.
 */
final class Generate {
    private Generate() {}

    static Json run(Args a) throws Exception {
        String bootstrap = a.str("bootstrap");
        String topic = a.str("topic");
        int partitions = a.integer("partitions");
        long records = a.lng("records");
        int keyBytes = a.integer("key-bytes", 16);
        int valueBytes = a.integer("value-bytes", 100);
        double overwrite = a.dbl("overwrite-fraction", 0.2);
        double delete = a.dbl("delete-fraction", 0.05);
        long seed = a.lng("seed", 42);
        boolean compact = a.bool("compact", true);
        boolean append = a.bool("append", false);
        a.requireAllUsed();
        if (keyBytes < 8) throw new IllegalArgumentException("--key-bytes must be >= 8");
        if (overwrite < 0 || delete < 0 || overwrite + delete > 1) throw new IllegalArgumentException("bad fractions");

        try (Admin admin = Topics.admin(bootstrap)) {
            Optional<TopicDescription> d = Topics.describe(admin, topic);
            if (d.isEmpty()) {
                Topics.create(admin, topic, partitions, Topics.policy(compact));
            } else {
                Topics.requirePartitions(d.get(), partitions);
                String policy = Topics.cleanupPolicy(admin, topic);
                String want = compact ? "compact" : "delete";
                if (!policy.equals(want)) {
                    throw new IllegalStateException("topic " + topic + " exists with cleanup.policy=" + policy
                        + ", expected " + want);
                }
                long existing = Topics.offsetSpan(admin, d.get());
                if (!append && existing >= records) {
                    Log.info("topic %s already holds %d >= %d records; skipping generation",
                        topic, existing, records);
                    return new Json().put("topic", topic).put("records", existing).put("bytes", 0L)
                        .put("seconds", 0.0).put("skipped", true);
                }
                if (!append && existing > 0) {
                    throw new IllegalStateException("topic " + topic + " holds " + existing + " < " + records
                        + " records (interrupted run?); delete it, or pass --append to add " + records + " more");
                }
            }
        }

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.LINGER_MS_CONFIG, 20);
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, 1 << 20);
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);

        SplittableRandom choice = new SplittableRandom(seed);
        SplittableRandom valueRng = new SplittableRandom(seed ^ 0x5DEECE66DL);
        long[] newKeys = new long[partitions]; // keys created so far per partition
        long bytes = 0;
        AtomicReference<Exception> failure = new AtomicReference<>();

        long t0 = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (long i = 0; i < records; i++) {
                if (failure.get() != null) break;
                int part = (int) (i % partitions);
                double r = choice.nextDouble();
                byte[] key;
                byte[] value = null;
                if (newKeys[part] > 0 && r < delete) {
                    key = key(seed, part, choice.nextLong(newKeys[part]), keyBytes);
                } else {
                    if (newKeys[part] > 0 && r < delete + overwrite) {
                        key = key(seed, part, choice.nextLong(newKeys[part]), keyBytes);
                    } else {
                        key = key(seed, part, newKeys[part]++, keyBytes);
                    }
                    value = new byte[valueBytes];
                    valueRng.nextBytes(value);
                }
                bytes += key.length + (value == null ? 0 : value.length);
                producer.send(new ProducerRecord<>(topic, part, key, value), (md, e) -> {
                    if (e != null) failure.compareAndSet(null, e);
                });
            }
            producer.flush();
        }
        double seconds = (System.nanoTime() - t0) / 1e9;
        if (failure.get() != null) throw failure.get();
        return new Json().put("topic", topic).put("records", records).put("bytes", bytes)
            .put("seconds", seconds).put("records_per_sec", Json.perSec(records, seconds)).put("skipped", false);
    }

    /** Deterministic key bytes for (seed, partition, index); injective in index for a fixed seed and partition. */
    static byte[] key(long seed, int partition, long index, int keyBytes) {
        long h = mix64(mix64(seed + 0x9E3779B97F4A7C15L) ^ (partition + 1L) * 0xC2B2AE3D27D4EB4FL);
        h = mix64(h ^ index);
        byte[] k = new byte[keyBytes];
        for (int i = 0; i < 8; i++) k[i] = (byte) (h >>> (56 - 8 * i));
        if (keyBytes > 8) {
            byte[] rest = new byte[keyBytes - 8];
            new SplittableRandom(h).nextBytes(rest);
            System.arraycopy(rest, 0, k, 8, rest.length);
        }
        return k;
    }

    // Stafford variant 13 of the SplitMix64 finalizer: a bijection on longs.
    private static long mix64(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }
}
