package kstate.bench;

import java.time.LocalTime;
import java.time.format.DateTimeFormatter;

/** Progress lines on stderr, timestamped like the slf4j-simple lines around them. */
final class Log {
    private static final DateTimeFormatter TIME = DateTimeFormatter.ofPattern("HH:mm:ss.SSS");

    private Log() {}

    static void info(String format, Object... args) {
        System.err.println(LocalTime.now().format(TIME) + " [bench] " + String.format(format, args));
    }
}
