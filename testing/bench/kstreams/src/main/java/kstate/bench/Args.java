package kstate.bench;

import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/** Minimal `--name value` / `--flag` parser; unknown or unused options are rejected. */
final class Args {
    private final Map<String, String> values = new HashMap<>();
    private final Set<String> used = new HashSet<>();

    Args(String[] argv, int from) {
        for (int i = from; i < argv.length; i++) {
            String a = argv[i];
            if (!a.startsWith("--")) throw new IllegalArgumentException("unexpected argument: " + a);
            String name = a.substring(2);
            String value;
            int eq = name.indexOf('=');
            if (eq >= 0) {
                value = name.substring(eq + 1);
                name = name.substring(0, eq);
            } else if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
                value = argv[++i];
            } else {
                value = "true"; // bare flag
            }
            values.put(name, value);
        }
    }

    String str(String name) {
        used.add(name);
        String v = values.get(name);
        if (v == null) throw new IllegalArgumentException("missing required option --" + name);
        return v;
    }

    String str(String name, String dflt) {
        used.add(name);
        return values.getOrDefault(name, dflt);
    }

    int integer(String name) { return Integer.parseInt(str(name)); }

    int integer(String name, int dflt) { return Integer.parseInt(str(name, Integer.toString(dflt))); }

    long lng(String name) { return Long.parseLong(str(name)); }

    long lng(String name, long dflt) { return Long.parseLong(str(name, Long.toString(dflt))); }

    double dbl(String name, double dflt) { return Double.parseDouble(str(name, Double.toString(dflt))); }

    boolean bool(String name, boolean dflt) {
        String v = str(name, Boolean.toString(dflt));
        if (v.equals("true")) return true;
        if (v.equals("false")) return false;
        throw new IllegalArgumentException("--" + name + " must be true or false, got " + v);
    }

    /** Call after all options were read: rejects typos instead of silently ignoring them. */
    void requireAllUsed() {
        Set<String> unknown = new HashSet<>(values.keySet());
        unknown.removeAll(used);
        if (!unknown.isEmpty()) throw new IllegalArgumentException("unknown option(s): --" + String.join(", --", unknown));
    }
}
