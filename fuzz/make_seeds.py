#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (called by scripts/fuzz.sh).

usage: make_seeds.py FIXTURES_DIR PGOUTPUT_CORPUS_DIR ROUTER_CORPUS_DIR

pgoutput_decode: each captured fixture (crates/pgoutput/tests/fixtures/*.hex: one message in
hex per line, after comment lines starting with '#') becomes one seed holding the whole
sequence, each message preceded by its length as a big-endian u16 (the layout the target
splits its input by), plus one seed per distinct message, as is.

router_route: a few hand-made inputs, encoded the way `arbitrary` 1.x decodes the target's
`Input` (see fuzz_targets/router_route.rs; the field order below must follow it).
"""

import hashlib
import pathlib
import struct
import sys


def write(directory, name, data):
    path = directory / name
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


def fixture_messages(path):
    messages = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            messages.append(bytes.fromhex(line))
        except ValueError as e:
            sys.exit(f"{path}:{number}: not a hex message: {e}")
    return messages


def pgoutput_seeds(fixtures, out):
    files = sorted(fixtures.glob("*.hex"))
    if not files:
        sys.exit(f"no *.hex fixtures in {fixtures}")
    singles = {}
    for path in files:
        messages = fixture_messages(path)
        sequence = b"".join(struct.pack(">H", len(m)) + m for m in messages)
        write(out, f"fixture-{path.stem}", sequence)
        for m in messages:
            singles.setdefault(m, f"message-{path.stem}-{hashlib.sha1(m).hexdigest()[:12]}")
    for m, name in singles.items():
        write(out, name, m)
    return len(files) + len(singles)


class Arb:
    """Builds bytes that `arbitrary::Unstructured` decodes into the values pushed, in order.

    Integers are little-endian; an enum variant is a u32 `x` with `x * variants >> 32 ==
    index`; a collection element is preceded by a byte whose low bit says "one more"; a
    string or byte slice takes its length from the end of the remaining data (1 byte while
    at most 256 bytes remain, 2 bytes while at most 65537 do), and its bytes from the front.
    """

    def __init__(self):
        self.ops = []  # ("front", bytes) or ("len", n)

    def raw(self, b):
        self.ops.append(("front", bytes(b)))

    def u8(self, v):
        self.raw(struct.pack("<B", v))

    def boolean(self, v):
        self.u8(1 if v else 0)

    def u32(self, v):
        self.raw(struct.pack("<I", v))

    def i32(self, v):
        self.raw(struct.pack("<i", v))

    def variant(self, index, count):
        self.u32(((2 * index + 1) << 32) // (2 * count))

    def more(self, yes=True):
        self.boolean(yes)

    def bytes_(self, b):
        self.ops.append(("len", len(b)))
        self.raw(b)

    def string(self, s):
        self.bytes_(s.encode())

    def build(self):
        lens = [i for i, (kind, _) in enumerate(self.ops) if kind == "len"]
        widths = {i: 1 for i in lens}
        while True:
            total = sum(len(v) for k, v in self.ops if k == "front") + sum(widths.values())
            remaining, changed = total, False
            for i, (kind, value) in enumerate(self.ops):
                if kind == "front":
                    remaining -= len(value)
                    continue
                want = 1 if remaining <= 256 else 2 if remaining <= 65537 else None
                if want is None:
                    raise ValueError("seed too large")
                if want != widths[i]:
                    widths[i], changed = want, True
                    break
                remaining -= want
            if not changed:
                break
        front, back, remaining = b"", [], total
        for i, (kind, value) in enumerate(self.ops):
            if kind == "front":
                front += value
                remaining -= len(value)
                continue
            width = widths[i]
            max_size = remaining - width
            if remaining < 2 or value > max_size:
                raise ValueError("length does not fit")
            # Bytes read: as many as the range needs, big-endian, from the start of the
            # `width` bytes taken off the end.
            used = sum(1 for k in range(width) if (max_size >> (8 * k)) > 0)
            chunk = value.to_bytes(used, "big") + bytes(width - used)
            back.append(chunk)
            remaining -= width
        return front + b"".join(reversed(back))


# Variant indexes, in the order the target declares them.
PICK_RANDOM, PICK_VARIANTS = 2, 3
OPTION_VALUE_OTHER, OPTION_VALUE_VARIANTS = 1, 2
TYPE_OID_RANDOM, TYPE_OID_VARIANTS = 1, 2
VALUE_NULL, VALUE_TOAST, VALUE_TEXT, VALUE_BINARY, VALUE_VARIANTS = 0, 1, 3, 4, 5
CHANGE_INSERT, CHANGE_UPDATE, CHANGE_DELETE, CHANGE_VARIANTS = 0, 1, 2, 3
ENCODINGS = ["json", "string", "json-schemas", "binary"]

UUID, VARCHAR, TEXT, JSONB, INT4, INT8, BOOL, FLOAT8, BYTEA, TIMESTAMPTZ = (
    2950, 1043, 25, 3802, 23, 20, 16, 701, 17, 1184)


def pick(a, s):
    a.variant(PICK_RANDOM, PICK_VARIANTS)
    a.string(s)


def row(a, values, fit=False):
    for v in values:
        a.more()
        if v is None:
            a.variant(VALUE_NULL, VALUE_VARIANTS)
        elif v == "toast":
            a.variant(VALUE_TOAST, VALUE_VARIANTS)
        elif isinstance(v, bytes):
            a.variant(VALUE_BINARY, VALUE_VARIANTS)
            a.bytes_(v)
        else:
            a.variant(VALUE_TEXT, VALUE_VARIANTS)
            a.string(v)
    a.more(False)
    a.boolean(fit)


def router_input(options, columns, changes, key="json", value="json", context=None,
                 namespace="public", table="outbox"):
    """One `Input` of fuzz_targets/router_route.rs, field by field."""
    a = Arb()
    for name, option_value in options:  # options
        a.more()
        pick(a, name)
        a.variant(OPTION_VALUE_OTHER, OPTION_VALUE_VARIANTS)
        pick(a, option_value)
    a.more(False)
    a.variant(ENCODINGS.index(key), len(ENCODINGS))  # key
    a.variant(ENCODINGS.index(value), len(ENCODINGS))  # value
    a.boolean(context is not None)  # context
    if context is not None:
        a.string(context)
    a.u32(16400)  # relation_id
    a.string(namespace)
    a.string(table)
    a.u8(0)  # replica_identity: default
    for name, type_oid in columns:  # columns
        a.more()
        pick(a, name)
        a.variant(TYPE_OID_RANDOM, TYPE_OID_VARIANTS)
        a.u32(type_oid)
        a.u8(1 if name == "id" else 0)  # flags
        a.i32(-1)  # type_modifier
        a.boolean(name == "id")  # not_null
    a.more(False)
    for kind, *rows in changes:  # changes
        a.more()
        if kind == "insert":
            a.variant(CHANGE_INSERT, CHANGE_VARIANTS)
            row(a, rows[0])
        elif kind == "update":
            a.variant(CHANGE_UPDATE, CHANGE_VARIANTS)
            old, new = rows
            a.boolean(old is not None)
            if old is not None:
                row(a, old)
            row(a, new)
        else:
            a.variant(CHANGE_DELETE, CHANGE_VARIANTS)
            row(a, rows[0], fit=True)
    a.more(False)
    return a.build()


def router_seeds(out):
    outbox = [("id", UUID), ("aggregatetype", VARCHAR), ("aggregateid", VARCHAR),
              ("type", VARCHAR), ("payload", JSONB)]
    event = ["f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "Order", "42", "Created",
             '{"a": [1, {"b": null}], "c": []}']
    seeds = {
        # Debezium's defaults and example outbox table: a record, a skipped update and delete.
        "debezium-default": router_input(
            [], outbox,
            [("insert", event), ("update", None, event), ("delete", [event[0]])]),
        # Renamed columns, a topic regex and template, String encodings and fatal updates.
        "renamed-fatal": router_input(
            [("table.field.event.id", "event_id"), ("route.by.field", "kind"),
             ("route.topic.regex", "(.*)"), ("route.topic.replacement", "events.$1"),
             ("table.op.invalid.behavior", "fatal")],
            [("event_id", INT8), ("kind", TEXT), ("aggregateid", INT4), ("payload", TEXT)],
            [("insert", ["7", "user", "-3", "hi"]),
             ("update", ["7", "user", "-3", "hi"], ["7", "user", "-3", "ho"])],
            key="string", value="string", namespace="app", table="events"),
        # Additional fields in headers, the envelope and the partition, a timestamp column,
        # context headers and the json-schemas encoding.
        "placements": router_input(
            [("table.fields.additional.placement",
              "type:header:eventType,type:envelope,aggregateid:partition"),
             ("table.field.event.timestamp", "created_at"), ("topic.prefix", "siphon")],
            outbox[:3] + [("type", TEXT), ("payload", JSONB), ("created_at", TIMESTAMPTZ)],
            [("insert", ["1", "Order", "5", "Created", '{"x":1}',
                         "2024-01-02 03:04:05.123+00"]),
             ("insert", ["1", "Order", "x", "Created", None, "infinity"])],
            value="json-schemas", context="run-1"),
        # JSON payload expansion, tombstones on an empty payload, non-text keys.
        "expand-json": router_input(
            [("table.expand.json.payload", "true"), ("route.tombstone.on.empty.payload", "true"),
             ("table.json.payload.null.behavior", "optional_bytes"),
             ("table.field.event.key", "k")],
            [("id", INT4), ("aggregatetype", TEXT), ("k", BOOL), ("payload", JSONB)],
            [("insert", ["1", "A", "t", '{"a":{"b":[1,2.5e3,null],"d":[]},"e":"\\u00e9"}']),
             ("insert", ["1", "A", "f", None]), ("insert", ["x", "a b", "true", "[]"]),
             ("insert", ["1", "A", "toast", b"\x00\x01"]), ("insert", ["1", "A"])]),
        # A bytea payload written as is.
        "binary-payload": router_input(
            [], outbox[:4] + [("payload", BYTEA)],
            [("insert", ["1", "Order", "42", "Created", "\\xdeadbeef"])],
            value="binary", key="string"),
    }
    for name, data in seeds.items():
        write(out, f"seed-{name}", data)
    return len(seeds)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    fixtures, pg_out, router_out = (pathlib.Path(p) for p in sys.argv[1:])
    pg_out.mkdir(parents=True, exist_ok=True)
    router_out.mkdir(parents=True, exist_ok=True)
    n_pg = pgoutput_seeds(fixtures, pg_out)
    n_router = router_seeds(router_out)
    print(f"seeds: {n_pg} for pgoutput_decode, {n_router} for router_route")


if __name__ == "__main__":
    main()
