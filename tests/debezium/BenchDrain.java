// The benchmark's Debezium row: Debezium's embedded engine with the PostgreSQL connector and the
// outbox Event Router (as an engine transform, the way a deployment configures it) drains a slot
// into a sink that converts each record as a Kafka Connect worker would (JsonConverter for key and
// value, SimpleHeaderConverter for headers) and then discards it.
//
// Usage: java -cp <debezium jars>:<dir> BenchDrain RUN.properties
//
// RUN.properties holds the engine's configuration plus keys for this program:
//   bench.expected   records (router outputs) that make up the backlog
//
// Control lines go to standard output, tab separated, each starting with "BENCH" (everything
// else, Debezium's logging included, goes to standard error):
//   BENCH PROGRESS <records>       every second: records converted so far
//   BENCH LAST <records>           the record that completes the backlog was converted
//   BENCH ERROR <message>          the engine stopped with an error
//   BENCH COUNT <records> <bytes>  written after standard input closes and the engine stopped
// The program stops when its standard input reaches end of file.

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.embedded.Connect;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;

public final class BenchDrain {
    public static void main(String[] args) throws Exception {
        // Standard output carries only control lines; loggers bound to System.out go to stderr.
        PrintStream control = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        System.setOut(System.err);

        Properties all = new Properties();
        try (InputStreamReader in = new InputStreamReader(new FileInputStream(args[0]), StandardCharsets.UTF_8)) {
            all.load(in);
        }
        Properties engineProps = new Properties();
        for (String name : all.stringPropertyNames()) {
            if (!name.startsWith("bench.")) {
                engineProps.setProperty(name, all.getProperty(name));
            }
        }
        long expected = Long.parseLong(all.getProperty("bench.expected"));

        JsonConverter keyConverter = new JsonConverter();
        keyConverter.configure(Map.of("schemas.enable", "false"), true);
        JsonConverter valueConverter = new JsonConverter();
        valueConverter.configure(Map.of("schemas.enable", "false"), false);
        SimpleHeaderConverter headerConverter = new SimpleHeaderConverter();
        headerConverter.configure(Map.of());

        AtomicLong records = new AtomicLong();
        AtomicLong bytes = new AtomicLong();

        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine
                .create(ChangeEventFormat.of(Connect.class))
                .using(engineProps)
                .using((success, message, error) -> {
                    if (!success) {
                        StringBuilder m = new StringBuilder(String.valueOf(message));
                        for (Throwable t = error; t != null; t = t.getCause()) {
                            m.append(" | ").append(t);
                        }
                        control.println("BENCH\tERROR\t" + m.toString().replace('\t', ' ').replace('\n', ' '));
                    }
                })
                .notifying((List<RecordChangeEvent<SourceRecord>> batch,
                        DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer) -> {
                    for (RecordChangeEvent<SourceRecord> event : batch) {
                        SourceRecord r = event.record();
                        if (r != null) {
                            bytes.addAndGet(convert(r, keyConverter, valueConverter, headerConverter));
                            if (records.incrementAndGet() == expected) {
                                control.println("BENCH\tLAST\t" + expected);
                            }
                        }
                        committer.markProcessed(event);
                    }
                    committer.markBatchFinished();
                })
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        ScheduledExecutorService progress = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "bench-progress");
            t.setDaemon(true);
            return t;
        });
        progress.scheduleAtFixedRate(() -> control.println("BENCH\tPROGRESS\t" + records.get()),
                1, 1, TimeUnit.SECONDS);

        // Runs until the bench closes standard input.
        while (System.in.read() >= 0) {
            // Nothing is read from it but its end.
        }
        progress.shutdownNow();
        engine.close();
        executor.shutdown();
        executor.awaitTermination(60, TimeUnit.SECONDS);
        control.println("BENCH\tCOUNT\t" + records.get() + "\t" + bytes.get());
        System.exit(0);
    }

    // What a Connect worker does with a transformed record before handing it to its producer:
    // headers, key and value through the converters. Returns the bytes it produced.
    private static long convert(SourceRecord r, JsonConverter keyConverter, JsonConverter valueConverter,
            SimpleHeaderConverter headerConverter) {
        RecordHeaders headers = new RecordHeaders();
        long n = 0;
        for (Header h : r.headers()) {
            byte[] raw = headerConverter.fromConnectHeader(r.topic(), h.key(), h.schema(), h.value());
            headers.add(h.key(), raw);
            n += raw == null ? 0 : raw.length;
        }
        byte[] key = keyConverter.fromConnectData(r.topic(), headers, r.keySchema(), r.key());
        byte[] value = valueConverter.fromConnectData(r.topic(), headers, r.valueSchema(), r.value());
        return n + (key == null ? 0 : key.length) + (value == null ? 0 : value.length);
    }
}
