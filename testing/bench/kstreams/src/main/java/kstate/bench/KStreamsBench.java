package kstate.bench;

import java.io.PrintWriter;
import java.io.StringWriter;

/**
 * Kafka Streams contender and shared data generator of the kstate benchmark suite.
 * Each subcommand prints exactly one JSON line on stdout; all logging goes to stderr.
 * Exit code 0 on success; on failure {"error": ...} on stdout and exit code 1 (2 for usage).
 */
public final class KStreamsBench {
    private KStreamsBench() {}

    private static final String USAGE = String.join("\n",
        "usage: java -jar kstreams-bench.jar <subcommand> [options]",
        "  generate     --bootstrap H:P --topic T --partitions P --records N [--key-bytes 16] [--value-bytes 100]",
        "               [--overwrite-fraction 0.2] [--delete-fraction 0.05] [--seed 42] [--compact true|false] [--append]",
        "  restore      COMMON [--threads 1] [--timeout-sec 1800]",
        "  tail-restore COMMON [--threads 1] [--timeout-sec 1800]",
        "  write        COMMON --records N [--threads 1] [--timeout-sec 1800] [--output-topic T] [--eos]",
        "  consume      --bootstrap H:P --topic T [--timeout-sec 1800]",
        "  failover     --bootstrap H:P --app-id ID --input-topic T --state-dir DIR [--standbys 0]",
        "               [--session-timeout-ms 10000] [--heartbeat-ms 1000]   (event lines on stdout until stdin closes)",
        "               [--acceptable-lag N] [--max-warmups N] [--probing-ms MS]   (KS defaults when absent)",
        "  window       COMMON --records N [--window-size-ms 300000] [--advance-ms 60000] [--event-step-ms 5] [--event-base-ms 0] [--cache-bytes 10485760]",
        "  window-restore COMMON [same window options]   (empty state dir: restore the window store's changelog)",
        "  repartition  COMMON --records N   (groupBy(first two value bytes).count() through a repartition topic)",
        "  join         COMMON --records N --table-topic T   (stream.leftJoin(builder.table(T)), N stream records)",
        "  table-restore COMMON --table-topic T   (empty state dir: builder.table(T) restored from T itself, up to the group's offsets, set to T's end)",
        "COMMON = --bootstrap H:P --app-id ID --store NAME --input-topic T --partitions P --state-dir DIR");

    public static void main(String[] argv) {
        if (argv.length == 0 || argv[0].equals("-h") || argv[0].equals("--help")) {
            System.err.println(USAGE);
            System.exit(argv.length == 0 ? 2 : 0);
        }
        int code;
        try {
            Args a = new Args(argv, 1);
            Json result;
            switch (argv[0]) {
                case "generate": result = Generate.run(a); break;
                case "restore": result = RestoreBench.run(a, true); break;
                case "tail-restore": result = RestoreBench.run(a, false); break;
                case "write": result = WriteBench.run(a); break;
                case "consume": result = ConsumeBench.run(a); break;
                case "failover": result = FailoverBench.run(a); break;
                case "window": result = WindowBench.run(a, false); break;
                case "window-restore": result = WindowBench.run(a, true); break;
                case "repartition": result = RepartitionBench.run(a); break;
                case "join": result = JoinBench.run(a); break;
                case "table-restore": result = TableRestoreBench.run(a); break;
                default: throw new IllegalArgumentException("unknown subcommand " + argv[0] + "\n" + USAGE);
            }
            System.out.println(result);
            code = 0;
        } catch (IllegalArgumentException e) {
            System.err.println("error: " + e.getMessage());
            System.out.println(new Json().put("error", String.valueOf(e.getMessage())));
            code = 2;
        } catch (Throwable t) {
            StringWriter sw = new StringWriter();
            t.printStackTrace(new PrintWriter(sw));
            System.err.print(sw);
            System.out.println(new Json().put("error", t.toString()));
            code = 1;
        }
        System.out.flush();
        // Non-daemon client threads must not keep the JVM alive after the result line.
        Runtime.getRuntime().halt(code);
    }
}
