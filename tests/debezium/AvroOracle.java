// Avro as Confluent's AvroConverter writes a payload that Debezium's outbox Event Router
// expands (table.expand.json.payload = true): the Connect schema and struct Debezium's
// JsonSchemaData infers from the JSON text, turned into an Avro schema and datum by
// Confluent's AvroData, the datum written as the converter's serializer writes it (after the
// 5-byte frame).
//
// Input: one payload per line, its UTF-8 bytes in hex.
// Output: one line per payload, tab separated: "S <schema text hex> <datum hex>", or
// "E <error hex>" when the inference or the conversion throws.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.confluent.connect.avro.AvroData;
import io.debezium.transforms.outbox.JsonSchemaData;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.connect.data.Schema;

public class AvroOracle {
    public static void main(String[] args) throws Exception {
        ObjectMapper mapper = new ObjectMapper();
        JsonSchemaData inference = new JsonSchemaData();
        AvroData avroData = new AvroData(1000);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        String line;
        while ((line = in.readLine()) != null) {
            String payload = new String(unhex(line), StandardCharsets.UTF_8);
            try {
                JsonNode node = mapper.readTree(payload);
                Schema schema = inference.toConnectSchema("payload", node);
                Object value = inference.toConnectData(node, schema);
                org.apache.avro.Schema avro = avroData.fromConnectSchema(schema);
                Object datum = avroData.fromConnectData(schema, value);
                ByteArrayOutputStream bytes = new ByteArrayOutputStream();
                BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(bytes, null);
                new GenericDatumWriter<Object>(avro).write(datum, encoder);
                encoder.flush();
                out.println("S\t" + hex(avro.toString().getBytes(StandardCharsets.UTF_8)) + "\t"
                        + hex(bytes.toByteArray()));
            }
            catch (Exception | StackOverflowError e) {
                out.println("E\t" + hex(String.valueOf(e).getBytes(StandardCharsets.UTF_8)));
            }
        }
    }

    private static byte[] unhex(String text) {
        byte[] bytes = new byte[text.length() / 2];
        for (int i = 0; i < bytes.length; i++) {
            bytes[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
        }
        return bytes;
    }

    private static String hex(byte[] bytes) {
        StringBuilder sb = new StringBuilder(bytes.length * 2);
        for (byte b : bytes) {
            sb.append(String.format("%02x", b & 0xff));
        }
        return sb.toString();
    }
}
