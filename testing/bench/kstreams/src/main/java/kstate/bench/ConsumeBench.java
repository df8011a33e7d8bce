package kstate.bench;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/** `consume`: plain KafkaConsumer read of a whole topic (assign, seekToBeginning, read to end offsets). */
final class ConsumeBench {
    private ConsumeBench() {}

    static Json run(Args a) throws Exception {
        String bootstrap = a.str("bootstrap");
        String topic = a.str("topic");
        long timeoutSec = a.lng("timeout-sec", 1800);
        a.requireAllUsed();

        List<TopicPartition> tps;
        try (Admin admin = Topics.admin(bootstrap)) {
            TopicDescription d = Topics.describe(admin, topic).orElseThrow(() ->
                new IllegalStateException("topic " + topic + " does not exist"));
            tps = Topics.partitions(d);
        }

        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        long records = 0;
        long bytes = 0;
        long t0;
        double seconds;
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            c.assign(tps);
            t0 = System.nanoTime();
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = new HashMap<>(c.endOffsets(tps));
            end.entrySet().removeIf(e -> c.position(e.getKey()) >= e.getValue());
            long deadline = t0 + timeoutSec * 1_000_000_000L;
            while (!end.isEmpty()) {
                if (System.nanoTime() > deadline) throw new IllegalStateException("timed out reading " + topic);
                ConsumerRecords<byte[], byte[]> batch = c.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : batch) {
                    records++;
                    if (r.key() != null) bytes += r.key().length;
                    if (r.value() != null) bytes += r.value().length;
                }
                end.entrySet().removeIf(e -> c.position(e.getKey()) >= e.getValue());
            }
            seconds = (System.nanoTime() - t0) / 1e9;
        }
        return new Json().put("contender", "java-consumer").put("topic", topic).put("records", records)
            .put("bytes", bytes).put("seconds", seconds).put("records_per_sec", Json.perSec(records, seconds));
    }
}
