// The differential tests' oracle: Debezium's embedded engine, PostgreSQL connector and outbox
// Event Router, with Kafka Connect's converters applied as a Connect worker applies them.
//
// Usage: java -cp <debezium jars>:<dir> Oracle RUN.properties...
//
// Each RUN.properties holds the engine's configuration (connector, slot, publication, the
// router options under `transforms.outbox.`, which the oracle applies itself record by record)
// plus keys for the oracle itself:
//   oracle.output          file to write the records to
//   oracle.expected        number of change events to wait for (tombstones included)
//   oracle.partitions      partition count used for the default partitioner
//   oracle.timeout.ms      how long to wait for them (default 120000)
//   oracle.key.converter / oracle.value.converter    converter classes
//   oracle.key.converter.<k> / oracle.value.converter.<k>   their configuration
//   oracle.header.converter (default org.apache.kafka.connect.storage.SimpleHeaderConverter)
//
// Output: one line per record, tab separated, byte strings in lower-case hex ("-" for null):
//   R topic partition timestamp key value header-count (name value)*
// a line "X topic id error" for a record the converters refuse (a worker's task would fail), and,
// when the engine stops with an error or too few records came, a last line "E <message hex>".
// Runs are executed in the same JVM, four at a time.

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.embedded.Connect;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.Converter;
import org.apache.kafka.connect.storage.HeaderConverter;

public final class Oracle {
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    public static void main(String[] args) throws Exception {
        // Runs are independent (each has its own slot, engine and converters): run a few at a
        // time.
        ExecutorService runs = Executors.newFixedThreadPool(4);
        List<java.util.concurrent.Future<?>> pending = new ArrayList<>();
        for (String path : args) {
            pending.add(runs.submit(() -> {
                run(path);
                return null;
            }));
        }
        int status = 0;
        for (java.util.concurrent.Future<?> f : pending) {
            try {
                f.get();
            } catch (java.util.concurrent.ExecutionException e) {
                e.getCause().printStackTrace();
                status = 1;
            }
        }
        runs.shutdown();
        System.exit(status);
    }

    private static String hex(byte[] bytes) {
        if (bytes == null) {
            return "-";
        }
        StringBuilder sb = new StringBuilder(bytes.length * 2 + 1);
        sb.append('x');
        for (byte b : bytes) {
            sb.append(HEX[(b >> 4) & 0xF]).append(HEX[b & 0xF]);
        }
        return sb.toString();
    }

    private static Map<String, String> prefixed(Properties props, String prefix) {
        Map<String, String> out = new HashMap<>();
        for (String name : props.stringPropertyNames()) {
            if (name.startsWith(prefix)) {
                out.put(name.substring(prefix.length()), props.getProperty(name));
            }
        }
        return out;
    }

    private static Object instance(String className) throws Exception {
        return Class.forName(className).getDeclaredConstructor().newInstance();
    }

    private static void run(String path) throws Exception {
        Properties all = new Properties();
        try (InputStreamReader in = new InputStreamReader(new FileInputStream(path), StandardCharsets.UTF_8)) {
            all.load(in);
        }
        // The router runs here rather than in the engine, record by record, so that a record
        // it fails on is reported and the run goes on (a Connect task would stop there).
        Properties engineProps = new Properties();
        for (String name : all.stringPropertyNames()) {
            if (!name.startsWith("oracle.") && !name.startsWith("transforms")) {
                engineProps.setProperty(name, all.getProperty(name));
            }
        }
        io.debezium.transforms.outbox.EventRouter<SourceRecord> router = new io.debezium.transforms.outbox.EventRouter<>();
        router.configure(prefixed(all, "transforms.outbox."));
        String output = all.getProperty("oracle.output");
        int expected = Integer.parseInt(all.getProperty("oracle.expected"));
        int partitions = Integer.parseInt(all.getProperty("oracle.partitions", "3"));
        long timeoutMs = Long.parseLong(all.getProperty("oracle.timeout.ms", "120000"));

        Converter keyConverter = (Converter) instance(all.getProperty("oracle.key.converter"));
        keyConverter.configure(prefixed(all, "oracle.key.converter."), true);
        Converter valueConverter = (Converter) instance(all.getProperty("oracle.value.converter"));
        valueConverter.configure(prefixed(all, "oracle.value.converter."), false);
        HeaderConverter headerConverter = (HeaderConverter) instance(all.getProperty(
                "oracle.header.converter", "org.apache.kafka.connect.storage.SimpleHeaderConverter"));
        headerConverter.configure(prefixed(all, "oracle.header.converter."));

        List<String> lines = new ArrayList<>();
        int[] events = {0};
        CountDownLatch done = new CountDownLatch(1);
        AtomicReference<String> failure = new AtomicReference<>();

        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine
                .create(ChangeEventFormat.of(Connect.class))
                .using(engineProps)
                .using((success, message, error) -> {
                    if (!success) {
                        StringBuilder m = new StringBuilder(String.valueOf(message));
                        for (Throwable t = error; t != null; t = t.getCause()) {
                            m.append(" | ").append(t);
                        }
                        failure.set(m.toString());
                    }
                    done.countDown();
                })
                .notifying(event -> {
                    SourceRecord raw = event.record();
                    SourceRecord r;
                    String l;
                    try {
                        r = router.apply(raw);
                    } catch (RuntimeException e) {
                        l = "X\t" + hex(String.valueOf(raw.topic()).getBytes(StandardCharsets.UTF_8)) + "\t"
                                + hex(eventId(raw)) + "\t" + hex(String.valueOf(e).getBytes(StandardCharsets.UTF_8));
                        synchronized (lines) {
                            lines.add(l);
                            if (++events[0] >= expected) {
                                done.countDown();
                            }
                        }
                        return;
                    }
                    if (r == null) {
                        synchronized (lines) {
                            if (++events[0] >= expected) {
                                done.countDown();
                            }
                        }
                        return;
                    }
                    try {
                        l = line(r, keyConverter, valueConverter, headerConverter, partitions);
                    } catch (RuntimeException e) {
                        // A record the converters refuse: a Connect worker's task would fail here.
                        Header id = r.headers().lastWithName("id");
                        l = "X\t" + hex(String.valueOf(r.topic()).getBytes(StandardCharsets.UTF_8)) + "\t"
                                + (id == null || id.value() == null ? "-"
                                        : hex(id.value().toString().getBytes(StandardCharsets.UTF_8)))
                                + "\t" + hex(String.valueOf(e).getBytes(StandardCharsets.UTF_8));
                    }
                    synchronized (lines) {
                        lines.add(l);
                        if (++events[0] >= expected) {
                            done.countDown();
                        }
                    }
                })
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        boolean finished = done.await(timeoutMs, TimeUnit.MILLISECONDS);
        try {
            engine.close();
        } catch (IllegalStateException alreadyStopped) {
            // The engine stopped on its own (an error reported through the callback).
        }
        executor.shutdown();
        executor.awaitTermination(30, TimeUnit.SECONDS);
        try (PrintStream out = new PrintStream(new FileOutputStream(output), false, StandardCharsets.UTF_8)) {
            synchronized (lines) {
                for (String l : lines) {
                    out.println(l);
                }
                if (failure.get() != null) {
                    out.println("E\t" + hex(failure.get().getBytes(StandardCharsets.UTF_8)));
                } else if (!finished || events[0] < expected) {
                    out.println("E\t" + hex(("timed out with " + events[0] + " of " + expected
                            + " records").getBytes(StandardCharsets.UTF_8)));
                }
            }
        }
    }

    // The `id` column of the change event's `after` row, as text.
    private static byte[] eventId(SourceRecord raw) {
        try {
            Object id = ((org.apache.kafka.connect.data.Struct) ((org.apache.kafka.connect.data.Struct) raw.value())
                    .get("after")).get("id");
            return id == null ? null : id.toString().getBytes(StandardCharsets.UTF_8);
        } catch (RuntimeException e) {
            return null;
        }
    }

    // What a Connect worker does with a transformed record: headers, key and value through the
    // converters, then the producer's default partitioner.
    private static String line(SourceRecord r, Converter keyConverter, Converter valueConverter,
            HeaderConverter headerConverter, int partitions) {
        org.apache.kafka.common.header.internals.RecordHeaders headers =
                new org.apache.kafka.common.header.internals.RecordHeaders();
        for (Header h : r.headers()) {
            byte[] raw = headerConverter.fromConnectHeader(r.topic(), h.key(), h.schema(), h.value());
            headers.add(h.key(), raw);
        }
        byte[] key = keyConverter.fromConnectData(r.topic(), headers, r.keySchema(), r.key());
        byte[] value = valueConverter.fromConnectData(r.topic(), headers, r.valueSchema(), r.value());
        String partition;
        if (r.kafkaPartition() != null) {
            partition = r.kafkaPartition().toString();
        } else if (key != null) {
            partition = Integer.toString(Utils.toPositive(Utils.murmur2(key)) % partitions);
        } else {
            partition = "-";
        }
        StringBuilder sb = new StringBuilder();
        sb.append('R').append('\t').append(hex(r.topic().getBytes(StandardCharsets.UTF_8)));
        sb.append('\t').append(partition);
        sb.append('\t').append(r.timestamp() == null ? "-" : r.timestamp().toString());
        sb.append('\t').append(hex(key));
        sb.append('\t').append(hex(value));
        int n = 0;
        for (org.apache.kafka.common.header.Header ignored : headers) {
            n++;
        }
        sb.append('\t').append(n);
        for (org.apache.kafka.common.header.Header h : headers) {
            sb.append('\t').append(hex(h.key().getBytes(StandardCharsets.UTF_8)));
            sb.append('\t').append(hex(h.value()));
        }
        return sb.toString();
    }
}
