"""Decodes Avro record values as Confluent's Python client reads them: its AvroDeserializer,
which looks the writer's schema up by the id in the frame with its own registry client.

Usage: decode_avro.py REGISTRY_URL TOPIC [--keys]

Reads one JSON object per line on stdin: {"key": hex, "value": hex}. Writes one JSON object per
line on stdout: {"value": the decoded value, "schema_id": the id in the frame}; with --keys also
"key" (the key decoded the same way, as the key of TOPIC) and "key_schema_id".
"""

import json
import struct
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main():
    url, topic = sys.argv[1], sys.argv[2]
    keys = "--keys" in sys.argv[3:]
    client = SchemaRegistryClient({"url": url})
    deserializer = AvroDeserializer(client)
    context = SerializationContext(topic, MessageField.VALUE)
    key_context = SerializationContext(topic, MessageField.KEY)
    for line in sys.stdin:
        record = json.loads(line)
        value = bytes.fromhex(record["value"])
        (schema_id,) = struct.unpack(">I", value[1:5])
        decoded = {"value": deserializer(value, context), "schema_id": schema_id}
        if keys:
            key = bytes.fromhex(record["key"])
            (decoded["key_schema_id"],) = struct.unpack(">I", key[1:5])
            decoded["key"] = deserializer(key, key_context)
        print(json.dumps(decoded))


if __name__ == "__main__":
    main()
