#!/bin/sh
# openimex Slurm prolog and epilog: one script that acts by the name it runs under. A name with
# `epilog` in it (dist/slurm/epilog.sh is a link to this file; install a copy as
# /etc/slurm/openimex-epilog.sh) runs the epilog, any other name the prolog.
#
# Prolog: points the node's IMEX daemon at the job's nodes and waits, by polling
# ctl, until the job's IMEX domain is UP. Works with openimex and with NVIDIA's nvidia-imex.
#
#   Prolog=/etc/slurm/openimex-prolog.sh     (slurm.conf; with the matching epilog.sh as Epilog)
#
# 1. `scontrol show hostnames "$SLURM_JOB_NODELIST"` gives the job's nodes, in order (line i is
#    IMEX node ID i on every node of the job, since they all expand the same list).
# 2. The nodes file is compared with that list:
#    - no real entry in it (missing, empty, or only 0.0.0.0 placeholders, as epilog.sh leaves
#      it), or every real entry already the job's entry at the same line (placeholders filled
#      in, lines appended): the job's list is written and the daemon gets SIGUSR1. An
#      unconfigured openimex re-executes itself configured; a configured one adds the nodes.
#      No restart, same PID.
#    - real entries that differ (a daemon of another domain; SIGUSR1 refuses an edited or
#      removed line because it would renumber running nodes): the list is written and the
#      daemon is restarted (OPENIMEX_RESTART_CMD, default `systemctl restart openimex`).
# 3. It polls `ctl -q` and `ctl -N` every OPENIMEX_POLL_INTERVAL seconds until the local daemon
#    says READY and `Domain State: UP` (every job node READY and connected); no other sleep.
#    After OPENIMEX_WAIT_TIMEOUT seconds it exits 1 naming the nodes not READY, so Slurm drains
#    the node instead of starting a job without its IMEX domain.
#
# Settings (environment), besides the shared ones listed after this header:
#   OPENIMEX_WAIT_TIMEOUT  seconds to wait for the domain [120]
#   OPENIMEX_POLL_INTERVAL seconds between two polls [0.2] (the only sleep)
#   OPENIMEX_WAIT_FOR      domain: ctl -q READY and Domain State UP; local: ctl -q READY only [domain]
#   SCONTROL               the scontrol command [scontrol]
#
# Epilog: resets the IMEX nodes file to placeholders and restarts the daemon, so
# it comes back unconfigured (ctl -q UNAVAILABLE) and no IMEX domain outlives the job.
#
#   Epilog=/etc/slurm/openimex-epilog.sh     (slurm.conf; with the matching prolog.sh as Prolog)
#
# The nodes file becomes a `##` line and OPENIMEX_PLACEHOLDERS `0.0.0.0` lines (written
# atomically: a temporary file, then rename), then the daemon is restarted
# (OPENIMEX_RESTART_CMD, default `systemctl restart openimex`). A restart, not SIGUSR1: openimex
# refuses on SIGUSR1 to turn real entries back into placeholders (that would renumber running
# nodes), so a signalled daemon would keep the finished job's map while the file says otherwise.
# A new instance also makes the peers clean up whatever the job's processes left imported.
# After it, the nodes file is again what the daemon runs on, which is what prolog.sh relies on
# (the next job's list over placeholders: SIGUSR1 only, no restart, at job start).
# Failures are reported but the epilog exits 0 unless OPENIMEX_EPILOG_STRICT=1: a job that ran
# should not drain its node because the daemon was already gone.
set -eu
set -f
case "$(basename "$0")" in
    *epilog*) IMEX_SCRIPT=openimex-epilog ;;
    *) IMEX_SCRIPT=openimex-prolog ;;
esac

#
# Settings (environment; defaults in brackets):
#   OPENIMEX_NODES_FILE   the IMEX nodes file [/etc/nvidia-imex/nodes_config.cfg]
#   OPENIMEX_CTL          the ctl command, word-split, target flags included
#                         [openimex ctl -c /etc/nvidia-imex/config.cfg if openimex is on PATH,
#                          else nvidia-imex-ctl -c /etc/nvidia-imex/config.cfg]
#   OPENIMEX_UNIT         systemd unit of the daemon [openimex]
#   OPENIMEX_RELOAD_CMD   shell command that makes the daemon re-read the nodes file (SIGUSR1)
#                         [unset: see imex_reload for the order tried]
#   OPENIMEX_RESTART_CMD  shell command that restarts the daemon [systemctl restart $OPENIMEX_UNIT]
#   OPENIMEX_PID_FILE     file holding the daemon's PID [unset]
#   OPENIMEX_DAEMON_NAME  process names for pgrep -x [nvidia-imex openimex]
#   OPENIMEX_PLACEHOLDERS placeholder lines the epilog writes [9]

: "${OPENIMEX_NODES_FILE:=/etc/nvidia-imex/nodes_config.cfg}"
: "${OPENIMEX_UNIT:=openimex}"
: "${OPENIMEX_DAEMON_NAME:=nvidia-imex openimex}"
: "${OPENIMEX_PLACEHOLDERS:=9}"
if [ -z "${OPENIMEX_CTL:-}" ]; then
    if command -v openimex >/dev/null 2>&1; then
        OPENIMEX_CTL="openimex ctl -c /etc/nvidia-imex/config.cfg"
    else
        OPENIMEX_CTL="nvidia-imex-ctl -c /etc/nvidia-imex/config.cfg"
    fi
fi

imex_log() {
    printf '%s: %s\n' "${IMEX_SCRIPT:-openimex}" "$*" >&2
}

# Runs the ctl command with extra arguments (OPENIMEX_CTL is split on blanks on purpose).
imex_ctl() {
    # shellcheck disable=SC2086
    $OPENIMEX_CTL "$@"
}

# Prints the entry lines of a nodes file (no comments, no blank lines, trailing comments and
# blanks cut), one per line. A missing file prints nothing.
imex_entries() {
    [ -r "$1" ] || return 0
    sed -e 's/[[:space:]]#.*$//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$1" |
        grep -v -e '^#' -e '^$' || true
}

# Whether an entry is a placeholder (the unspecified address: 0.0.0.0, ::, 0::0, ...).
imex_is_placeholder() {
    case "$1" in
        0.0.0.0) return 0 ;;
        *[!0:]*) return 1 ;;
        *::*) return 0 ;;
        *) return 1 ;;
    esac
}

# Writes stdin to the nodes file atomically: a temporary file in the same directory, then rename.
imex_write_nodes() {
    dir=$(dirname -- "$OPENIMEX_NODES_FILE")
    tmp=$(mktemp "$dir/.nodes_config.XXXXXX")
    if ! cat >"$tmp"; then
        rm -f -- "$tmp"
        return 1
    fi
    chmod 0644 "$tmp"
    mv -f -- "$tmp" "$OPENIMEX_NODES_FILE"
}

# Sends SIGUSR1 to the daemon: OPENIMEX_RELOAD_CMD if set; else the PID in OPENIMEX_PID_FILE;
# else `systemctl reload $OPENIMEX_UNIT` if that unit is active; else every process named one of
# OPENIMEX_DAEMON_NAME (pgrep -x).
imex_reload() {
    if [ -n "${OPENIMEX_RELOAD_CMD:-}" ]; then
        sh -c "$OPENIMEX_RELOAD_CMD"
        return
    fi
    if [ -n "${OPENIMEX_PID_FILE:-}" ]; then
        pid=$(cat -- "$OPENIMEX_PID_FILE") || return 1
        kill -USR1 "$pid"
        return
    fi
    if command -v systemctl >/dev/null 2>&1 &&
        systemctl is-active --quiet "$OPENIMEX_UNIT" 2>/dev/null; then
        systemctl reload "$OPENIMEX_UNIT"
        return
    fi
    for name in $OPENIMEX_DAEMON_NAME; do
        pids=$(pgrep -x "$name" || true)
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -USR1 $pids
            return
        fi
    done
    imex_log "no IMEX daemon found to signal (set OPENIMEX_RELOAD_CMD, OPENIMEX_PID_FILE or OPENIMEX_UNIT)"
    return 1
}

# Restarts the daemon: OPENIMEX_RESTART_CMD, else `systemctl restart $OPENIMEX_UNIT`.
imex_restart() {
    if [ -n "${OPENIMEX_RESTART_CMD:-}" ]; then
        sh -c "$OPENIMEX_RESTART_CMD"
    else
        systemctl restart "$OPENIMEX_UNIT"
    fi
}

# The epilog, to its end (it exits).
if [ "$IMEX_SCRIPT" = openimex-epilog ]; then
    : "${OPENIMEX_EPILOG_STRICT:=0}"

    status=0
    {
        echo '##'
        n=0
        while [ "$n" -lt "$OPENIMEX_PLACEHOLDERS" ]; do
            echo 0.0.0.0
            n=$((n + 1))
        done
    } | imex_write_nodes || status=1
    if [ "$status" = 0 ]; then
        imex_restart || status=1
    fi
    if [ "$status" != 0 ]; then
        imex_log "resetting the IMEX daemon after job ${SLURM_JOB_ID:-?} failed"
        if [ "$OPENIMEX_EPILOG_STRICT" = 1 ]; then
            exit 1
        fi
    fi
    exit 0
fi

# The prolog.
: "${OPENIMEX_WAIT_TIMEOUT:=120}"
: "${OPENIMEX_POLL_INTERVAL:=0.2}"
: "${OPENIMEX_WAIT_FOR:=domain}"
: "${SCONTROL:=scontrol}"

if [ -z "${SLURM_JOB_NODELIST:-}" ]; then
    imex_log "SLURM_JOB_NODELIST is not set: not run by Slurm?"
    exit 1
fi
case "$OPENIMEX_WAIT_FOR" in
    domain | local) ;;
    *)
        imex_log "OPENIMEX_WAIT_FOR must be domain or local, not '$OPENIMEX_WAIT_FOR'"
        exit 1
        ;;
esac

# shellcheck disable=SC2086
if ! job_nodes=$($SCONTROL show hostnames "$SLURM_JOB_NODELIST"); then
    imex_log "scontrol show hostnames '$SLURM_JOB_NODELIST' failed"
    exit 1
fi
if [ -z "$job_nodes" ]; then
    imex_log "no node in SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
    exit 1
fi

# reload: every real entry of the current file is the job's entry at the same line, and the
# file is no longer than the job's list unless it holds no real entry at all. Else: restart.
current=$(imex_entries "$OPENIMEX_NODES_FILE")
action=reload
real=0
i=0
for entry in $current; do
    i=$((i + 1))
    imex_is_placeholder "$entry" && continue
    real=1
    want=$(printf '%s\n' "$job_nodes" | sed -n "${i}p")
    if [ "$entry" != "$want" ]; then
        action=restart
    fi
done
if [ "$real" = 1 ] && [ "$i" -gt "$(printf '%s\n' "$job_nodes" | wc -l)" ]; then
    action=restart
fi

if [ "$current" != "$job_nodes" ]; then
    printf '%s\n' "$job_nodes" | imex_write_nodes
fi
if [ "$action" = restart ]; then
    imex_log "$OPENIMEX_NODES_FILE named other nodes: restarting the IMEX daemon"
    imex_restart || {
        imex_log "restarting the IMEX daemon failed"
        exit 1
    }
elif ! imex_reload; then
    imex_log "signalling the IMEX daemon failed: restarting it"
    imex_restart || {
        imex_log "restarting the IMEX daemon failed"
        exit 1
    }
fi

# Polls ctl until the domain is ready; the poll interval is the only sleep.
start=$(date +%s)
state=
while :; do
    state=$(imex_ctl -q 2>/dev/null | head -n 1) || true
    if [ "$state" = READY ]; then
        if [ "$OPENIMEX_WAIT_FOR" = local ]; then
            exit 0
        fi
        if imex_ctl -N 2>/dev/null | grep -q '^Domain State: UP$'; then
            exit 0
        fi
    fi
    if [ $(($(date +%s) - start)) -ge "$OPENIMEX_WAIT_TIMEOUT" ]; then
        break
    fi
    sleep "$OPENIMEX_POLL_INTERVAL"
done

# Timed out: name the nodes that are not READY, as ctl -N shows them.
imex_log "the IMEX domain of job ${SLURM_JOB_ID:-?} is not ready after ${OPENIMEX_WAIT_TIMEOUT}s (local daemon: ${state:-no answer})"
table=$(imex_ctl -N 2>&1) || true
not_ready=$(printf '%s\n' "$table" | awk '
    # Node #1   - 10.0.0.2   - UNAVAILABLE   - Version: ...  (the local node: * 10.0.0.1 *)
    /^Node #/ {
        n = 0
        for (k = 3; k <= NF && n < 2; k++) {
            if ($k != "-" && $k != "*") { n++; word[n] = $k }
        }
        if (word[2] != "READY") printf "%s %s %s\n", $2, word[1], word[2]
    }')
if [ -n "$not_ready" ]; then
    printf '%s\n' "$not_ready" | while read -r id host st; do
        imex_log "node $id $host is $st, not READY"
    done
else
    imex_log "ctl -N:"
    printf '%s\n' "$table" >&2
fi
domain=$(printf '%s\n' "$table" | sed -n 's/^Domain State: //p')
imex_log "domain state: ${domain:-unknown}"
exit 1
