package kstate.bench;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.config.TopicConfig;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

/** Admin-client helpers: describe, create, check shape, count records by offsets. */
final class Topics {
    private Topics() {}

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return Admin.create(p);
    }

    static Optional<TopicDescription> describe(Admin admin, String topic) throws Exception {
        try {
            return Optional.of(admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic));
        } catch (ExecutionException e) {
            if (e.getCause() instanceof UnknownTopicOrPartitionException) return Optional.empty();
            throw e;
        }
    }

    static String cleanupPolicy(Admin admin, String topic) throws Exception {
        ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Config c = admin.describeConfigs(List.of(r)).all().get().get(r);
        ConfigEntry e = c.get(TopicConfig.CLEANUP_POLICY_CONFIG);
        return e == null ? "" : e.value();
    }

    /** Creates the topic (replication factor = broker default); tolerates a concurrent create. */
    static void create(Admin admin, String topic, int partitions, Map<String, String> configs) throws Exception {
        NewTopic nt = new NewTopic(topic, Optional.of(partitions), Optional.empty()).configs(configs);
        try {
            admin.createTopics(List.of(nt)).all().get();
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) throw e;
        }
        // Wait until metadata shows all partitions (creation is asynchronous on the broker).
        for (int i = 0; i < 100; i++) {
            Optional<TopicDescription> d = describe(admin, topic);
            if (d.isPresent() && d.get().partitions().size() == partitions) return;
            Thread.sleep(100);
        }
        throw new IllegalStateException("topic " + topic + " did not appear after creation");
    }

    /** Creates the topic if missing, else fails unless it has exactly `partitions` partitions. Returns true if created. */
    static boolean ensure(Admin admin, String topic, int partitions, Map<String, String> configs) throws Exception {
        Optional<TopicDescription> d = describe(admin, topic);
        if (d.isEmpty()) {
            create(admin, topic, partitions, configs);
            return true;
        }
        requirePartitions(d.get(), partitions);
        return false;
    }

    static void requirePartitions(TopicDescription d, int partitions) {
        int actual = d.partitions().size();
        if (actual != partitions) {
            throw new IllegalStateException("topic " + d.name() + " exists with " + actual
                + " partitions, expected " + partitions);
        }
    }

    static List<TopicPartition> partitions(TopicDescription d) {
        return d.partitions().stream().map(p -> new TopicPartition(d.name(), p.partition())).collect(Collectors.toList());
    }

    /** Sum over partitions of (log end offset - log start offset); equals the record count of a
     *  non-transactional topic that was never compacted. */
    static long offsetSpan(Admin admin, TopicDescription d) throws Exception {
        Map<TopicPartition, OffsetSpec> earliest = new HashMap<>();
        Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
        for (TopicPartition tp : partitions(d)) {
            earliest.put(tp, OffsetSpec.earliest());
            latest.put(tp, OffsetSpec.latest());
        }
        Map<TopicPartition, ListOffsetsResultInfo> lo = admin.listOffsets(earliest).all().get();
        Map<TopicPartition, ListOffsetsResultInfo> hi = admin.listOffsets(latest).all().get();
        long sum = 0;
        for (TopicPartition tp : hi.keySet()) sum += hi.get(tp).offset() - lo.get(tp).offset();
        return sum;
    }

    static Map<String, String> policy(boolean compact) {
        return Map.of(TopicConfig.CLEANUP_POLICY_CONFIG,
            compact ? TopicConfig.CLEANUP_POLICY_COMPACT : TopicConfig.CLEANUP_POLICY_DELETE);
    }
}
