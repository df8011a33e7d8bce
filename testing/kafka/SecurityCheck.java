// Checks the SSL and SASL_PLAINTEXT listeners of the test broker with Kafka's
// own Java client (the kafka-clients jar the broker runs on; kafka-tools with
// the console producer/consumer is not on that classpath). No javac needed:
//
//   KSTATE_KAFKA_PORT=29092 bash testing/kafka.sh start
//   set -a; eval "$(KSTATE_KAFKA_PORT=29092 bash testing/kafka.sh env)"; set +a
//   java -cp "$HOME/.cache/kstate/kafka-4.4.0/lib/*" testing/kafka/SecurityCheck.java
//
// (The clients also log the expected authentication failures as ERROR
// lines; the verdicts are the lines starting with "ok" or "FAIL".)
//
// Reads the KSTATE_* variables printed by `kafka.sh env`. Every case must
// succeed (produce + consume one record) or fail with the expected
// authentication error; prints one line per case and exits 1 if any differs.
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class SecurityCheck {
    static int failures = 0;

    static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalStateException(name + " not set; eval \"$(bash testing/kafka.sh env)\" first");
        }
        return v;
    }

    static String pem(String path) throws Exception {
        return Files.readString(Path.of(path));
    }

    // mTLS client config; the key and chain are given inline because a Java
    // PEM keystore *file* wants key and certificate in one file.
    static Properties ssl(String bootstrap, String ca, String cert, String key) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("security.protocol", "SSL");
        p.put("ssl.truststore.type", "PEM");
        p.put("ssl.truststore.location", ca);
        if (cert != null) {
            p.put("ssl.keystore.type", "PEM");
            p.put("ssl.keystore.certificate.chain", pem(cert));
            p.put("ssl.keystore.key", pem(key));
        }
        return p;
    }

    static Properties sasl(String mechanism, String user, String password) {
        Properties p = new Properties();
        p.put("bootstrap.servers", env("KSTATE_SASL_BOOTSTRAP"));
        p.put("security.protocol", "SASL_PLAINTEXT");
        p.put("sasl.mechanism", mechanism);
        String module = mechanism.equals("PLAIN")
                ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                : "org.apache.kafka.common.security.scram.ScramLoginModule";
        p.put("sasl.jaas.config", module + " required username=\"" + user + "\" password=\"" + password + "\";");
        return p;
    }

    // Creates a topic, produces one record, reads it back.
    static void roundTrip(Properties base) throws Exception {
        String topic = "security-check-" + UUID.randomUUID();
        Properties p = new Properties();
        p.putAll(base);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "15000");
        try (Admin admin = Admin.create(p)) {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get(15, TimeUnit.SECONDS);
        }
        Properties pp = new Properties();
        pp.putAll(p);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        pp.put("max.block.ms", "15000");
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            producer.send(new ProducerRecord<>(topic, "k", "v-" + topic)).get(15, TimeUnit.SECONDS);
        }
        Properties cp = new Properties();
        cp.putAll(p);
        cp.put("key.deserializer", StringDeserializer.class.getName());
        cp.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            TopicPartition tp = new TopicPartition(topic, 0);
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
            while (System.nanoTime() < deadline) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                if (!records.isEmpty()) {
                    String v = records.iterator().next().value();
                    if (!v.equals("v-" + topic)) throw new IllegalStateException("read back " + v);
                    try (Admin admin = Admin.create(p)) {
                        admin.deleteTopics(List.of(topic)).all().get(15, TimeUnit.SECONDS);
                    }
                    return;
                }
            }
            throw new IllegalStateException("record not read back within 15 s");
        }
    }

    static void expectOk(String name, Properties p) {
        long t0 = System.nanoTime();
        try {
            roundTrip(p);
            System.out.printf("ok    %-58s produce+consume (%d ms)%n", name, (System.nanoTime() - t0) / 1_000_000);
        } catch (Exception e) {
            failures++;
            System.out.printf("FAIL  %-58s %s%n", name, root(e));
        }
    }

    // Must fail with an exception whose class name contains `expected`.
    static void expectFail(String name, Properties base, String expected) {
        Properties p = new Properties();
        p.putAll(base);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "15000");
        try (Admin admin = Admin.create(p)) {
            admin.describeCluster().nodes().get(15, TimeUnit.SECONDS);
            failures++;
            System.out.printf("FAIL  %-58s succeeded, expected %s%n", name, expected);
        } catch (Exception e) {
            String r = root(e);
            if (r.contains(expected)) {
                System.out.printf("ok    %-58s rejected: %s%n", name, r);
            } else {
                failures++;
                System.out.printf("FAIL  %-58s expected %s, got %s%n", name, expected, r);
            }
        }
    }

    static String root(Throwable e) {
        if (e instanceof ExecutionException && e.getCause() != null) e = e.getCause();
        String msg = String.valueOf(e.getMessage()).replace('\n', ' ');
        if (msg.length() > 140) msg = msg.substring(0, 140) + "...";
        return e.getClass().getSimpleName() + ": " + msg;
    }

    public static void main(String[] args) throws Exception {
        String ssl = env("KSTATE_SSL_BOOTSTRAP");
        String ca = env("KSTATE_TLS_CA");
        String cert = env("KSTATE_TLS_CLIENT_CERT");
        String key = env("KSTATE_TLS_CLIENT_KEY");
        String user = env("KSTATE_SASL_USER");
        String password = env("KSTATE_SASL_PASSWORD");
        String sslLocalhost = ssl.replace("127.0.0.1", "localhost");

        expectOk("SSL client cert, bootstrap " + ssl, ssl(ssl, ca, cert, key));
        expectOk("SSL client cert, bootstrap " + sslLocalhost, ssl(sslLocalhost, ca, cert, key));
        // Not KSTATE_TLS_CLIENT_KEY_ENCRYPTED: on Java 17 Kafka's PEM loader
        // cannot decrypt PBES2 keys ("PBES2 SecretKeyFactory not available");
        // that file is for OpenSSL-based clients (librdkafka).
        expectFail("SSL client cert from the untrusted CA",
                ssl(ssl, ca, env("KSTATE_TLS_UNTRUSTED_CLIENT_CERT"), env("KSTATE_TLS_UNTRUSTED_CLIENT_KEY")),
                "SslAuthenticationException");
        expectFail("SSL without a client cert", ssl(ssl, ca, null, null), "SslAuthenticationException");
        expectFail("SSL trusting only the untrusted CA",
                ssl(ssl, env("KSTATE_TLS_UNTRUSTED_CA"), cert, key), "SslAuthenticationException");
        for (String m : env("KSTATE_SASL_MECHANISMS").split(",")) {
            expectOk("SASL " + m + " " + user + "/" + password, sasl(m, user, password));
            expectFail("SASL " + m + " wrong password", sasl(m, user, "wrong-password"), "SaslAuthenticationException");
        }
        expectFail("SASL SCRAM-SHA-512 unknown user", sasl("SCRAM-SHA-512", "nobody", password),
                "SaslAuthenticationException");
        System.out.println(failures == 0 ? "all checks passed" : failures + " check(s) failed");
        System.exit(failures == 0 ? 0 : 1);
    }
}
