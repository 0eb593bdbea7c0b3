#!/bin/sh
# openimex Slurm epilog: resets the IMEX nodes file to placeholders and restarts the daemon, so
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
IMEX_SCRIPT=openimex-epilog

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
