#!/usr/bin/env bash
# Run a local Apache Cassandra 5.0 test cluster from Maven Central jars (no Docker, no tarball).
#
#   scripts/cassandra.sh start  [--nodes N] [--dcs D] [--keep-data]
#                                                           start N nodes (default 1) in D datacenters
#                                                           (default 1), wait until CQL answers
#   scripts/cassandra.sh stop                               stop every node of the cluster (SIGTERM, then SIGKILL)
#   scripts/cassandra.sh status [--nodes N]                 print each node's state; exit 0 only if all are up
#   scripts/cassandra.sh errors [--nodes N]                 each node's ERROR/WARN count and last ERROR lines (for a failed test's log)
#   scripts/cassandra.sh kill    I                          SIGKILL node I (its data stays: a crash)
#   scripts/cassandra.sh pause   I                          SIGSTOP node I (alive to the kernel, silent to peers)
#   scripts/cassandra.sh resume  I                          SIGCONT node I
#   scripts/cassandra.sh restart I                          start node I again from its own data, wait for CQL
#
# The per-node commands are the fault injector of `make faults` (faults/): they act on one node of
# the cluster the last `start` configured and never touch the others.
#
# Node i (1..N) listens on 127.0.0.i (see IDEMD_CASSANDRA_ADDRESS_FORMAT): CQL 9042, storage 7000.
# Node 1 is the seed.
#
# Datacenters (--dcs 2, e.g. --nodes 4 --dcs 2): the nodes are split in order, the first half in
# `dc1`, the rest in `dc2` (rack `rack1` each), with GossipingPropertyFileSnitch, each datacenter's
# tokens evenly spaced on its own and its first node a seed; keyspaces then need
# NetworkTopologyStrategy (e.g. {'class': 'NetworkTopologyStrategy', 'dc1': 2, 'dc2': 2}). With one
# datacenter (the default) the snitch stays SimpleSnitch and the single datacenter is `datacenter1`.
# Everything lives under $IDEMD_CASSANDRA_HOME (default: <repo>/.cache/cassandra):
#   lib-<version>/            cassandra-all and its runtime jars (fetched once with mvn)
#   lib-<version>/cds/        class-data-sharing archive, written when the first cluster stops
#   nodes/nodeI/              conf/ (cassandra.yaml, logback.xml), data dirs, logs/system.log, stdout.log, pid
#
# Environment overrides:
#   IDEMD_CASSANDRA_HOME           cache/work directory (default <repo>/.cache/cassandra)
#   IDEMD_CASSANDRA_VERSION        cassandra-all version (default 5.0.9)
#   IDEMD_CASSANDRA_HEAP           heap per node, e.g. 1G (default 1G for one node, 768M for more)
#   IDEMD_CASSANDRA_START_TIMEOUT  seconds to wait for each node's CQL port (default 180)
#   IDEMD_CASSANDRA_STOP_TIMEOUT   seconds to wait after SIGTERM before SIGKILL (default 30)
#   IDEMD_CASSANDRA_JVM_OPTS       extra JVM options for every node (split on whitespace), appended last
#   IDEMD_CASSANDRA_CDS            0 disables the class-data-sharing archive (default 1)
#   IDEMD_CASSANDRA_COMMITLOG_SYNC batch (default), periodic or group: see commitlog_sync_yaml
#   IDEMD_CASSANDRA_ADDRESS_FORMAT node i listens on $(printf FORMAT i) (default 127.0.0.%s)
#   IDEMD_CASSANDRA_NETNS_DIR      if set, node i runs in the network namespace <dir>/node<i> (a file
#                                  `nsenter --net=` opens). The fault suite's partition scenarios give
#                                  each node a namespace and an address of its own: Cassandra does not
#                                  bind its outgoing connections, so on one loopback every node's
#                                  packets to node j carry node j's address as their source, and a cut
#                                  between two nodes could not be told from the others.
#   JAVA                           java binary (default: java on PATH; must be Java 17)
#   MVN                            maven binary (default: mvn on PATH)
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd)"

CASSANDRA_VERSION="${IDEMD_CASSANDRA_VERSION:-5.0.9}"
CASS_HOME="${IDEMD_CASSANDRA_HOME:-$REPO_ROOT/.cache/cassandra}"
# Absolute path: it ends up in file:// URLs and in the pid check.
mkdir -p "$CASS_HOME"
CASS_HOME="$(cd -- "$CASS_HOME" && pwd)"
START_TIMEOUT="${IDEMD_CASSANDRA_START_TIMEOUT:-180}"
STOP_TIMEOUT="${IDEMD_CASSANDRA_STOP_TIMEOUT:-30}"
JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"
DEPENDENCY_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

LIB_DIR="$CASS_HOME/lib-$CASSANDRA_VERSION"
NODES_DIR="$CASS_HOME/nodes"
CLUSTER_FILE="$NODES_DIR/cluster.env"
CQL_PORT=9042
STORAGE_PORT=7000
MAX_NODES=9 # 127.0.0.1 .. 127.0.0.9
ADDRESS_FORMAT="${IDEMD_CASSANDRA_ADDRESS_FORMAT:-127.0.0.%s}"
READY_LINE="Starting listening for CQL clients"

log() { printf 'cassandra.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    cat >&2 <<'EOF'
usage: scripts/cassandra.sh start  [--nodes N] [--dcs D] [--keep-data]
       scripts/cassandra.sh stop
       scripts/cassandra.sh status [--nodes N]
       scripts/cassandra.sh errors [--nodes N]
       scripts/cassandra.sh kill|pause|resume|restart I
EOF
    exit 2
}

node_dir() { printf '%s/node%s' "$NODES_DIR" "$1"; }
# shellcheck disable=SC2059 # the format is the point
node_ip() { printf "$ADDRESS_FORMAT" "$1"; }

# The commit log's sync mode (IDEMD_CASSANDRA_COMMITLOG_SYNC): `batch` (the
# default here: fsync before every acknowledgement, what docs/scylla.md tells
# Cassandra users to run), `periodic` (Cassandra's own default, fsync every
# 10 s with sync markers every 100 ms, so a SIGKILL of every replica at once
# loses the last ~100 ms of writes, acknowledged LWTs included; kept for the
# measurement that shows it, `idemd-faults --cassandra-commitlog-sync
# periodic`) or `group` (fsync every 2 ms, acknowledging after it). Every
# test, the bench's raw-LWT baseline included, runs on the default.
commitlog_sync_yaml() {
    case "${IDEMD_CASSANDRA_COMMITLOG_SYNC:-batch}" in
        periodic) printf 'commitlog_sync: periodic\ncommitlog_sync_period: 10000ms' ;;
        batch) printf 'commitlog_sync: batch' ;;
        group) printf 'commitlog_sync: group\ncommitlog_sync_group_window: 2ms' ;;
        *) die "IDEMD_CASSANDRA_COMMITLOG_SYNC must be periodic, batch or group" ;;
    esac
}

# ---------------------------------------------------------------------------------------------
# Dependencies: cassandra-all + runtime jars, copied out of the local Maven repository once.
# ---------------------------------------------------------------------------------------------
fetch_jars() {
    if [[ -f "$LIB_DIR/.complete" ]]; then
        return 0
    fi
    command -v "$MVN" >/dev/null 2>&1 || die "mvn not found (needed once to fetch Cassandra jars)"
    local work="$CASS_HOME/fetch"
    local tmp_lib="$LIB_DIR.partial"
    mkdir -p "$work"
    rm -rf "$tmp_lib"
    cat >"$work/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>idemd.local</groupId>
  <artifactId>cassandra-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>$CASSANDRA_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
    log "fetching org.apache.cassandra:cassandra-all:$CASSANDRA_VERSION and its runtime dependencies (once)..."
    # Native jars for other operating systems are not needed on Linux.
    if ! "$MVN" -B -q -f "$work/pom.xml" "$DEPENDENCY_PLUGIN:copy-dependencies" \
        -DincludeScope=runtime \
        -DexcludeClassifiers=osx-x86_64,osx-aarch_64,windows-x86_64 \
        -DoutputDirectory="$tmp_lib" >"$work/mvn.log" 2>&1; then
        tail -n 40 "$work/mvn.log" >&2
        die "mvn could not fetch the Cassandra jars (full log: $work/mvn.log)"
    fi
    compgen -G "$tmp_lib/cassandra-all-*.jar" >/dev/null || die "cassandra-all jar missing after mvn run"
    touch "$tmp_lib/.complete"
    rm -rf "$LIB_DIR"
    mv "$tmp_lib" "$LIB_DIR"
    log "jars cached in $LIB_DIR ($(find "$LIB_DIR" -name '*.jar' | wc -l) jars)"
}

JAVA_BUILD=""

# Checks that $JAVA is a Java 17 and remembers its exact build (for the class-data-sharing archive).
check_java() {
    command -v "$JAVA" >/dev/null 2>&1 || die "java not found"
    local out ver
    out="$("$JAVA" -version 2>&1)"
    ver="$(awk -F'"' '/version/ {print $2; exit}' <<<"$out")"
    case "$ver" in
        17 | 17.*) ;;
        *) die "Cassandra 5.0 needs Java 17 here; '$JAVA' is version '$ver' (set JAVA=/path/to/java17)" ;;
    esac
    JAVA_BUILD="$(sed -n 's/.*(build \(.*\))$/\1/p' <<<"$out" | head -n 1 | tr -c 'A-Za-z0-9._+\n-' '_')"
}

# Path of the class-data-sharing archive for this JVM build and this jar set.
cds_archive() {
    printf '%s/cds/java-%s.jsa' "$LIB_DIR" "${JAVA_BUILD:-unknown}"
}

# ---------------------------------------------------------------------------------------------
# Per-node configuration
# ---------------------------------------------------------------------------------------------

# Evenly spaced Murmur3 tokens: token_i = -2^63 + (2i+1) * floor((2^63-1)/N), i = 0..N-1.
# Computed by repeated addition so no intermediate value overflows 64-bit bash arithmetic.
node_token() {
    local i=$1 n=$2 half t k
    half=$((9223372036854775807 / n))
    t=$((-9223372036854775807 - 1 + half))
    for ((k = 1; k < i; k++)); do
        t=$((t + half))
        t=$((t + half))
    done
    printf '%s' "$t"
}

# The datacenter (1-based) of node i of n nodes in d datacenters: the nodes in order, split evenly.
node_dc() {
    local i=$1 n=$2 d=$3
    printf '%s' $(((i - 1) * d / n + 1))
}

# The first node of datacenter k of n nodes in d datacenters.
dc_first_node() {
    local k=$1 n=$2 d=$3 i
    for ((i = 1; i <= n; i++)); do
        if (($(node_dc "$i" "$n" "$d") == k)); then
            printf '%s' "$i"
            return
        fi
    done
}

# Seeds: node 1, and the first node of every other datacenter.
seed_list() {
    local n=$1 d=$2 k seeds=""
    for ((k = 1; k <= d; k++)); do
        seeds+="${seeds:+,}$(node_ip "$(dc_first_node "$k" "$n" "$d")"):$STORAGE_PORT"
    done
    printf '%s' "$seeds"
}

write_node_config() {
    local i=$1 n=$2 d=${3:-1} dir ip snitch token rackdc="" j
    dir="$(node_dir "$i")"
    ip="$(node_ip "$i")"
    if ((d > 1)); then
        # Each datacenter's tokens evenly spaced on their own (NetworkTopologyStrategy places
        # replicas per datacenter), offset by the datacenter's number so that no two nodes share one.
        local k first size
        k="$(node_dc "$i" "$n" "$d")"
        first="$(dc_first_node "$k" "$n" "$d")"
        size=0
        for ((j = 1; j <= n; j++)); do
            (($(node_dc "$j" "$n" "$d") == k)) && size=$((size + 1))
        done
        token=$(($(node_token $((i - first + 1)) "$size") + k - 1))
        snitch=GossipingPropertyFileSnitch
        rackdc="dc=dc$k"
    else
        token="$(node_token "$i" "$n")"
        snitch=SimpleSnitch
    fi
    mkdir -p "$dir/conf" "$dir/data" "$dir/commitlog" "$dir/saved_caches" "$dir/hints" "$dir/cdc_raw" "$dir/logs"
    cat >"$dir/conf/cassandra.yaml" <<EOF
# Generated by scripts/cassandra.sh for a local test cluster. Do not use in production.
cluster_name: idemd-test
num_tokens: 1
initial_token: $token
auto_bootstrap: false
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: $snitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "$(seed_list "$n" "$d")"
listen_address: $ip
rpc_address: $ip
storage_port: $STORAGE_PORT
native_transport_port: $CQL_PORT
start_native_transport: true
data_file_directories:
  - $dir/data
commitlog_directory: $dir/commitlog
saved_caches_directory: $dir/saved_caches
hints_directory: $dir/hints
cdc_raw_directory: $dir/cdc_raw
$(commitlog_sync_yaml)
# Fresh 5.0-only cluster: no need to stay readable by 4.x.
storage_compatibility_mode: NONE
# LWT: Paxos v2 needs 2 round trips per conditional write instead of 4.
paxos_variant: v2
cas_contention_timeout: 1000ms
write_request_timeout: 2000ms
read_request_timeout: 5000ms
# Tests drop and truncate tables often: skip the snapshots that would cost.
auto_snapshot: false
concurrent_compactors: 1
EOF
    rm -f "$dir/conf/cassandra-rackdc.properties"
    if [[ -n "$rackdc" ]]; then
        printf '%s\nrack=rack1\n' "$rackdc" >"$dir/conf/cassandra-rackdc.properties"
    fi
    cat >"$dir/conf/logback.xml" <<EOF
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>$dir/logs/system.log</file>
    <append>true</append>
    <encoder>
      <pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern>
    </encoder>
  </appender>
  <root level="INFO">
    <appender-ref ref="FILE"/>
  </root>
</configuration>
EOF
}

# ---------------------------------------------------------------------------------------------
# Process helpers
# ---------------------------------------------------------------------------------------------

# Prints the pid of node i if it runs (pid file present and the process is this node's JVM).
node_pid() {
    local dir pid
    dir="$(node_dir "$1")"
    [[ -f "$dir/cassandra.pid" ]] || return 1
    pid="$(<"$dir/cassandra.pid")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [[ -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "-Dcassandra.config=file://$dir/conf/cassandra.yaml" || return 1
    printf '%s' "$pid"
}

# True if something accepts TCP connections on host:port.
tcp_open() {
    # shellcheck disable=SC2016 # $1/$2 are expanded by the inner bash
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# Real CQL check: send a native-protocol v4 OPTIONS frame, expect a SUPPORTED (0x06) response.
cql_ping() {
    local host=$1 hdr
    # shellcheck disable=SC2016 # $1/$2 are expanded by the inner bash
    hdr="$(timeout 5 bash -c '
        exec 3<>"/dev/tcp/$1/$2" || exit 1
        printf "\x04\x00\x00\x00\x05\x00\x00\x00\x00" >&3
        head -c 9 <&3 | od -An -tx1 | tr -d " \n"
    ' _ "$host" "$CQL_PORT" 2>/dev/null)" || return 1
    [[ "$hdr" == 8400000006* ]]
}

node_up() {
    node_pid "$1" >/dev/null && cql_ping "$(node_ip "$1")"
}

configured_nodes() {
    local n=0
    if [[ -f "$CLUSTER_FILE" ]]; then
        n="$(sed -n 's/^NODES=\([0-9][0-9]*\)$/\1/p' "$CLUSTER_FILE")"
    fi
    printf '%s' "${n:-0}"
}

configured_dcs() {
    local d=""
    if [[ -f "$CLUSTER_FILE" ]]; then
        d="$(sed -n 's/^DCS=\([0-9][0-9]*\)$/\1/p' "$CLUSTER_FILE")"
    fi
    printf '%s' "${d:-1}"
}

all_node_indexes() {
    local d
    for d in "$NODES_DIR"/node*; do
        [[ -d "$d" ]] && printf '%s\n' "${d##*/node}"
    done
    return 0
}

start_node() {
    local i=$1 heap=$2 dir ip jamm pid
    dir="$(node_dir "$i")"
    ip="$(node_ip "$i")"
    if tcp_open "$ip" "$CQL_PORT" || tcp_open "$ip" "$STORAGE_PORT"; then
        log "error: $ip:$CQL_PORT or $ip:$STORAGE_PORT is already in use by a process this script does not manage"
        return 1
    fi
    jamm="$(compgen -G "$LIB_DIR/jamm-*.jar" | head -n 1 || true)"
    # One log per run (the ready check reads it); keep the previous run's log beside it.
    if [[ -s "$dir/logs/system.log" ]]; then
        mv -f "$dir/logs/system.log" "$dir/logs/system.log.1"
    fi
    : >"$dir/logs/system.log"
    local -a opts=(
        -Xms"$heap" -Xmx"$heap" -Xss256k -XX:ErrorFile="$dir/hs_err_pid%p.log"
        -XX:+UseG1GC -XX:+ParallelRefProcEnabled -XX:MaxTenuringThreshold=1 -XX:G1HeapRegionSize=16m
        -XX:G1RSetUpdatingPauseTimePercent=5 -XX:MaxGCPauseMillis=300 -XX:InitiatingHeapOccupancyPercent=70
        -XX:+UseThreadPriorities -XX:+PerfDisableSharedMem -XX:+ExitOnOutOfMemoryError
        # C1 only: on a 2-core box it starts a node with ~35% less CPU, and short test workloads ran
        # faster than with C2 compiling in the background. Override: IDEMD_CASSANDRA_JVM_OPTS=-XX:TieredStopAtLevel=4
        -XX:TieredStopAtLevel=1
        -XX:+UseTLAB -XX:+ResizeTLAB
        -ea -da:net.openhft...
        -Djava.net.preferIPv4Stack=true
        # conf/jvm17-server.options (JPMS + Netty)
        -Djdk.attach.allowAttachSelf=true
        --add-exports java.base/jdk.internal.misc=ALL-UNNAMED
        --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
        --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
        --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
        --add-exports java.sql/java.sql=ALL-UNNAMED
        --add-exports java.base/java.lang.ref=ALL-UNNAMED
        --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
        --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
        --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
        --add-opens java.base/java.lang.module=ALL-UNNAMED
        --add-opens java.base/jdk.internal.loader=ALL-UNNAMED
        --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
        --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
        --add-opens java.base/jdk.internal.math=ALL-UNNAMED
        --add-opens java.base/jdk.internal.module=ALL-UNNAMED
        --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
        --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
        --add-opens java.base/sun.nio.ch=ALL-UNNAMED
        --add-opens java.base/java.io=ALL-UNNAMED
        --add-opens java.base/java.lang.reflect=ALL-UNNAMED
        --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
        --add-opens java.base/java.lang=ALL-UNNAMED
        --add-opens java.base/java.util=ALL-UNNAMED
        -Dio.netty.tryReflectionSetAccessible=true
        -Dio.netty.allocator.useCacheForAllThreads=true
        -Dio.netty.allocator.maxOrder=11
        # Cassandra launcher properties
        -Dcassandra.config="file://$dir/conf/cassandra.yaml"
        -Dcassandra-foreground=yes
        -Dcassandra.storagedir="$dir"
        -Dcassandra.logdir="$dir/logs"
        -Dlogback.configurationFile="$dir/conf/logback.xml"
        # Test-only startup speed-ups
        -Dcassandra.skip_wait_for_gossip_to_settle=0
        -Dcassandra.ring_delay_ms=1000
        -Dcassandra.superuser_setup_delay_ms=0
        # Not -Dcassandra.unsafesystem=true (a common test speed-up): it skips the flushes that make
        # schema changes durable, and a node killed with SIGKILL then restarts without the keyspaces
        # created since its last flush ("keyspace ... does not exist", INCOMPATIBLE_SCHEMA) until
        # schema is pulled again: minutes of failed calls after quorum returns (issue 14).
        # Size thread pools for a small shared test box, whatever the machine has.
        -Dcassandra.available_processors=2
        # Test-only shutdown speed-up: do not wait 2 s for peers to hear about the shutdown
        -Dcassandra.shutdown_announce_in_ms=0
    )
    if [[ -n "$jamm" ]]; then
        opts+=(-javaagent:"$jamm")
    fi
    # GossipingPropertyFileSnitch reads the node's datacenter and rack from here (--dcs).
    if [[ -f "$dir/conf/cassandra-rackdc.properties" ]]; then
        opts+=(-Dcassandra-rackdc.properties="file://$dir/conf/cassandra-rackdc.properties")
    fi
    # Class-data sharing: the first node ever started dumps the loaded classes at exit; later starts map
    # them (a node starts ~30% faster). The JVM skips an archive made for other jars; VerifySharedSpaces
    # makes it skip a damaged one too (checksum), and a crash with the archive deletes it and retries.
    local archive="" using_cds=0
    if [[ "${IDEMD_CASSANDRA_CDS:-1}" != 0 ]]; then
        archive="$(cds_archive)"
        opts+=(-XX:+UnlockDiagnosticVMOptions -XX:+AllowArchivingWithJavaAgent -XX:+VerifySharedSpaces)
        if [[ -s "$archive" ]]; then
            opts+=(-XX:SharedArchiveFile="$archive")
            using_cds=1
        elif ((i == 1)); then
            mkdir -p "${archive%/*}"
            rm -f "$archive.new"
            opts+=(-XX:ArchiveClassesAtExit="$archive.new")
            printf '%s\n' "$archive" >"$dir/cds.pending"
        fi
    fi
    if [[ -n "${IDEMD_CASSANDRA_JVM_OPTS:-}" ]]; then
        local -a extra
        read -r -a extra <<<"$IDEMD_CASSANDRA_JVM_OPTS"
        opts+=("${extra[@]}")
    fi
    # Cassandra calls mlockall() unconditionally. As root (CI) that succeeds, pins the whole heap in RAM
    # and costs seconds at startup; without CAP_IPC_LOCK it fails harmlessly under the memlock limit.
    local -a launcher=(setsid)
    if [[ -n "${IDEMD_CASSANDRA_NETNS_DIR:-}" ]]; then
        launcher=(nsenter "--net=$IDEMD_CASSANDRA_NETNS_DIR/node$i" -- setsid)
    fi
    if ((EUID == 0)) && command -v setpriv >/dev/null 2>&1 &&
        setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock true 2>/dev/null; then
        launcher+=(setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock)
    fi
    # setsid: the JVM must outlive this script and must not get signals meant for the caller's job.
    # 9>&-: do not hand the start/stop lock to the JVM.
    MALLOC_ARENA_MAX=4 "${launcher[@]}" "$JAVA" "${opts[@]}" -cp "$LIB_DIR/*" \
        org.apache.cassandra.service.CassandraDaemon </dev/null >"$dir/stdout.log" 2>&1 9>&- &
    pid=$!
    disown "$pid"
    printf '%s\n' "$pid" >"$dir/cassandra.pid"
    log "node$i ($ip): started pid $pid, waiting for CQL..."

    local deadline=$((SECONDS + START_TIMEOUT))
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then
            if ((using_cds)); then
                log "node$i: JVM exited while using $archive; deleting that archive and retrying without it"
                rm -f "$archive"
                start_node "$i" "$heap"
                return
            fi
            show_failure "$i" "process $pid exited during startup"
            return 1
        fi
        if grep -qF "$READY_LINE" "$dir/logs/system.log" 2>/dev/null && cql_ping "$ip"; then
            if ((using_cds)) && grep -qF "Unable to use shared archive" "$dir/stdout.log"; then
                log "node$i: the JVM rejected $archive; deleting it (the next start writes a new one)"
                rm -f "$archive"
            fi
            return 0
        fi
        if ((SECONDS >= deadline)); then
            show_failure "$i" "not listening for CQL after ${START_TIMEOUT}s"
            return 1
        fi
        sleep 0.5
    done
}

show_failure() {
    local i=$1 why=$2 dir
    dir="$(node_dir "$i")"
    log "node$i: $why"
    log "---- tail of $dir/logs/system.log ----"
    tail -n 60 "$dir/logs/system.log" >&2 2>/dev/null || true
    log "---- tail of $dir/stdout.log ----"
    tail -n 20 "$dir/stdout.log" >&2 2>/dev/null || true
}

# Waits until every node's log shows every other node as UP (gossip converged).
wait_for_peers() {
    local n=$1 deadline=$((SECONDS + 60)) i j missing
    ((n > 1)) || return 0
    while :; do
        missing=""
        for ((i = 1; i <= n; i++)); do
            for ((j = 1; j <= n; j++)); do
                ((i == j)) && continue
                grep -qF "/$(node_ip "$j"):$STORAGE_PORT is now UP" "$(node_dir "$i")/logs/system.log" 2>/dev/null ||
                    missing+=" node$i->node$j"
            done
        done
        [[ -z "$missing" ]] && return 0
        if ((SECONDS >= deadline)); then
            log "gossip did not converge within 60s; missing:$missing"
            return 1
        fi
        sleep 0.5
    done
}

# stop_all [quiet]: stop every node found under nodes/.
stop_all() {
    local quiet=${1:-0}
    local -a pids=() names=()
    local i pid
    while read -r i; do
        [[ -n "$i" ]] || continue
        if pid="$(node_pid "$i")"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
            names+=("node$i")
        fi
        rm -f "$(node_dir "$i")/cassandra.pid"
    done < <(all_node_indexes)
    if ((${#pids[@]} == 0)); then
        ((quiet)) || log "no node running"
        return 0
    fi
    log "stopping ${names[*]} (pids ${pids[*]})..."
    local deadline=$((SECONDS + STOP_TIMEOUT)) killed=0 alive
    while :; do
        alive=()
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive+=("$pid")
        done
        ((${#alive[@]} == 0)) && break
        if ((SECONDS >= deadline)); then
            if ((killed)); then
                log "error: pids ${alive[*]} survived SIGKILL"
                return 1
            fi
            log "still running after ${STOP_TIMEOUT}s, sending SIGKILL to ${alive[*]}"
            kill -KILL "${alive[@]}" 2>/dev/null || true
            killed=1
            deadline=$((SECONDS + 10))
        fi
        sleep 0.2
    done
    finish_cds_archive "$killed"
    log "stopped"
}

# A node started with -XX:ArchiveClassesAtExit wrote "<archive>.new" when it exited: keep it if it exited
# cleanly, drop it otherwise.
finish_cds_archive() {
    local killed=$1 pending archive
    pending="$(node_dir 1)/cds.pending"
    [[ -f "$pending" ]] || return 0
    archive="$(<"$pending")"
    rm -f "$pending"
    if ((killed == 0)) && [[ -s "$archive.new" ]]; then
        mv -f "$archive.new" "$archive"
        log "saved class-data-sharing archive $archive"
    else
        rm -f "$archive.new"
    fi
}

# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

cmd_start() {
    local n=$1 keep=$2 d=${3:-1} i
    local heap="${IDEMD_CASSANDRA_HEAP:-}"
    if [[ -z "$heap" ]]; then
        if ((n == 1)); then heap=1G; else heap=768M; fi
    fi

    ((d <= n)) || die "--dcs $d needs at least $d nodes"
    # Idempotent: the same cluster is already up.
    if [[ "$(configured_nodes)" == "$n" && "$(configured_dcs)" == "$d" ]]; then
        local all_up=1
        for ((i = 1; i <= n; i++)); do
            node_up "$i" || { all_up=0; break; }
        done
        if ((all_up)); then
            log "already running: $n node(s) listening for CQL on $(node_ip 1)..$n:$CQL_PORT"
            return 0
        fi
    fi

    if ((keep)); then
        local prev
        prev="$(configured_nodes)"
        if [[ "$prev" != 0 && ("$prev" != "$n" || "$(configured_dcs)" != "$d") ]]; then
            die "--keep-data: existing data is for $prev node(s), not $n; start without --keep-data to wipe it"
        fi
    fi
    check_java
    fetch_jars
    # Anything left over (a different node count, a half-started cluster) goes first.
    stop_all 1

    if ((keep == 0)); then
        [[ "$NODES_DIR" == */nodes ]] || die "refusing to wipe unexpected directory $NODES_DIR"
        rm -rf -- "$NODES_DIR"
    fi
    mkdir -p "$NODES_DIR"
    printf 'NODES=%s\nDCS=%s\nVERSION=%s\nHEAP=%s\n' "$n" "$d" "$CASSANDRA_VERSION" "$heap" >"$CLUSTER_FILE"

    local t0=$SECONDS
    for ((i = 1; i <= n; i++)); do
        write_node_config "$i" "$n" "$d"
        if ! start_node "$i" "$heap"; then
            stop_all 1
            exit 1
        fi
        log "node$i ($(node_ip "$i")): listening for CQL on $(node_ip "$i"):$CQL_PORT after $((SECONDS - t0))s"
    done
    if ! wait_for_peers "$n"; then
        stop_all 1
        exit 1
    fi
    log "cluster of $n node(s) in $d datacenter(s) up in $((SECONDS - t0))s (Cassandra $CASSANDRA_VERSION, heap $heap per node)"
}

# What each node's log says went wrong: a CI log is often all there is to
# read after a failed test (a node whose schema merge threw, a JVM pause).
cmd_errors() {
    local n=$1 i log errors
    if ((n == 0)); then
        n="$(configured_nodes)"
    fi
    for ((i = 1; i <= n; i++)); do
        log="$(node_dir "$i")/logs/system.log"
        [[ -f "$log" ]] || continue
        errors="$(grep -cE '^(ERROR|WARN) ' "$log" || true)"
        log "node$i: $errors ERROR/WARN lines in $log; the last ERROR lines:"
        grep -E '^ERROR ' "$log" | tail -n 5 | cut -c1-300 >&2 || true
    done
}

cmd_status() {
    local n=$1 i pid ip failed=0
    if ((n == 0)); then
        n="$(configured_nodes)"
    fi
    if ((n == 0)); then
        echo "no cluster configured (run: scripts/cassandra.sh start)"
        return 3
    fi
    for ((i = 1; i <= n; i++)); do
        ip="$(node_ip "$i")"
        if pid="$(node_pid "$i")"; then
            if cql_ping "$ip"; then
                echo "node$i $ip:$CQL_PORT up (pid $pid)"
            else
                echo "node$i $ip:$CQL_PORT starting or not answering CQL (pid $pid)"
                failed=1
            fi
        else
            echo "node$i $ip:$CQL_PORT down"
            failed=1
        fi
    done
    return "$failed"
}

# cmd_node ACTION I: one fault on one node of the configured cluster.
cmd_node() {
    local action=$1 i=$2 pid heap deadline
    [[ "$i" =~ ^[1-9]$ ]] && ((i <= $(configured_nodes))) ||
        die "node $i is not part of the configured cluster ($(configured_nodes) node(s))"
    case "$action" in
        kill)
            pid="$(node_pid "$i")" || die "node$i is not running"
            kill -KILL "$pid"
            deadline=$((SECONDS + 10))
            while kill -0 "$pid" 2>/dev/null; do
                ((SECONDS < deadline)) || die "node$i (pid $pid) survived SIGKILL"
                sleep 0.1
            done
            rm -f "$(node_dir "$i")/cassandra.pid"
            log "node$i: killed (pid $pid)"
            ;;
        pause)
            pid="$(node_pid "$i")" || die "node$i is not running"
            kill -STOP "$pid"
            log "node$i: paused (pid $pid)"
            ;;
        resume)
            pid="$(node_pid "$i")" || die "node$i is not running"
            kill -CONT "$pid"
            log "node$i: resumed (pid $pid)"
            ;;
        restart)
            if pid="$(node_pid "$i")"; then
                die "node$i is running (pid $pid): kill it first"
            fi
            heap="$(sed -n 's/^HEAP=//p' "$CLUSTER_FILE")"
            check_java
            start_node "$i" "${heap:-768M}"
            log "node$i: listening for CQL again"
            ;;
    esac
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    case "$cmd" in
        kill | pause | resume | restart)
            (($# == 1)) || usage
            cmd_node "$cmd" "$1"
            return
            ;;
    esac
    local nodes="" keep=0 dcs=1
    while (($# > 0)); do
        case "$1" in
            --nodes)
                (($# >= 2)) || usage
                nodes=$2
                shift 2
                ;;
            --nodes=*)
                nodes=${1#--nodes=}
                shift
                ;;
            --dcs)
                (($# >= 2)) || usage
                dcs=$2
                shift 2
                ;;
            --keep-data)
                keep=1
                shift
                ;;
            -h | --help) usage ;;
            *) log "unknown argument: $1"; usage ;;
        esac
    done
    if [[ -z "$nodes" ]]; then
        # start: one node; status: as many as the last start configured.
        if [[ "$cmd" == start ]]; then nodes=1; else nodes=0; fi
    elif ! [[ "$nodes" =~ ^[1-9]$ ]]; then
        die "--nodes takes a number from 1 to $MAX_NODES"
    fi

    [[ "$dcs" =~ ^[12]$ ]] || die "--dcs takes 1 or 2"
    case "$cmd" in
        start | stop)
            # One start/stop at a time per cache directory.
            exec 9>"$CASS_HOME/.lock"
            flock -w 900 9 || die "could not lock $CASS_HOME/.lock"
            if [[ "$cmd" == start ]]; then
                cmd_start "$nodes" "$keep" "$dcs"
            else
                stop_all
            fi
            ;;
        status) cmd_status "$nodes" ;;
        errors) cmd_errors "$nodes" ;;
        *) usage ;;
    esac
}

main "$@"
