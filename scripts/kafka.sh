#!/usr/bin/env bash
# Run a throwaway one-node Apache Kafka 4.x broker (KRaft, broker and controller in one JVM) from
# Maven Central jars (no Docker, no tarball).
#
#   scripts/kafka.sh run [--] CMD...          start a fresh broker in a fresh temp dir on free ports,
#                                             run CMD with IDEMD_TEST_KAFKA_BROKERS=127.0.0.1:PORT,
#                                             then stop the broker, delete the dir, exit with CMD's status
#                                             (a SIGTERM to the script is passed on to CMD)
#   scripts/kafka.sh start --dir D            start a broker whose config, data and logs live in D
#                                             (new, empty, or a previous `start --dir D`: its data is
#                                             wiped, the ports are new); prints the bootstrap address
#                                             on stdout once it accepts clients; again while it runs:
#                                             prints the address
#   scripts/kafka.sh stop --dir D             stop the broker of D (SIGTERM, then SIGKILL); D stays
#   scripts/kafka.sh topic BROKERS NAME PARTITIONS
#                                             create topic NAME (replication factor 1)
#   scripts/kafka.sh tool CLASS [ARGS...]     run a main class of the jars, e.g.
#                                             org.apache.kafka.tools.ConsoleProducer or
#                                             org.apache.kafka.tools.consumer.ConsoleConsumer
#
# No fixed port and no fixed data dir: every SDK suite (and any developer) gets its own broker, and
# any number can run at once. Ports are picked at random in 20000-32767 (below Linux's ephemeral
# range, so no outgoing connection holds one) and picked again if the broker cannot bind them.
#
# Broker settings that differ from Kafka's defaults, all for a one-node test broker: replication
# factors and min ISR 1, one partition for internal topics (a first group join creates
# __consumer_offsets in milliseconds, not 50 partitions), no initial rebalance delay, no topic
# auto-creation, and group session timeouts allowed down to 1 s (group.min.session.timeout.ms for
# the classic protocol; the consumer protocol's, KIP-848, is set broker-side to 6 s) so a test that
# SIGKILLs a consumer sees its partitions move within seconds instead of 45 s. The group protocol
# is left to the client: both `classic` and `consumer` are enabled (Kafka 4's default).
#
# Layout of a broker directory (the temp dir of `run`, or D):
#   server.properties, log4j2.properties config
#   data/                            log.dirs and the KRaft metadata log
#   logs/server.log                  the broker's log (log4j at INFO, nothing on the terminal)
#   stdout.log, kafka.pid, address   JVM output, pid, bootstrap address
# Jars live in $IDEMD_KAFKA_HOME/lib-<version> (fetched once with mvn).
#
# Environment overrides:
#   IDEMD_KAFKA_HOME           jar cache (default ~/.cache/idemd/kafka: shared by every
#                              clone and worktree, so a fresh clone fetches nothing)
#   IDEMD_KAFKA_VERSION        org.apache.kafka:kafka_2.13 version (default 4.4.0)
#   IDEMD_KAFKA_HEAP           broker heap (default 512m)
#   IDEMD_KAFKA_START_TIMEOUT  seconds to wait for the broker to accept clients (default 60)
#   IDEMD_KAFKA_STOP_TIMEOUT   seconds to wait after SIGTERM before SIGKILL (default 15)
#   IDEMD_KAFKA_CDS            0: no class-data-sharing archive (default 1; see cds_archive)
#   IDEMD_KAFKA_JVM_OPTS       extra JVM options for the broker (split on whitespace), appended last
#   JAVA                       java binary (default: java on PATH; Java 17 or later)
#   MVN                        maven binary (default: mvn on PATH)
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd)"

KAFKA_VERSION="${IDEMD_KAFKA_VERSION:-4.4.0}"
KAFKA_HOME="${IDEMD_KAFKA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/idemd/kafka}"
HEAP="${IDEMD_KAFKA_HEAP:-512m}"
START_TIMEOUT="${IDEMD_KAFKA_START_TIMEOUT:-60}"
STOP_TIMEOUT="${IDEMD_KAFKA_STOP_TIMEOUT:-15}"
JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"
DEPENDENCY_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
SLF4J_VERSION=2.0.17
LOG4J_VERSION=2.25.5
LIB_DIR="" # set by fetch_jars (absolute)
# Written into every broker dir the script manages; `start --dir` refuses to reuse a non-empty
# directory without it, so a typo cannot wipe someone's files.
MARKER=".idemd-kafka"
READY_LINE="Kafka Server started"

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    cat >&2 <<'EOF'
usage: scripts/kafka.sh run [--] CMD...
       scripts/kafka.sh start --dir D
       scripts/kafka.sh stop --dir D
       scripts/kafka.sh topic BROKERS NAME PARTITIONS
       scripts/kafka.sh tool CLASS [ARGS...]
EOF
    exit 2
}

# ---------------------------------------------------------------------------------------------
# Dependencies
# ---------------------------------------------------------------------------------------------

JAVA_BUILD=""
check_java() {
    command -v "$JAVA" >/dev/null 2>&1 || die "java not found (Kafka $KAFKA_VERSION needs Java 17 or later; set JAVA=/path/to/java)"
    local ver major
    local out
    out="$("$JAVA" -version 2>&1)"
    ver="$(awk -F'"' '/version/ {print $2; exit}' <<<"$out")"
    JAVA_BUILD="$(sed -n 's/.*(build \(.*\))$/\1/p' <<<"$out" | head -n 1 | tr -c 'A-Za-z0-9._+\n-' '_')"
    major="${ver%%.*}"
    [[ "$major" =~ ^[0-9]+$ ]] && ((major >= 17)) ||
        die "Kafka $KAFKA_VERSION needs Java 17 or later; '$JAVA' is version '$ver' (set JAVA=/path/to/java)"
}

# kafka_2.13 (the broker and StorageTool) and kafka-tools (TopicCommand, the console clients),
# with their runtime dependencies, copied out of the local Maven repository once.
fetch_jars() {
    mkdir -p "$KAFKA_HOME"
    KAFKA_HOME="$(cd -- "$KAFKA_HOME" && pwd)"
    LIB_DIR="$KAFKA_HOME/lib-$KAFKA_VERSION"
    # .complete names what was fetched: a cache from an older recipe of this script is refetched.
    local recipe="kafka_2.13 kafka-tools $KAFKA_VERSION slf4j-api $SLF4J_VERSION log4j-slf4j2-impl $LOG4J_VERSION"
    [[ "$(cat "$LIB_DIR/.complete" 2>/dev/null)" == "$recipe" ]] && return 0
    # Several suites may start their first broker at once: one fetches, the others wait for it.
    exec 8>"$KAFKA_HOME/.fetch.lock"
    flock -w 900 8 || die "could not lock $KAFKA_HOME/.fetch.lock"
    if [[ "$(cat "$LIB_DIR/.complete" 2>/dev/null)" == "$recipe" ]]; then
        exec 8>&-
        return 0
    fi
    command -v "$MVN" >/dev/null 2>&1 || die "mvn not found (needed once to fetch the Kafka jars)"
    local work="$KAFKA_HOME/fetch-$KAFKA_VERSION" tmp_lib="$LIB_DIR.partial" artifact
    mkdir -p "$work"
    rm -rf "$tmp_lib"
    {
        cat <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>idemd.local</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
EOF
        for artifact in kafka_2.13 kafka-tools; do
            cat <<EOF
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>$artifact</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
EOF
        done
        # The broker logs through slf4j; without these two Maven's mediation picks slf4j-api 1.7
        # (no binding found: every log line is dropped, the ready check included).
        cat <<EOF
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>$SLF4J_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
      <version>$LOG4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
    } >"$work/pom.xml"
    log "fetching org.apache.kafka:kafka_2.13:$KAFKA_VERSION, kafka-tools and their runtime dependencies (once)..."
    if ! "$MVN" -B -q -f "$work/pom.xml" "$DEPENDENCY_PLUGIN:copy-dependencies" \
        -DincludeScope=runtime \
        -DoutputDirectory="$tmp_lib" >"$work/mvn.log" 2>&1; then
        tail -n 40 "$work/mvn.log" >&2
        die "mvn could not fetch the Kafka $KAFKA_VERSION jars (full log: $work/mvn.log; another version: IDEMD_KAFKA_VERSION=4.3.1)"
    fi
    compgen -G "$tmp_lib/kafka_2.13-*.jar" >/dev/null || die "kafka_2.13 jar missing after mvn run"
    printf '%s\n' "$recipe" >"$tmp_lib/.complete"
    rm -rf "$LIB_DIR"
    mv "$tmp_lib" "$LIB_DIR"
    exec 8>&-
    log "jars cached in $LIB_DIR ($(find "$LIB_DIR" -name '*.jar' | wc -l) jars)"
}

# Short-lived tool JVMs (format, topic creation): C1 only and a small heap start them fastest.
tool_java() {
    local -a cds=()
    [[ -s "$(cds_archive)" ]] && cds=(-XX:SharedArchiveFile="$(cds_archive)")
    "$JAVA" -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto "${cds[@]}" \
        -Dlog4j2.configurationFile="$TOOL_LOG4J" -cp "$LIB_DIR/*" "$@"
}

# Class-data sharing: a broker started when no archive exists for this JVM build and jar set dumps
# the classes it loaded when it exits cleanly; later brokers and tool JVMs map them and start
# faster. Each broker dumps into its own dir and the stop moves the dump into place (rename is
# atomic), so concurrent first runs cannot hand anyone a half-written archive; VerifySharedSpaces
# makes the JVM skip a damaged one, and -Xshare:auto lets it start without.
cds_archive() {
    printf '%s/cds/java-%s.jsa' "$LIB_DIR" "${JAVA_BUILD:-unknown}"
}

# ---------------------------------------------------------------------------------------------
# Broker directory
# ---------------------------------------------------------------------------------------------

# True if something accepts TCP connections on 127.0.0.1:port.
tcp_open() {
    # shellcheck disable=SC2016 # $1 is expanded by the inner bash
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

random_free_port() {
    local p i
    for ((i = 0; i < 50; i++)); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 12768))
        tcp_open "$p" || { printf '%s' "$p"; return 0; }
    done
    die "no free port found in 20000-32767"
}

write_config() {
    local dir=$1 port=$2 cport=$3 cluster_id
    mkdir -p "$dir/data" "$dir/logs"
    cat >"$dir/server.properties" <<EOF
# Generated by scripts/kafka.sh for a throwaway one-node test broker. Do not use in production.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$dir/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
group.consumer.min.session.timeout.ms=1000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
# A shared 2-core test box: few threads.
num.network.threads=2
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
EOF
    # Everything at INFO to logs/server.log (the ready check reads it); nothing on the terminal.
    cat >"$dir/log4j2.properties" <<EOF
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $dir/logs/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
EOF
    # A random cluster id (16 bytes, base64url without padding) saves a JVM start of `random-uuid`.
    # Drawn again while it starts with '-': kafka-storage would read it as an option (1 start in
    # 64 failed with "argument --cluster-id/-t: expected one argument"); Kafka's own generator
    # avoids a leading '-' the same way.
    cluster_id=-
    while [[ "$cluster_id" == -* ]]; do
        cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    done
    printf '%s\n' "$cluster_id" >"$dir/cluster.id"
    printf '127.0.0.1:%s\n' "$port" >"$dir/address"
}

# Prints the pid of the broker of dir if it runs (pid file present and that process is its JVM).
broker_pid() {
    local dir=$1 pid
    [[ -f "$dir/kafka.pid" ]] || return 1
    pid="$(<"$dir/kafka.pid")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [[ -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$dir/server.properties" || return 1
    printf '%s' "$pid"
}

# start_broker DIR: format the storage, start the JVM, wait until it accepts clients. On a port
# clash (another broker or program took a port between the pick and the bind) it picks new ports
# and tries again.
start_broker() {
    local dir=$1 attempt port cport pid t0=$SECONDS
    for attempt in 1 2 3 4 5; do
        port="$(random_free_port)"
        cport="$(random_free_port)"
        [[ "$port" != "$cport" ]] || continue
        rm -rf -- "$dir/data" "$dir/logs" "$dir/kafka.pid"
        write_config "$dir" "$port" "$cport"
        if ! tool_java kafka.tools.StorageTool format --ignore-formatted \
            -t "$(<"$dir/cluster.id")" -c "$dir/server.properties" >"$dir/format.log" 2>&1; then
            cat "$dir/format.log" >&2
            die "formatting the storage in $dir/data failed"
        fi
        local -a opts=(
            -Xms"$HEAP" -Xmx"$HEAP" -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError
            -XX:ErrorFile="$dir/hs_err_pid%p.log"
            # C1 only: on a 2-core box the broker is ready sooner, and test traffic is light.
            -XX:TieredStopAtLevel=1
            -Xshare:auto -XX:+UnlockDiagnosticVMOptions -XX:+VerifySharedSpaces
            -Djava.awt.headless=true -Djava.net.preferIPv4Stack=true
            -Dlog4j2.configurationFile="$dir/log4j2.properties"
            -Dkafka.logs.dir="$dir/logs"
        )
        if [[ -n "${IDEMD_KAFKA_JVM_OPTS:-}" ]]; then
            local -a extra
            read -r -a extra <<<"$IDEMD_KAFKA_JVM_OPTS"
            opts+=("${extra[@]}")
        fi
        rm -f "$dir/cds.jsa"
        if [[ -s "$(cds_archive)" ]]; then
            opts+=(-XX:SharedArchiveFile="$(cds_archive)")
        elif [[ "${IDEMD_KAFKA_CDS:-1}" != 0 ]]; then
            opts+=(-XX:ArchiveClassesAtExit="$dir/cds.jsa")
        fi
        # setsid: the broker must not get signals meant for the caller's job (Ctrl-C reaches CMD;
        # the script then stops the broker itself). 8>&- 9>&-: no lock reaches the JVM.
        setsid "$JAVA" "${opts[@]}" -cp "$LIB_DIR/*" kafka.Kafka "$dir/server.properties" \
            </dev/null >"$dir/stdout.log" 2>&1 8>&- 9>&- &
        pid=$!
        disown "$pid"
        printf '%s\n' "$pid" >"$dir/kafka.pid"
        log "broker pid $pid starting on 127.0.0.1:$port (controller $cport) in $dir..."
        local deadline=$((SECONDS + START_TIMEOUT))
        while :; do
            if ! kill -0 "$pid" 2>/dev/null; then
                if grep -qsE "Address already in use|BindException" "$dir/logs/server.log" "$dir/stdout.log"; then
                    log "a port was taken before the broker bound it; picking new ports"
                    continue 2
                fi
                show_failure "$dir" "broker (pid $pid) exited during startup"
                return 1
            fi
            if grep -qsF "$READY_LINE" "$dir/logs/server.log" && tcp_open "$port"; then
                if grep -qsF "Unable to use shared archive" "$dir/stdout.log"; then
                    log "the JVM rejected $(cds_archive); deleting it (a later broker writes a new one)"
                    rm -f "$(cds_archive)"
                fi
                log "broker ready at 127.0.0.1:$port after $((SECONDS - t0))s"
                return 0
            fi
            if ((SECONDS >= deadline)); then
                show_failure "$dir" "broker not ready after ${START_TIMEOUT}s"
                stop_broker "$dir" || true
                return 1
            fi
            sleep 0.2
        done
    done
    die "could not bind free ports after 5 attempts"
}

show_failure() {
    local dir=$1 why=$2
    log "$why"
    log "---- tail of $dir/logs/server.log ----"
    tail -n 40 "$dir/logs/server.log" >&2 2>/dev/null || true
    log "---- tail of $dir/stdout.log ----"
    tail -n 20 "$dir/stdout.log" >&2 2>/dev/null || true
}

stop_broker() {
    local dir=$1 pid deadline
    if ! pid="$(broker_pid "$dir")"; then
        rm -f "$dir/kafka.pid"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local killed=0
    deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            log "broker (pid $pid) still running after ${STOP_TIMEOUT}s, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            killed=1
            sleep 0.2
            kill -0 "$pid" 2>/dev/null && { log "error: pid $pid survived SIGKILL"; return 1; }
            break
        fi
        sleep 0.1
    done
    rm -f "$dir/kafka.pid"
    if [[ -s "$dir/cds.jsa" && ! -s "$(cds_archive)" && -n "$LIB_DIR" ]] && ((killed == 0)); then
        mkdir -p "$(dirname -- "$(cds_archive)")"
        mv -f "$dir/cds.jsa" "$(cds_archive)" && log "saved class-data-sharing archive $(cds_archive)"
    fi
}

# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

TOOL_LOG4J=""

prepare() {
    check_java
    fetch_jars
    # Tools log warnings only, to stderr (their normal output stays on stdout).
    TOOL_LOG4J="$KAFKA_HOME/tools-log4j2.properties"
    if [[ ! -s "$TOOL_LOG4J" ]]; then
        cat >"$TOOL_LOG4J.$$" <<'EOF'
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
EOF
        mv -f "$TOOL_LOG4J.$$" "$TOOL_LOG4J"
    fi
}

RUN_DIR=""
cleanup_run() {
    [[ -n "$RUN_DIR" ]] || return 0
    stop_broker "$RUN_DIR" || true
    rm -rf -- "$RUN_DIR"
    RUN_DIR=""
}

# If this script dies without running its EXIT trap (SIGKILL, e.g. a CI job's hard timeout), a
# detached watchdog kills the broker and deletes the dir, so aborted suites leak no JVM.
start_watchdog() {
    # shellcheck disable=SC2016 # expanded by the watchdog's bash
    setsid bash -c '
        while kill -0 "$1" 2>/dev/null; do sleep 1; done
        [[ -f "$2/kafka.pid" ]] || exit 0
        pid="$(<"$2/kafka.pid")"
        if tr "\0" "\n" <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$2/server.properties"; then
            kill -KILL "$pid"
            while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
        fi
        rm -rf -- "$2"
    ' _ "$$" "$1" </dev/null >/dev/null 2>&1 8>&- 9>&- &
    disown $!
}

cmd_run() {
    (($# > 0)) || usage
    prepare
    RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/idemd-kafka.XXXXXX")"
    touch "$RUN_DIR/$MARKER"
    trap cleanup_run EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    start_broker "$RUN_DIR" || exit 1
    start_watchdog "$RUN_DIR"
    # CMD runs in the background so that a SIGTERM to this script (a harness's timeout) can be
    # passed on to it; env --default-signal undoes the SIGINT/SIGQUIT ignoring bash gives background
    # jobs, so Ctrl-C still reaches CMD straight from the terminal (hence no INT forwarding); <&0 keeps
    # the caller's stdin, which bash would replace with /dev/null for a background job.
    local status=0 cmd_pid
    IDEMD_TEST_KAFKA_BROKERS="$(<"$RUN_DIR/address")" env --default-signal=INT,QUIT "$@" <&0 &
    cmd_pid=$!
    trap 'kill -TERM "$cmd_pid" 2>/dev/null || true' TERM
    trap ':' INT
    # A trapped signal interrupts `wait`; wait again until CMD is gone (reaped) for its own status.
    while :; do
        wait "$cmd_pid" && status=0 || status=$?
        kill -0 "$cmd_pid" 2>/dev/null || break
    done
    exit "$status"
}

cmd_start() {
    local dir=$1 pid
    mkdir -p -- "$dir"
    dir="$(cd -- "$dir" && pwd)"
    if [[ -n "$(ls -A -- "$dir")" && ! -f "$dir/$MARKER" ]]; then
        die "$dir is not empty and was not made by scripts/kafka.sh; pick a new or empty directory"
    fi
    if pid="$(broker_pid "$dir")"; then
        log "already running (pid $pid)"
        cat "$dir/address"
        return 0
    fi
    prepare
    touch "$dir/$MARKER"
    start_broker "$dir" || exit 1
    cat "$dir/address"
}

cmd_stop() {
    local dir=$1
    [[ -d "$dir" ]] || die "$dir does not exist"
    dir="$(cd -- "$dir" && pwd)"
    [[ -f "$dir/$MARKER" ]] || die "$dir is not a scripts/kafka.sh broker directory"
    if ! broker_pid "$dir" >/dev/null; then
        log "no broker running in $dir"
        rm -f "$dir/kafka.pid"
        return 0
    fi
    prepare # for the class-data-sharing archive's path
    stop_broker "$dir"
    log "stopped"
}

cmd_topic() {
    local brokers=$1 name=$2 partitions=$3
    [[ "$partitions" =~ ^[1-9][0-9]*$ ]] || die "PARTITIONS must be a positive number, got '$partitions'"
    prepare
    tool_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --create \
        --topic "$name" --partitions "$partitions" --replication-factor 1 >&2 ||
        die "could not create topic $name on $brokers"
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    case "$cmd" in
        run)
            [[ "${1:-}" == "--" ]] && shift
            cmd_run "$@"
            ;;
        start | stop)
            local dir=""
            case "${1:-}" in
                --dir) (($# == 2)) || usage; dir=$2 ;;
                --dir=*) (($# == 1)) || usage; dir=${1#--dir=} ;;
                *) usage ;;
            esac
            [[ -n "$dir" ]] || usage
            "cmd_$cmd" "$dir"
            ;;
        topic)
            (($# == 3)) || usage
            cmd_topic "$@"
            ;;
        tool)
            (($# >= 1)) || usage
            prepare
            tool_java "$@"
            ;;
        -h | --help) usage ;;
        *) log "unknown command: $cmd"; usage ;;
    esac
}

main "$@"
