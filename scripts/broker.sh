#!/usr/bin/env bash
# Run Apache Kafka (KRaft) in the background from the jars scripts/install-kafka.sh caches, for
# the test command's shared broker, the demo and manual use: one node in combined mode
# (broker and controller in one JVM), or a three-node cluster. The settings are those of the
# test harness (tests/src/kafka.rs: COMMON_SETTINGS with SINGLE_NODE_SETTINGS or
# CLUSTER_SETTINGS).
#
# Usage: scripts/broker.sh {start|kill|stop|status} DATADIR PORT
#        scripts/broker.sh {start-cluster|kill-cluster|stop-cluster|status-cluster} DATADIR PORT
#        scripts/broker.sh free-port
#
#   start           start one node (node.id 1, its own quorum of one) with its client listener
#                   on 127.0.0.1:PORT and its controller listener on a free port it picks
#                   (below 32768) and records in DATADIR/controller.port. The first start
#                   formats DATADIR/data (kafka.tools.StorageTool format); later starts keep
#                   every topic and record, also after `kill`. Waits until a Metadata request
#                   to PORT answers and lists the node. Succeeds if it is already running.
#   kill            SIGKILL the node named in DATADIR/kafka.pid and wait for it to exit.
#   stop            SIGTERM it (a controlled shutdown) and wait for it to exit (SIGKILL after
#                   SIPHON_BROKER_STOP_TIMEOUT seconds).
#   status          exit 0 if the node runs and answers a Metadata request listing itself,
#                   3 otherwise.
#   start-cluster   three nodes (node.id 1, 2, 3) in one static controller quorum, client
#                   listeners on PORT, PORT+1, PORT+2, controller listeners on free ports picked
#                   on the first start; node N lives in DATADIR/nodeN. Replication factor 3,
#                   min.insync.replicas 2, no unclean leader election, short session timeouts.
#                   Waits until every node answers a Metadata request listing all three.
#   free-port       print a port in 20000-32767 that 127.0.0.1 can bind now (no DATADIR, PORT).
#   kill-cluster, stop-cluster, status-cluster
#                   kill, stop or check all three nodes.
#
# A cluster member's directory takes the single-node commands with its own port, to kill and
# restart one node: `scripts/broker.sh kill DATADIR/node2 $((PORT + 1))`, then `start` with
# the same arguments (which waits until it lists itself again).
#
# Each node's directory holds server.properties, node.conf (what start recorded), data/ (the
# log directory), kafka.pid and kafka.log (stdout and stderr, appended across restarts; the
# logging configuration is scripts/kafka/log4j2.yaml). Every JVM carries
# -Dsiphon.test.kafka=<node directory>, so a stray one can be found.
#
# Ports must be below 32768: the ephemeral range (32768-60999 on Linux by default) is where
# the kernel picks the local ports of outgoing connections, which could take a broker's port
# while it is down.
#
# Environment:
#   SIPHON_BROKER_HEAP       heap (and any other added) options of each JVM (default -Xmx1g; the
#                           other JVM options are those of Kafka's bin/kafka-run-class.sh: G1, full
#                           JIT; scripts/test.sh adds -XX:TieredStopAtLevel=1)
#   SIPHON_BROKER_LIBS       the Kafka jar directory (default
#                           ${SIPHON_CACHE_DIR:-$HOME/.cache/siphon}/kafka-4.4.0/libs, which
#                           scripts/install-kafka.sh fills)
#   SIPHON_BROKER_JAVA       the java binary (default: java on the PATH)
#   SIPHON_BROKER_LOG_LEVEL  the broker's root log level (default INFO)
#   SIPHON_BROKER_READY_TIMEOUT  seconds start may wait for the Metadata answer (default 120)
#   SIPHON_BROKER_STOP_TIMEOUT   seconds stop waits after SIGTERM before SIGKILL (default 120)
# (Named SIPHON_BROKER_*: Siphon reads SIPHON_KAFKA_<KEY> as its own [kafka] settings.)
# Needs python3 (the Metadata request).
set -euo pipefail

KAFKA_VERSION=4.4.0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

# The harness's settings (tests/src/kafka.rs), kept in step with it.
COMMON_SETTINGS=(
    process.roles=broker,controller
    controller.listener.names=CONTROLLER
    listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
    inter.broker.listener.name=PLAINTEXT
    group.initial.rebalance.delay.ms=0
    offsets.topic.num.partitions=5
    transaction.state.log.num.partitions=5
    num.partitions=1
    auto.create.topics.enable=true
    log.segment.bytes=16777216
)
SINGLE_NODE_SETTINGS=(
    offsets.topic.replication.factor=1
    transaction.state.log.replication.factor=1
    transaction.state.log.min.isr=1
    share.coordinator.state.topic.replication.factor=1
    share.coordinator.state.topic.min.isr=1
)
CLUSTER_SETTINGS=(
    default.replication.factor=3
    min.insync.replicas=2
    unclean.leader.election.enable=false
    offsets.topic.replication.factor=3
    transaction.state.log.replication.factor=3
    transaction.state.log.min.isr=2
    share.coordinator.state.topic.replication.factor=3
    share.coordinator.state.topic.min.isr=2
    broker.session.timeout.ms=3000
    broker.heartbeat.interval.ms=500
    replica.lag.time.max.ms=4000
    controller.quorum.election.timeout.ms=1000
    controller.quorum.fetch.timeout.ms=2000
)
CLUSTER_NODES=3

die() {
    printf 'broker.sh: ERROR: %s\n' "$*" >&2
    exit 1
}

usage() {
    echo "usage: $0 {start|kill|stop|status} DATADIR PORT" >&2
    echo "       $0 {start-cluster|kill-cluster|stop-cluster|status-cluster} DATADIR PORT" >&2
    echo "       $0 free-port" >&2
    exit 2
}

# A port in 20000-32767 that 127.0.0.1 can bind now and that is none of the arguments.
pick_port() {
    python3 - "$@" <<'PY'
import random, socket, sys
taken = {int(p) for p in sys.argv[1:]}
for _ in range(1000):
    port = random.randint(20000, 32767)
    if port in taken:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    sys.exit(0)
sys.exit("no free port below 32768 on 127.0.0.1")
PY
}

# `free-port`: print a free port below the ephemeral range (for the scripts that start a broker).
if [[ ${1:-} == free-port && $# -eq 1 ]]; then
    pick_port
    exit
fi
[[ $# -eq 3 ]] || usage
cmd=$1
port=$3
case $cmd in
*-cluster) last_port=$((${port//[!0-9]/0} + CLUSTER_NODES - 1)) ;;
*) last_port=${port//[!0-9]/0} ;;
esac
if ! [[ $port =~ ^[0-9]{1,5}$ ]] || ((port < 1 || last_port > 32767)); then
    die "invalid port '$port': the client ports must lie in 1-32767 (below the ephemeral range)"
fi
if [[ $cmd == start || $cmd == start-cluster ]]; then
    mkdir -p "$2" || die "cannot create DATADIR '$2'"
fi
datadir=$(cd "$2" 2>/dev/null && pwd -P) || {
    [[ $cmd == status* ]] && {
        echo "broker.sh: not running"
        exit 3
    }
    [[ $cmd == kill* || $cmd == stop* ]] && {
        echo "broker.sh: not running"
        exit 0
    }
    die "no such DATADIR '$2'"
}

cache_dir=${SIPHON_CACHE_DIR:-${HOME:-/root}/.cache/siphon}
libs=${SIPHON_BROKER_LIBS:-$cache_dir/kafka-$KAFKA_VERSION/libs}
java=${SIPHON_BROKER_JAVA:-java}
read -r -a heap <<<"${SIPHON_BROKER_HEAP:--Xmx1g}"
ready_timeout=${SIPHON_BROKER_READY_TIMEOUT:-120}
[[ $ready_timeout =~ ^[0-9]+$ ]] || die "SIPHON_BROKER_READY_TIMEOUT must be a number of seconds"

need_kafka() {
    [[ -f $libs/kafka_2.13-$KAFKA_VERSION.jar ]] ||
        die "Apache Kafka $KAFKA_VERSION not found in $libs; run scripts/install-kafka.sh (or set SIPHON_BROKER_LIBS)"
    command -v "$java" >/dev/null 2>&1 || die "'$java' not found: Kafka needs a Java 17+ runtime"
    command -v python3 >/dev/null 2>&1 || die "python3 not found (it makes the Metadata request)"
}

# ------------------------------------------------------------------ processes ----

# Running and not a zombie (a killed child of init may linger until reaped).
proc_running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# The pid in node directory $1's pid file, if that process is its JVM (a recycled pid is not:
# its command line must carry the node's marker).
node_pid() {
    local dir=$1 pid
    [[ -f $dir/kafka.pid ]] || return 1
    pid=$(<"$dir/kafka.pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    proc_running "$pid" || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "-Dsiphon.test.kafka=$dir" || return 1
    printf '%s\n' "$pid"
}

# A TCP connection to 127.0.0.1:$1 succeeds.
port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}


# The broker ids a Metadata request (v1, no topics) to 127.0.0.1:$1 lists, space-separated;
# fails if there is no well-formed answer within 2 s.
metadata_brokers() {
    python3 - "$1" <<'PY'
import socket, struct, sys
port = int(sys.argv[1])
client = b"broker.sh"
correlation = 0x51504E
# Request header v1 (api key 3 = Metadata, version 1, correlation id, client id), then an
# empty topic array: metadata for no topics, which still lists the brokers.
request = struct.pack(">hhih", 3, 1, correlation, len(client)) + client + struct.pack(">i", 0)
try:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(struct.pack(">i", len(request)) + request)
        def read(n):
            buf = b""
            while len(buf) < n:
                chunk = s.recv(n - len(buf))
                if not chunk:
                    raise EOFError("connection closed before the answer")
                buf += chunk
            return buf
        (size,) = struct.unpack(">i", read(4))
        if not 8 <= size <= 1 << 20:
            raise ValueError(f"answer of {size} bytes")
        body = read(size)
    got, count = struct.unpack_from(">ii", body, 0)
    if got != correlation or not 0 <= count <= 1000:
        raise ValueError("malformed Metadata answer")
    off, ids = 8, []
    for _ in range(count):
        node, host_len = struct.unpack_from(">ih", body, off)
        off += 6 + host_len
        _port, rack_len = struct.unpack_from(">ih", body, off)
        off += 6 + max(rack_len, 0)
        ids.append(node)
    struct.unpack_from(">ii", body, off)  # controller id, topic count: the answer is whole
except Exception as e:
    sys.exit(f"Metadata request to 127.0.0.1:{port}: {e}")
print(" ".join(str(i) for i in sorted(ids)))
PY
}

# Whether the Metadata answer from 127.0.0.1:$1 lists every broker id in $2 (space-separated).
lists_brokers() {
    local listed want
    listed=" $(metadata_brokers "$1" 2>/dev/null) " || return 1
    for want in $2; do
        [[ $listed == *" $want "* ]] || return 1
    done
}

# ----------------------------------------------------------------- node files ----

# conf_get DIR KEY: a value node.conf recorded.
conf_get() {
    local line
    [[ -f $1/node.conf ]] || return 1
    line=$(grep -m1 "^$2=" "$1/node.conf") || return 1
    printf '%s\n' "${line#*=}"
}

# write_node DIR MODE ID PORT CONTROLLER_PORT VOTERS SETTINGS...: node.conf and
# server.properties of one node.
write_node() {
    local dir=$1 mode=$2 id=$3 node_port=$4 controller_port=$5 voters=$6
    shift 6
    mkdir -p "$dir/data"
    printf 'mode=%s\nid=%s\nport=%s\ncontroller_port=%s\nvoters=%s\n' \
        "$mode" "$id" "$node_port" "$controller_port" "$voters" >"$dir/node.conf.tmp"
    mv "$dir/node.conf.tmp" "$dir/node.conf"
    {
        echo "# Written by scripts/broker.sh ($mode node $id); rewritten by each start."
        echo "node.id=$id"
        echo "controller.quorum.voters=$voters"
        echo "listeners=PLAINTEXT://127.0.0.1:$node_port,CONTROLLER://127.0.0.1:$controller_port"
        echo "advertised.listeners=PLAINTEXT://127.0.0.1:$node_port"
        echo "log.dirs=$dir/data"
        printf '%s\n' "${COMMON_SETTINGS[@]}" "$@"
    } >"$dir/server.properties"
}

java_cmd() {
    local dir=$1
    shift
    # Beyond the heap, the options of Kafka's own bin/kafka-run-class.sh.
    printf '%s\0' "$java" "${heap[@]}" -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
        "-Dsiphon.test.kafka=$dir" "-Dlog4j2.configurationFile=$here/kafka/log4j2.yaml" \
        -cp "$libs/*" "$@"
}

new_cluster_id() {
    local id
    id=$("$java" -cp "$libs/*" kafka.tools.StorageTool random-uuid 2>/dev/null) || true
    [[ $id =~ ^[A-Za-z0-9_-]{22}$ ]] || die "kafka.tools.StorageTool random-uuid failed"
    printf '%s\n' "$id"
}

# Formats node directory $1 for cluster id $2 unless it holds a formatted log directory.
format_node() {
    local dir=$1 cluster_id=$2 out
    [[ -f $dir/data/meta.properties ]] && return 0
    local -a cmd
    mapfile -d '' cmd < <(java_cmd "$dir" kafka.tools.StorageTool format --ignore-formatted \
        -t "$cluster_id" -c "$dir/server.properties")
    out=$(cd "$dir" && "${cmd[@]}" </dev/null 2>&1) || {
        printf '%s\n' "$out" >&2
        die "formatting $dir failed"
    }
}

# Starts the JVM of node directory $1 (configured, formatted, not running) without waiting.
spawn_node() {
    local dir=$1 node_port controller_port
    node_port=$(conf_get "$dir" port)
    controller_port=$(conf_get "$dir" controller_port)
    port_open "$node_port" && die "127.0.0.1:$node_port is already in use"
    port_open "$controller_port" && die "127.0.0.1:$controller_port (controller) is already in use"
    local -a cmd
    mapfile -d '' cmd < <(java_cmd "$dir" kafka.Kafka "$dir/server.properties")
    (
        cd "$dir"
        exec setsid "${cmd[@]}" </dev/null >>"$dir/kafka.log" 2>&1
    ) &
    echo "$!" >"$dir/kafka.pid"
}

# wait_ready DIR IDS: waits until node DIR answers Metadata listing every id in IDS.
wait_ready() {
    local dir=$1 ids=$2 node_port pid deadline=$((SECONDS + ready_timeout))
    node_port=$(conf_get "$dir" port)
    pid=$(<"$dir/kafka.pid")
    while ((SECONDS < deadline)); do
        if ! proc_running "$pid"; then
            tail -n 30 "$dir/kafka.log" >&2 || true
            rm -f "$dir/kafka.pid"
            die "Kafka in $dir exited during startup (log: $dir/kafka.log)"
        fi
        lists_brokers "$node_port" "$ids" && return 0
        sleep 0.2
    done
    tail -n 30 "$dir/kafka.log" >&2 || true
    die "Kafka on 127.0.0.1:$node_port did not answer Metadata listing broker(s) $ids within ${ready_timeout} s (log: $dir/kafka.log; it is left running)"
}

# kill_node DIR SIGNAL WAIT_SECONDS: signals the node and waits for it to exit (SIGKILL after
# WAIT_SECONDS if it is still there).
kill_node() {
    local dir=$1 signal=$2 wait_secs=$3 pid deadline
    if ! pid=$(node_pid "$dir"); then
        rm -f "$dir/kafka.pid"
        echo "broker.sh: $dir: not running"
        return 0
    fi
    kill "-$signal" "$pid" 2>/dev/null || true
    deadline=$((SECONDS + wait_secs))
    while proc_running "$pid" && ((SECONDS < deadline)); do
        sleep 0.05
    done
    if proc_running "$pid" && [[ $signal != KILL ]]; then
        echo "broker.sh: $dir: pid $pid still running ${wait_secs} s after SIG$signal; SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        while proc_running "$pid" && ((SECONDS < deadline)); do
            sleep 0.05
        done
    fi
    proc_running "$pid" && die "pid $pid survived SIGKILL"
    rm -f "$dir/kafka.pid"
    echo "broker.sh: $dir: stopped pid $pid (SIG$signal)"
}

stop_timeout() {
    local t=${SIPHON_BROKER_STOP_TIMEOUT:-120}
    [[ $t =~ ^[0-9]+$ ]] || die "SIPHON_BROKER_STOP_TIMEOUT must be a number of seconds"
    printf '%s\n' "$t"
}

# ------------------------------------------------------------------- commands ----

start_single() {
    local dir=$datadir pid
    if pid=$(node_pid "$dir"); then
        echo "broker.sh: already running (pid $pid, 127.0.0.1:$(conf_get "$dir" port))"
        return 0
    fi
    [[ -d $dir/node1 && ! -f $dir/node.conf ]] &&
        die "$dir holds a cluster: use start-cluster (or start on one of its node directories)"
    need_kafka
    local mode id controller_port voters
    mode=$(conf_get "$dir" mode || echo single)
    if [[ $mode == cluster ]]; then
        # A member of a cluster restarted on its own: its recorded configuration stands.
        [[ $(conf_get "$dir" port) == "$port" ]] ||
            die "$dir is cluster node $(conf_get "$dir" id) on port $(conf_get "$dir" port), not $port"
        [[ -f $dir/data/meta.properties ]] || die "$dir was never formatted; use start-cluster"
        id=$(conf_get "$dir" id)
    else
        id=1
        controller_port=$(conf_get "$dir" controller_port || true)
        if [[ -z $controller_port ]] || port_open "$controller_port"; then
            # A single voter's address comes from the configuration only (a static quorum),
            # so a node whose controller port was taken meanwhile moves to another one.
            controller_port=$(pick_port "$port") || die "no free controller port"
        fi
        voters=1@127.0.0.1:$controller_port
        write_node "$dir" single 1 "$port" "$controller_port" "$voters" "${SINGLE_NODE_SETTINGS[@]}"
        if [[ ! -f $dir/data/meta.properties ]]; then
            [[ -f $dir/cluster.id ]] || new_cluster_id >"$dir/cluster.id"
            format_node "$dir" "$(<"$dir/cluster.id")"
        fi
    fi
    spawn_node "$dir"
    wait_ready "$dir" "$id"
    echo "broker.sh: running: 127.0.0.1:$port (pid $(<"$dir/kafka.pid"), Apache Kafka $KAFKA_VERSION, node $id, log $dir/kafka.log)"
}

status_single() {
    local pid
    if pid=$(node_pid "$datadir") && lists_brokers "$port" "$(conf_get "$datadir" id || echo 1)"; then
        echo "broker.sh: running (pid $pid, 127.0.0.1:$port)"
        exit 0
    fi
    echo "broker.sh: not running"
    exit 3
}

node_dir() { printf '%s/node%s\n' "$datadir" "$1"; }

all_ids() { seq -s ' ' 1 "$CLUSTER_NODES"; }

start_cluster() {
    local i dir ids
    ids=$(all_ids)
    [[ -f $datadir/node.conf ]] && die "$datadir holds a single node: use start"
    need_kafka
    # Controller ports: picked once, then fixed (every voter names every other).
    local -a controllers=()
    if [[ -f $datadir/controller.ports ]]; then
        read -r -a controllers <"$datadir/controller.ports"
        [[ ${#controllers[@]} -eq $CLUSTER_NODES ]] || die "$datadir/controller.ports is malformed"
        [[ $(conf_get "$(node_dir 1)" port) == "$port" ]] ||
            die "$datadir is a cluster on port $(conf_get "$(node_dir 1)" port), not $port"
    else
        local taken=()
        for ((i = 0; i < CLUSTER_NODES; i++)); do
            taken+=($((port + i)))
        done
        local picked
        for ((i = 0; i < CLUSTER_NODES; i++)); do
            picked=$(pick_port "${taken[@]}" "${controllers[@]}") || die "no free controller port"
            controllers+=("$picked")
        done
        echo "${controllers[*]}" >"$datadir/controller.ports"
    fi
    local voters="" sep=""
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        voters+="$sep$((i + 1))@127.0.0.1:${controllers[i]}"
        sep=,
    done
    [[ -f $datadir/cluster.id ]] || new_cluster_id >"$datadir/cluster.id"
    local cluster_id
    cluster_id=$(<"$datadir/cluster.id")
    local -a started=()
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        dir=$(node_dir $((i + 1)))
        if node_pid "$dir" >/dev/null; then
            continue
        fi
        write_node "$dir" cluster $((i + 1)) $((port + i)) "${controllers[i]}" "$voters" \
            "${CLUSTER_SETTINGS[@]}"
        format_node "$dir" "$cluster_id" &
        started+=("$dir")
    done
    wait_all_or_die "formatting"
    for dir in "${started[@]}"; do
        spawn_node "$dir"
    done
    for ((i = 1; i <= CLUSTER_NODES; i++)); do
        wait_ready "$(node_dir "$i")" "$ids"
    done
    for ((i = 1; i <= CLUSTER_NODES; i++)); do
        dir=$(node_dir "$i")
        echo "broker.sh: node $i running: 127.0.0.1:$(conf_get "$dir" port) (pid $(<"$dir/kafka.pid"), log $dir/kafka.log)"
    done
    local bootstrap="" sep=""
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        bootstrap+="${sep}127.0.0.1:$((port + i))"
        sep=,
    done
    echo "broker.sh: cluster of $CLUSTER_NODES (Apache Kafka $KAFKA_VERSION) running: bootstrap $bootstrap"
}

# Waits for every background job; dies naming WHAT if one failed.
wait_all_or_die() {
    local job rc=0
    for job in $(jobs -p); do
        wait "$job" || rc=1
    done
    ((rc == 0)) || die "$1 failed"
}

kill_cluster() {
    local signal=$1 wait_secs=$2 i
    for ((i = 1; i <= CLUSTER_NODES; i++)); do
        [[ -d $(node_dir "$i") ]] || continue
        kill_node "$(node_dir "$i")" "$signal" "$wait_secs" &
    done
    wait_all_or_die "stopping the cluster"
}

status_cluster() {
    local i dir pid bad=0 ids
    ids=$(all_ids)
    for ((i = 1; i <= CLUSTER_NODES; i++)); do
        dir=$(node_dir "$i")
        if pid=$(node_pid "$dir") && lists_brokers $((port + i - 1)) "$ids"; then
            echo "broker.sh: node $i running (pid $pid, 127.0.0.1:$((port + i - 1)))"
        else
            echo "broker.sh: node $i not running (or not listing all $CLUSTER_NODES brokers)"
            bad=1
        fi
    done
    ((bad == 0)) || exit 3
}

case $cmd in
start) start_single ;;
kill) kill_node "$datadir" KILL 10 ;;
stop) kill_node "$datadir" TERM "$(stop_timeout)" ;;
status) status_single ;;
start-cluster) start_cluster ;;
kill-cluster) kill_cluster KILL 10 ;;
stop-cluster) kill_cluster TERM "$(stop_timeout)" ;;
status-cluster) status_cluster ;;
*) usage ;;
esac
