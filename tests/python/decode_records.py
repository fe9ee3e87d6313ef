"""Decodes Kafka records read back by the end-to-end tests with independent implementations:
Python's protobuf runtime (with proto/siphon/outbox/v1/event.proto compiled by grpcio-tools)
and the CloudEvents SDK's Kafka binding.

Usage: decode_records.py PROTO_ROOT --cloudevents {none,binary,structured} [--protobuf]

Reads one JSON object per line on stdin: {"key": hex|null, "value": hex|null,
"headers": [[name, hex|null], ...]}. Writes one JSON object per line on stdout:
{"protobuf": {...} | null, "cloudevent": {"attributes": {...}, "data": ...} | null}.
Protobuf data (the value, or the CloudEvent's data) is decoded when --protobuf is given.
"""

import argparse
import atexit
import base64
import json
import os
import shutil
import sys
import tempfile

import grpc_tools
from grpc_tools import protoc


def compile_proto(proto_root):
    out = tempfile.mkdtemp(prefix="siphon-proto-")
    # The generated module is loaded before the script exits; its directory goes then.
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    status = protoc.main(
        [
            "protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={out}",
            "siphon/outbox/v1/event.proto",
        ]
    )
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    sys.path.insert(0, out)
    from siphon.outbox.v1 import event_pb2  # noqa: E402

    return event_pb2


def outbox_event(event_pb2, data):
    message = event_pb2.OutboxEvent()
    message.ParseFromString(data)
    # Every field, explicitly, so a renamed or renumbered field shows.
    return {
        "id": message.id,
        "aggregate_type": message.aggregate_type,
        "aggregate_id": message.aggregate_id,
        "type": message.type,
        "payload_hex": message.payload.hex(),
        "content_type": message.content_type,
        "has_timestamp": message.HasField("timestamp"),
        "timestamp_seconds": message.timestamp.seconds,
        "timestamp_nanos": message.timestamp.nanos,
        "timestamp_rfc3339": message.timestamp.ToJsonString()
        if message.HasField("timestamp")
        else None,
        "commit_lsn": message.source.commit_lsn,
        "lsn": message.source.lsn,
        "xid": message.source.xid,
        "table": message.source.table,
        "fields": dict(message.fields),
        "has_payload": message.has_payload,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("proto_root")
    parser.add_argument("--cloudevents", choices=["none", "binary", "structured"], default="none")
    parser.add_argument("--protobuf", action="store_true")
    args = parser.parse_args()

    event_pb2 = compile_proto(args.proto_root) if args.protobuf else None
    from cloudevents.kafka import KafkaMessage, from_binary, from_structured

    identity = lambda data: data  # noqa: E731

    for line in sys.stdin:
        if not line.strip():
            continue
        record = json.loads(line)
        key = bytes.fromhex(record["key"]) if record["key"] is not None else None
        value = bytes.fromhex(record["value"]) if record["value"] is not None else None
        headers = {
            name: bytes.fromhex(v) if v is not None else b"" for name, v in record["headers"]
        }
        out = {"protobuf": None, "cloudevent": None}

        data = value
        if args.cloudevents == "binary":
            event = from_binary(KafkaMessage(headers, key, value), data_unmarshaller=identity)
            data = event.get_data()
            attributes = dict(event.get_attributes())
        elif args.cloudevents == "structured":
            # The SDK copies every header into the attributes, and the content-type header
            # (the event format's media type) over datacontenttype: give it none, the test
            # checks the headers itself.
            event = from_structured(KafkaMessage({}, key, value), data_unmarshaller=identity)
            data = event.get_data()
            attributes = dict(event.get_attributes())
        if args.cloudevents != "none":
            attributes.pop("partitionkey", None)
            if isinstance(data, (bytes, bytearray)) and event_pb2 is None:
                shown = {"base64": base64.b64encode(data).decode()}
                if attributes.get("datacontenttype") == "application/json":
                    shown = json.loads(data)
            else:
                shown = data if not isinstance(data, (bytes, bytearray)) else None
            out["cloudevent"] = {"attributes": attributes, "data": shown}

        if event_pb2 is not None and isinstance(data, (bytes, bytearray)):
            out["protobuf"] = outbox_event(event_pb2, bytes(data))

        print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
