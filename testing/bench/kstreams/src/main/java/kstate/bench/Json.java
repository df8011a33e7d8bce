package kstate.bench;

import java.util.LinkedHashMap;
import java.util.Map;

/** Builds the single JSON result line (flat object of strings, numbers and booleans). */
final class Json {
    private final Map<String, Object> fields = new LinkedHashMap<>();

    Json put(String key, Object value) {
        fields.put(key, value);
        return this;
    }

    @Override
    public String toString() {
        StringBuilder sb = new StringBuilder("{");
        for (Map.Entry<String, Object> e : fields.entrySet()) {
            if (sb.length() > 1) sb.append(',');
            quote(sb, e.getKey());
            sb.append(':');
            Object v = e.getValue();
            if (v == null) {
                sb.append("null");
            } else if (v instanceof Double || v instanceof Float) {
                double d = ((Number) v).doubleValue();
                sb.append(Double.isFinite(d) ? String.format(java.util.Locale.ROOT, "%.6f", d) : "null");
            } else if (v instanceof Number || v instanceof Boolean) {
                sb.append(v);
            } else {
                quote(sb, v.toString());
            }
        }
        return sb.append('}').toString();
    }

    private static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20) sb.append(String.format("\\u%04x", (int) c));
                    else sb.append(c);
            }
        }
        sb.append('"');
    }

    static double perSec(long records, double seconds) {
        return seconds > 0 ? records / seconds : 0.0;
    }
}
