# skygreen --local: runs one launch of a run on this machine, detached from the terminal.
# $1: the rendered run script; $2: the file that receives its exit code.
# A handled (not ignored) TERM/INT lets the run script below trap its own signals; this shell
# then records the exit code once the script has committed its checkpoint and ended.
# If everything is killed (kill -9), no exit code is written: the run reads as stopped.
trap ':' TERM INT
bash -c "$1"
rc=$?
# The run has ended. `skygreen cancel` signals every process of the job, and on a busy machine
# its signals may still be arriving: ignored from here, by this shell and the `mv` it starts
# (an ignored signal stays ignored across exec), so the exit code is always recorded.
trap '' TERM INT
printf '%s\n' "$rc" > "$2.tmp" && mv -f "$2.tmp" "$2"
exit "$rc"
