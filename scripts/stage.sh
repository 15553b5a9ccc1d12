# Sourced by run.sh and scripts/repro_*.sh. stage NAME DONE_FILE COMMAND...: runs COMMAND unless DONE_FILE exists
# (a finished stage is reused, and says so), stops the script with the stage's name when it fails, and prints its
# seconds and the total since T0 (set by the caller); with STAGE_LOG set, also appends "NAME<tab>SECONDS" to it.
stage() {
  local name=$1 done_file=$2 t=$SECONDS; shift 2
  if [ -e "$done_file" ]; then echo "== $name: reusing $done_file (delete it to redo this stage)"; return; fi
  echo "== $name: $*"
  "$@" || { echo "$0: stage '$name' failed (command: $*)" >&2; exit 1; }
  if [ -n "${STAGE_LOG:-}" ]; then printf '%s\t%s\n' "$name" $((SECONDS - t)) >> "$STAGE_LOG"; fi
  echo "== $name: done in $((SECONDS - t)) s (total $((SECONDS - T0)) s)"
}
lr() { echo --lr "$1" --min_lr "$(awk "BEGIN { print $1 / 10 }")"; }  # lr RATE: a peak rate, its floor a tenth of it
